"""The `hdf5` output format (SambaNova generative_data_prep / SambaStudio): real shards of the shipped sample data
built in core, then each drop's gdp folder read back (h5py, yaml, tokenizers) against the Parquet shard rows."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from prep_assets.core.errors import DropError, SpecError
from prep_assets.core.format_hdf5 import category_of
from prep_assets.core.lake import read_json
from prep_assets.core.manifest import manifest_file_problems
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import SAMPLE_DATA, copy_sample_data
from prep_assets_tests.core.helpers import run_core, sample_spec

GDP_PREFIX = {"train": "train", "validation": "dev", "test": "test"}


def _build(
    data_dir: Path, name: str, rows_per_file: int, records: list[dict] | None = None, **changes: Any
) -> tuple[DatasetSpec, list[dict], Path]:
    """Every drop of the shipped dataset `name` built in core, with parquet and hdf5, files of `rows_per_file`
    (`records`: the one drop instead of the shipped ones; `changes`: spec sections updated, `output` keys added)."""
    copy_sample_data(data_dir)
    if records is not None:
        raw = data_dir / "raw" / name
        shutil.rmtree(raw)
        raw.mkdir()
        (raw / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    L = yaml.safe_load((SAMPLE_DATA / "datasets" / f"{name}.yaml").read_text(encoding="utf-8"))["sequence"]
    output = {"formats": ["parquet", "hdf5"], "max_tokens_per_shard": L["max_seq_len"] * rows_per_file}
    spec = sample_spec(data_dir, name, **{**changes, "output": {**output, **changes.get("output", {})}})
    results = list(run_core(data_dir, spec).values())
    return spec, results, data_dir / "lake" / spec.name


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory):
    return _build(tmp_path_factory.mktemp("text"), "sample_text", rows_per_file=3)


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory):
    return _build(tmp_path_factory.mktemp("chat"), "sample_chat", rows_per_file=4)


def _parquet(split_dir: Path, column: str) -> np.ndarray:
    parts = sorted(split_dir.glob("part-*.parquet"))
    table = pa.concat_tables([pq.read_table(f, columns=[column]) for f in parts])
    return np.array(table.column(column).to_pylist(), dtype=np.int64)


def expected_gdp_types(types: np.ndarray, segments: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Recomputed segment by segment: its last EOS (3) is gdp's boundary (3), its earlier EOS are completion (1);
    then a trained prompt token is 1 and an untrained 1 is 0 (gdp's trainer trains 1 and 3), but a segment's
    first token."""
    out = types.copy()
    for r in range(types.shape[0]):
        for seg in set(segments[r].tolist()) - {0}:
            eos = [j for j in range(types.shape[1]) if segments[r, j] == seg and types[r, j] == 3]
            for j in eos[:-1]:
                out[r, j] = 1
        for j in range(types.shape[1]):
            first = j == 0 or segments[r, j] != segments[r, j - 1]
            if mask[r, j] and out[r, j] == 0:
                out[r, j] = 1
            elif not mask[r, j] and out[r, j] == 1 and not first:
                out[r, j] = 0
    return out


def _hdf5_files(shards: Path, split: str) -> list[Path]:
    files = sorted((shards / "hdf5").glob(f"{GDP_PREFIX[split]}_*.hdf5"), key=lambda p: int(p.name.split("_")[-3]))
    n = len(files)
    assert [p.name for p in files] == [f"{GDP_PREFIX[split]}_{i}_of_{n}.hdf5" for i in range(1, n + 1)]
    return files


def _check_split(
    spec: DatasetSpec, shards: Path, split: str, datasets: tuple[str, ...] = ("input_ids", "token_type_ids")
) -> tuple[np.ndarray, list[int]]:
    """The split's HDF5 rows equal its Parquet rows (types mapped); returns gdp's token types and file sizes."""
    L = spec.sequence.max_seq_len
    ids, types = [], []
    sizes = []
    for path in _hdf5_files(shards, split):
        with h5py.File(path, "r") as f:
            assert set(f.keys()) == set(datasets)
            for name in datasets:
                assert f[name].dtype == np.int32 and f[name].ndim == 2 and f[name].shape[1] == L
            assert f["input_ids"].shape == f["token_type_ids"].shape
            sizes.append(f["input_ids"].shape[0])
            ids.append(f["input_ids"][:])
            types.append(f["token_type_ids"][:])
    got_ids, got_types = np.concatenate(ids), np.concatenate(types)
    assert np.array_equal(got_ids, _parquet(shards / split, "input_ids"))
    expected = expected_gdp_types(
        _parquet(shards / split, "token_type_ids"),
        _parquet(shards / split, "segment_ids"),
        _parquet(shards / split, "loss_mask"),
    )
    assert np.array_equal(got_types, expected)
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert len(sizes) == len(list((shards / split).glob("part-*.parquet")))
    return got_types, sizes


def _gdp_sizes(shards: Path) -> dict[str, list[int]]:
    """Rows per HDF5 file of each split in the drop's gdp folder."""
    out = {}
    for split in GDP_PREFIX:
        out[split] = []
        for path in _hdf5_files(shards, split):
            with h5py.File(path, "r") as f:
                out[split].append(f["input_ids"].shape[0])
    return out


def _check_metadata(spec: DatasetSpec, shards: Path, vocab_size: int, tests: int | None = None) -> dict:
    """The folder's one metadata.yaml: gdp's fields over all splits, with gdp's types (its `DatasetMetadata`)."""
    meta = yaml.safe_load((shards / "hdf5" / "metadata.yaml").read_text(encoding="utf-8"))
    sizes = _gdp_sizes(shards)
    assert meta == {
        "max_seq_length": spec.sequence.max_seq_len,
        "token_type_ids": True,
        "vocab_size": vocab_size,
        "tokenizer_model_type": spec.output.hdf5_model_type or "unknown",
        "number_of_training_files": len(sizes["train"]),
        "number_of_dev_files": len(sizes["validation"]),
        "number_of_test_files": len(sizes["test"]) if tests is None else tests,
        "max_batch_size_train": min(sizes["train"]),
        "max_batch_size_dev": min(sizes["validation"]) if sizes["validation"] else None,
    }
    for key in meta:
        if key != "max_batch_size_dev":
            want = {"token_type_ids": bool, "tokenizer_model_type": str}.get(key, int)
            assert type(meta[key]) is want, key
    assert type(meta["max_batch_size_dev"]) in (int, type(None)) and meta["max_batch_size_train"] >= 1
    return meta


def test_text_hdf5_rows_types_metadata_and_balance(text_run):
    spec, results, lake = text_run
    vocab = read_json(lake / "tokenizer" / "fingerprint.json")["info"]["vocab_size"]
    seen, most_files = 0, 0
    for result in results:
        shards = result["dirs"][3]
        assert not any((shards / split / "hdf5").exists() for split in GDP_PREFIX)  # one folder per drop
        for split, stats in result["shards"].splits.items():
            if not stats["sequences"]:
                assert not _hdf5_files(shards, split)
                continue
            types, sizes = _check_split(spec, shards, split)
            assert sum(sizes) == stats["sequences"] and set(np.unique(types)) <= {0, 1, 2, 3}
            assert stats["exports"]["hdf5"]["rows_per_file"] == sizes
            seen, most_files = seen + 1, max(most_files, len(sizes))
        _check_metadata(spec, shards, vocab)
        assert sorted(p.name for p in (shards / "hdf5").iterdir() if not p.name.endswith(".hdf5")) == [
            "metadata.yaml",
            "tokenizer",
        ]
    assert seen >= 2 and most_files > 1  # several files somewhere: the balancing is exercised


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        (
            "sample_text",
            {"sequence": {"max_seq_len": 32, "overflow": "window", "overlap": 8}, "packing": {"strategy": "bfd"}},
        ),
        ("sample_instruct", {"mask": {"prompt": "train"}}),
    ],
    ids=["window_overlap_untrained", "prompt_trained"],
)
def test_gdp_types_train_exactly_what_the_loss_mask_trains_but_segment_firsts(
    name: str, changes: dict[str, Any], tmp_path: Path
):
    """A window's repeated overlap (masked) was typed completion, so SambaStudio trained it again (+28% tokens on
    a long-document set); a trained prompt stayed 0, which gdp's prompt_loss_weight 0 leaves out."""
    spec, results, lake = _build(tmp_path, name, rows_per_file=3, **changes)
    checked = 0
    for shards in sorted(lake.glob("shards/*")):
        for split in ("train", "validation", "test"):
            if not (shards / split).is_dir():
                continue
            types, _ = _check_split(spec, shards, split)
            segments = _parquet(shards / split, "segment_ids").reshape(types.shape)
            mask = _parquet(shards / split, "loss_mask").reshape(types.shape)
            first = np.ones(types.shape, dtype=bool)
            first[:, 1:] = segments[:, 1:] != segments[:, :-1]
            trained_by_gdp = (types == 1) | (types == 3)
            assert not (mask.astype(bool) & ~trained_by_gdp).any()  # every loss token is trained by gdp
            assert not (trained_by_gdp & ~mask.astype(bool) & ~first).any()  # and nothing else but segment firsts
            checked += int(mask.sum())
    assert checked > 0


def test_the_tokenizer_copy_loads_and_is_the_pinned_one(text_run):
    _, results, lake = text_run
    pinned = lake / "tokenizer" / "tokenizer.json"
    for result in results:
        copy = result["dirs"][3] / "hdf5" / "tokenizer"
        assert (copy / "tokenizer.json").read_bytes() == pinned.read_bytes()
        assert not (copy / "fingerprint.json").exists()
        text = "Seven plus five is twelve."
        assert Tokenizer.from_file(str(copy / "tokenizer.json")).encode(text).ids == (
            Tokenizer.from_file(str(pinned)).encode(text).ids
        )


def _check_manifest(results: list[dict], lake: Path) -> int:
    """Every file of every drop's gdp folder is in the manifest (split or partition-level exports) with its sha256
    and size, and `manifest_file_problems` verifies them; returns how many."""
    manifest = read_json(lake / "manifest.json")
    named = [f for s in manifest["splits"].values() for e in s["exports"] if e["format"] == "hdf5" for f in e["files"]]
    named += [f for e in manifest.get("exports", []) if e["format"] == "hdf5" for f in e["files"]]
    on_disk = sorted(p for r in results for p in (r["dirs"][3] / "hdf5").rglob("*") if p.is_file())
    assert sorted(lake / f["path"] for f in named) == on_disk
    for f in named:
        data = (lake / f["path"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["bytes"] == len(data), f["path"]
    assert manifest_file_problems(lake, manifest) == []
    return len(named)


def test_manifest_lists_every_hdf5_file_with_its_sha256(text_run, tmp_path):
    _, results, lake = text_run
    assert _check_manifest(results, lake) >= 6
    manifest = read_json(lake / "manifest.json")
    meta = next(f for e in manifest["exports"] for f in e["files"] if f["path"].endswith("metadata.yaml"))
    copy = tmp_path / "lake"
    copy.mkdir()
    target = copy / meta["path"]
    target.parent.mkdir(parents=True)
    target.write_text("changed", encoding="utf-8")
    assert manifest_file_problems(copy, {"splits": {}, "exports": [{"files": [meta]}]}) == [
        f"{meta['path']}: 7 bytes, {meta['bytes']} recorded"
    ]


def test_dialogue_has_one_gdp_boundary_per_segment_on_its_last_eos(chat_run):
    spec, results, _ = chat_run
    shards = max((r["dirs"][3] for r in results), key=lambda d: len(list((d / "train").glob("*.parquet"))))
    types, _ = _check_split(spec, shards, "train")
    ours = _parquet(shards / "train", "token_type_ids")
    segments = _parquet(shards / "train", "segment_ids")
    # several trained turns per record: more EOS than segments; one boundary per segment, on its last EOS
    assert (ours == 3).sum() > (types == 3).sum() > 0
    for r in range(len(types)):
        for seg in set(segments[r].tolist()) - {0}:
            eos = np.flatnonzero((segments[r] == seg) & (ours[r] == 3))
            assert np.flatnonzero((segments[r] == seg) & (types[r] == 3)).tolist() == eos[-1:].tolist()
            assert (types[r, eos[:-1]] == 1).all()


def test_preference_spec_with_hdf5_is_refused_at_load(tmp_path):
    copy_sample_data(tmp_path)
    with pytest.raises(SpecError, match=r"output\.formats hdf5: .*no chosen/rejected pair"):
        sample_spec(tmp_path, "sample_pref", output={"formats": ["parquet", "hdf5"]})


SOURCES = ("wiki", "web", "news")
CATEGORIES = ["news", "web", "wiki"]  # gdp's list order: ids 0, 1, 2


@pytest.fixture(scope="module")
def domain_run(tmp_path_factory: pytest.TempPathFactory):
    """Instruction records with domains (one names none), categories, the test split as JSONL, a model type."""
    lines = []
    for i in range(90):
        a, b = 10 + i, 3 + i % 7
        record = {"prompt": f"What is {a} plus {b}?", "completion": f"{a} + {b} = {a + b}. The answer is {a + b}."}
        lines.append({**record, **({"source": SOURCES[i % 3]} if i % 10 else {})})
    output = {"categories": CATEGORIES, "hdf5_test_jsonl": True, "hdf5_model_type": "<class 'LlamaConfig'>"}
    return _build(
        tmp_path_factory.mktemp("categories"),
        "sample_instruct",
        rows_per_file=4,
        records=lines,
        input={"domain_key": "source"},
        split={"validation_ratio": 0.15, "test_ratio": 0.15},
        output=output,
    )


def test_category_ids_per_token_are_the_examples_domains(domain_run):
    spec, results, lake = domain_run
    ((result),) = results
    shards = result["dirs"][3]
    gold = pq.read_table(result["dirs"][2] / "examples.parquet", columns=["example_id", "domain"]).to_pylist()
    domain_of = {g["example_id"]: g["domain"] for g in gold}
    assert None in domain_of.values() and set(domain_of.values()) - {None} == set(SOURCES)
    datasets = ("input_ids", "token_type_ids", "category_ids")
    for split in ("train", "validation"):
        _check_split(spec, shards, split, datasets)
        got = []
        for path in _hdf5_files(shards, split):
            with h5py.File(path, "r") as f:
                assert f["category_ids"].dtype == np.int32
                got.append(f["category_ids"][:])
        table = pa.concat_tables(pq.read_table(p) for p in sorted((shards / split).glob("part-*.parquet")))
        for r, row in enumerate(table.select(["segment_ids", "example_ids"]).to_pylist()):
            want = [-1 if s == 0 else _id(domain_of[row["example_ids"][s - 1]]) for s in row["segment_ids"]]
            assert np.concatenate(got)[r].tolist() == want
    assert json.loads((shards / "hdf5" / "category_to_id.json").read_text(encoding="utf-8")) == {
        "news": 0,
        "web": 1,
        "wiki": 2,
    }


def _id(domain: str | None) -> int:
    return -1 if domain is None else CATEGORIES.index(domain)


def test_the_test_split_is_gdp_jsonl_and_the_metadata_counts_it(domain_run):
    spec, results, lake = domain_run
    ((result),) = results
    shards = result["dirs"][3]
    assert not _hdf5_files(shards, "test")
    files = sorted((shards / "hdf5" / "test_files").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    n = len(files)
    assert n >= 1 and [p.name for p in files] == [f"test_{i}_of_{n}.jsonl" for i in range(1, n + 1)]
    got = [json.loads(line) for p in files for line in p.read_text(encoding="utf-8").splitlines()]
    silver = pq.read_table(result["dirs"][1] / "records.parquet").to_pylist()
    want = []
    for r in silver:
        if r["split"] == "test":
            (turn,) = json.loads(r["content"])["turns"]
            want.append({**turn, **({"category": r["domain"]} if r["domain"] is not None else {})})
    assert got == want and len(want) >= 5
    vocab = read_json(lake / "tokenizer" / "fingerprint.json")["info"]["vocab_size"]
    meta = _check_metadata(spec, shards, vocab, tests=n)
    assert meta["tokenizer_model_type"] == "<class 'LlamaConfig'>" and meta["number_of_dev_files"] >= 1
    assert _check_manifest(results, lake) >= 8


def test_a_domain_missing_from_the_categories_is_an_error():
    ids = {name: i for i, name in enumerate(CATEGORIES)}
    assert [category_of(d, ids) for d in ("wiki", None, "news")] == [2, -1, 0]
    with pytest.raises(DropError, match=r"domain 'blog' is not in output\.categories"):
        category_of("blog", ids)


def test_categories_need_a_domain_key_and_test_jsonl_prompt_completion_records(tmp_path):
    copy_sample_data(tmp_path)
    with pytest.raises(SpecError, match=r"output\.categories maps domains .*set input\.domain_key"):
        sample_spec(tmp_path, "sample_instruct", output={"formats": ["parquet", "hdf5"], "categories": ["a"]})
    with pytest.raises(SpecError, match=r"hdf5_test_jsonl writes gdp's prompt/completion JSONL: input\.type chat"):
        sample_spec(tmp_path, "sample_chat", output={"formats": ["parquet", "hdf5"], "hdf5_test_jsonl": True})


def _sums(n: int) -> list[dict]:
    return [{"prompt": f"What is {10 + i} plus {i % 7}?", "completion": f"It is {10 + i + i % 7}."} for i in range(n)]


@pytest.fixture(scope="module")
def counted_run(tmp_path_factory: pytest.TempPathFactory):
    """gdp's file counts over one drop whose Parquet parts are one per split (files of 1000 rows)."""
    return _build(
        tmp_path_factory.mktemp("counted"),
        "sample_instruct",
        rows_per_file=1000,
        records=_sums(90),
        split={"validation_ratio": 0, "test_ratio": 0, "validation_count": 11, "test_count": 5},
        packing={"strategy": "single"},  # a row per record: 74 train rows, 11 dev, 5 test
        output={"num_training_splits": 4, "num_dev_splits": 3, "num_test_splits": 2},
    )


@pytest.mark.parametrize(("split", "n"), [("train", 4), ("validation", 3), ("test", 2)])
def test_num_training_dev_and_test_splits_spread_the_rows_over_that_many_balanced_files(counted_run, split, n):
    spec, (result,), lake = counted_run
    shards = result["dirs"][3]
    assert len(list((shards / split).glob("part-*.parquet"))) == 1
    files = _hdf5_files(shards, split)
    assert len(files) == n
    ids, types, sizes = [], [], []
    for path in files:
        with h5py.File(path, "r") as f:
            sizes.append(f["input_ids"].shape[0])
            ids.append(f["input_ids"][:])
            types.append(f["token_type_ids"][:])
    rows = _parquet(shards / split, "input_ids")
    # gdp's balance: sizes within one of each other, the first rows % n files one row more; every row once, in order
    base, extra = divmod(len(rows), n)
    assert len(rows) == {"train": 74, "validation": 11, "test": 5}[split]
    assert sizes == [base + (i < extra) for i in range(n)] and sum(sizes) == len(rows)
    assert np.array_equal(np.concatenate(ids), rows)
    want_types = expected_gdp_types(
        _parquet(shards / split, "token_type_ids"),
        _parquet(shards / split, "segment_ids"),
        _parquet(shards / split, "loss_mask"),
    )
    assert np.array_equal(np.concatenate(types), want_types)


def test_num_splits_are_recorded_in_the_metadata_as_gdp_does(counted_run):
    spec, (result,), lake = counted_run
    shards = result["dirs"][3]
    meta = yaml.safe_load((shards / "hdf5" / "metadata.yaml").read_text(encoding="utf-8"))
    assert (meta["number_of_training_files"], meta["number_of_dev_files"], meta["number_of_test_files"]) == (4, 3, 2)
    sizes = _gdp_sizes(shards)
    assert meta["max_batch_size_train"] == min(sizes["train"]) and meta["max_batch_size_dev"] == min(
        sizes["validation"]
    )
    vocab = read_json(lake / "tokenizer" / "fingerprint.json")["info"]["vocab_size"]
    _check_metadata(spec, shards, vocab)


def _thirty_records(tmp_path: Path, counts: dict[str, int], output: dict[str, Any]):
    """A drop of 30 records, a row each, with `counts` records held out (split.validation_count / test_count)."""
    return _build(
        tmp_path,
        "sample_instruct",
        rows_per_file=1000,
        records=_sums(30),
        split={"validation_ratio": 0, "test_ratio": 0, **counts},
        packing={"strategy": "single"},
        output=output,
    )


def test_more_files_than_rows_is_a_drop_error_naming_the_key(tmp_path: Path):
    with pytest.raises(
        DropError, match=r"output.num_dev_splits asks for 5 dev files, but the drop's validation split has 2 rows"
    ):
        _thirty_records(tmp_path, {"validation_count": 2}, {"num_dev_splits": 5})


def test_files_asked_of_a_split_of_no_rows_is_a_drop_error_too(tmp_path: Path):
    """An empty split opened no sink, so its count went unchecked: the drop published with no dev file."""
    with pytest.raises(
        DropError, match=r"num_dev_splits asks for 2 dev files, but the drop's validation split has 0 rows"
    ):
        _thirty_records(tmp_path, {"validation_ratio": 0, "test_ratio": 0}, {"num_dev_splits": 2})


@pytest.mark.parametrize(("asked", "files"), [(2, [3, 2]), (6, None)])
def test_num_test_splits_cuts_the_test_jsonl_into_that_many_files(tmp_path: Path, asked: int, files):
    """gdp's --num_test_splits counts its untokenized test files: with hdf5_test_jsonl, the test records in exactly
    that many balanced JSONL files; more files than the split's records fails the drop, as gdp refuses."""
    build = lambda: _thirty_records(tmp_path, {"test_count": 5}, {"hdf5_test_jsonl": True, "num_test_splits": asked})  # noqa: E731
    if files is None:
        with pytest.raises(DropError, match=r"num_test_splits asks for 6 test files, but .* test split has 5 records"):
            build()
        return
    _, (result,), _ = build()
    folder = result["dirs"][3] / "hdf5"
    names = sorted(p.name for p in (folder / "test_files").iterdir())
    assert names == ["test_1_of_2.jsonl", "test_2_of_2.jsonl"]
    sizes = [len((folder / "test_files" / n).read_text(encoding="utf-8").splitlines()) for n in names]
    assert sizes == files
    assert yaml.safe_load((folder / "metadata.yaml").read_text(encoding="utf-8"))["number_of_test_files"] == 2


def test_num_splits_without_hdf5_is_a_spec_error(tmp_path: Path):
    data = copy_sample_data(tmp_path)
    for key in ("num_training_splits", "num_test_splits"):
        with pytest.raises(SpecError, match=f"{key} sets the number of gdp HDF5 files: add hdf5"):
            sample_spec(data, "sample_instruct", output={key: 2})
