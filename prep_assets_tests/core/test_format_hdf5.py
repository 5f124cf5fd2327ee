"""The `hdf5` output format (SambaNova generative_data_prep / SambaStudio): real shards of the shipped sample data
built in core, then the HDF5 files read back with h5py against the Parquet shard rows."""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prep_assets.core.errors import SpecError
from prep_assets.core.lake import read_json
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import SAMPLE_DATA, copy_sample_data
from prep_assets_tests.core.helpers import run_core, sample_spec

GDP_PREFIX = {"train": "train", "validation": "dev", "test": "test"}


def _build(data_dir: Path, name: str, rows_per_file: int) -> tuple[DatasetSpec, list[dict], Path]:
    """Every drop of the shipped dataset `name` built in core, with parquet and hdf5, files of `rows_per_file`."""
    copy_sample_data(data_dir)
    L = yaml.safe_load((SAMPLE_DATA / "datasets" / f"{name}.yaml").read_text(encoding="utf-8"))["sequence"]
    output = {"formats": ["parquet", "hdf5"], "max_tokens_per_shard": L["max_seq_len"] * rows_per_file}
    spec = sample_spec(data_dir, name, output=output)
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


def expected_gdp_types(types: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Recomputed segment by segment: its last EOS (3) is gdp's boundary (3), its earlier EOS are completion (1)."""
    out = types.copy()
    for r in range(types.shape[0]):
        for seg in set(segments[r].tolist()) - {0}:
            eos = [j for j in range(types.shape[1]) if segments[r, j] == seg and types[r, j] == 3]
            for j in eos[:-1]:
                out[r, j] = 1
    return out


def _hdf5_files(split_dir: Path, split: str) -> list[Path]:
    files = sorted((split_dir / "hdf5").glob("*.hdf5"), key=lambda p: int(p.name.split("_")[-3]))
    n = len(files)
    assert [p.name for p in files] == [f"{GDP_PREFIX[split]}_{i}_of_{n}.hdf5" for i in range(1, n + 1)]
    return files


def _check_split(spec: DatasetSpec, shards: Path, split: str) -> tuple[np.ndarray, list[int]]:
    """The split's HDF5 rows equal its Parquet rows (types mapped); returns gdp's token types and file sizes."""
    L = spec.sequence.max_seq_len
    ids, types = [], []
    sizes = []
    for path in _hdf5_files(shards / split, split):
        with h5py.File(path, "r") as f:
            assert set(f.keys()) == {"input_ids", "token_type_ids"}
            for name in ("input_ids", "token_type_ids"):
                assert f[name].dtype == np.int32 and f[name].ndim == 2 and f[name].shape[1] == L
            assert f["input_ids"].shape == f["token_type_ids"].shape
            sizes.append(f["input_ids"].shape[0])
            ids.append(f["input_ids"][:])
            types.append(f["token_type_ids"][:])
    got_ids, got_types = np.concatenate(ids), np.concatenate(types)
    assert np.array_equal(got_ids, _parquet(shards / split, "input_ids"))
    expected = expected_gdp_types(_parquet(shards / split, "token_type_ids"), _parquet(shards / split, "segment_ids"))
    assert np.array_equal(got_types, expected)
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert len(sizes) == len(list((shards / split).glob("part-*.parquet")))
    return got_types, sizes


def _check_metadata(spec: DatasetSpec, shards: Path, split: str, sizes: list[int], vocab_size: int) -> None:
    meta = yaml.safe_load((shards / split / "hdf5" / "metadata.yaml").read_text(encoding="utf-8"))
    counts = {"train": 0, "validation": 0, "test": 0, split: len(sizes)}
    assert meta == {
        "max_seq_length": spec.sequence.max_seq_len,
        "token_type_ids": True,
        "vocab_size": vocab_size,
        "tokenizer_model_type": meta["tokenizer_model_type"],
        "number_of_training_files": counts["train"],
        "number_of_dev_files": counts["validation"],
        "number_of_test_files": counts["test"],
        "max_batch_size_train": min(sizes) if split == "train" else None,
        "max_batch_size_dev": min(sizes) if split == "validation" else None,
    }
    for key in ("max_seq_length", "vocab_size", "number_of_training_files", "number_of_dev_files"):
        assert type(meta[key]) is int, key
    assert type(meta["token_type_ids"]) is bool and type(meta["tokenizer_model_type"]) is str
    if split == "train":
        assert type(meta["max_batch_size_train"]) is int and meta["max_batch_size_train"] >= 1


def test_text_hdf5_rows_types_metadata_and_balance(text_run):
    spec, results, lake = text_run
    vocab = read_json(lake / "tokenizer" / "fingerprint.json")["info"]["vocab_size"]
    seen, most_files = 0, 0
    for result in results:
        shards = result["dirs"][3]
        for split, stats in result["shards"].splits.items():
            if not stats["sequences"]:
                assert not (shards / split / "hdf5").exists()
                continue
            types, sizes = _check_split(spec, shards, split)
            assert sum(sizes) == stats["sequences"] and set(np.unique(types)) <= {0, 1, 2, 3}
            assert stats["exports"]["hdf5"]["rows_per_file"] == sizes
            _check_metadata(spec, shards, split, sizes, vocab)
            seen, most_files = seen + 1, max(most_files, len(sizes))
    assert seen >= 2 and most_files > 1  # several files somewhere: the balancing is exercised


def test_manifest_lists_every_hdf5_file_with_its_sha256(text_run):
    _, results, lake = text_run
    manifest = read_json(lake / "manifest.json")
    listed = 0
    for split, s in manifest["splits"].items():
        entries = [e for e in s["exports"] if e["format"] == "hdf5"]
        on_disk = sorted(p for r in results for p in (r["dirs"][3] / split / "hdf5").glob("*"))
        named = [f for e in entries for f in e["files"]]
        assert sorted(lake / f["path"] for f in named) == on_disk
        for f in named:
            rel = f["path"]
            data = (lake / rel).read_bytes()
            assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["bytes"] == len(data), rel
            listed += 1
    assert listed >= 4


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
