"""Packing strategies and exports end to end on real data with the GPT-2 tokenizer, every gate run.

The bfd figures asked for by the packing issue are printed (run with -s to see them).
"""

import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import gates
from prep_assets.core import invariants as inv
from prep_assets.core.lake import read_json
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import make_spec, shared_path
from prep_assets_tests.core.helpers import failed_gates, read_mmidx, run_one_file

INSTRUCTION = {
    "gsm8k_train.jsonl": {"prompt_key": "question", "completion_key": "answer", "prompt_postfix": "\n"},
    "alpaca_en_demo.json": {"prompt_key": ["instruction", "input"], "completion_key": "output"},
    "gdp_generative_tuning.jsonl": {},
    "gdp_category_ids.jsonl": {},
}


def _run(tmp: Path, name: str, src: Path, **sections) -> tuple[dict, DatasetSpec]:
    spec = make_spec(name, tokenizer={"path": str(shared_path("tokenizers/gpt2"))}, **sections)
    key, result = run_one_file(tmp, spec, src)
    assert failed_gates(spec, tmp, key) == []
    return result, spec


@pytest.mark.parametrize("max_seq_len", [1024, 4096])
@pytest.mark.parametrize("file", sorted(INSTRUCTION))
def test_bfd_rows_within_a_thousandth_of_ceil_tokens_over_len(tmp_path: Path, file: str, max_seq_len: int):
    src = shared_path(f"datasets/instruction/{file}")
    r, _ = _run(
        tmp_path,
        "ins",
        src,
        input={"type": "instruction", **INSTRUCTION[file]},
        sequence={"max_seq_len": max_seq_len},
        checks={"max_reject_rate": 0.2},
    )
    m = r["shards"].splits["train"]
    bound = math.ceil(m["gold_tokens"] / max_seq_len)
    print(
        f"\n{file} L={max_seq_len}: {m['examples']} examples, {m['gold_tokens']} kept tokens, "
        f"{m['sequences']} rows, bound {bound}, ratio {m['sequences'] / bound:.5f}, "
        f"sequence utilization {m['sequence_utilization']}"
    )
    assert m["sequences"] <= 1.001 * bound


@pytest.fixture(scope="module")
def wiki(tmp_path_factory: pytest.TempPathFactory):
    """wiki_demo.txt (30 long paragraphs) windowed at 1024 with overlap 128, and packed `full`; both exported."""
    src = shared_path("datasets/text/wiki_demo.txt")
    runs = {}
    for name, seq, packing in (
        ("window", {"max_seq_len": 1024, "overflow": "window", "overlap": 128}, {"strategy": "bfd"}),
        ("full", {"max_seq_len": 1024}, {"strategy": "full"}),
    ):
        runs[name] = _run(
            tmp_path_factory.mktemp(name),
            "wiki",
            src,
            input={"type": "text"},
            sequence=seq,
            packing=packing,
            split={"validation_ratio": 0.1},
            output={"formats": ["parquet", "npy", "megatron"], "max_tokens_per_shard": 64 * 1024},
        )
    return runs


def test_window_overflow_keeps_every_token_with_masked_overlaps(wiki):
    r, _ = wiki["window"]
    t = r["shards"].totals
    assert r["gold"].tokens_dropped_by_overflow == 0 and r["gold"].example_length["max"] > 1024
    assert t["examples_split"] > 20 and t["overlap_tokens"] == 128 * (t["segments"] - t["examples"])
    # every token of gold is in a window; only the repeated overlaps are added
    assert t["output_tokens"] == t["gold_tokens"] + t["overlap_tokens"] - t["tokens_dropped_by_packing"]
    assert t["data_utilization"] == round((t["output_tokens"] - t["overlap_tokens"]) / t["input_tokens"], 6)


def test_full_packs_every_row_but_the_last_of_each_split(wiki):
    r, _ = wiki["full"]
    for split, m in r["shards"].splits.items():
        if m["sequences"]:
            assert m["padding_tokens"] < 1024 and m["sequences"] == math.ceil(m["gold_tokens"] / 1024), split
    assert r["shards"].totals["output_tokens"] == r["gold"].tokens


def _parquet_rows(split_dir: Path, column: str) -> np.ndarray:
    table = pa.concat_tables([pq.read_table(f, columns=[column]) for f in sorted(split_dir.glob("part-*.parquet"))])
    return np.array(table.column(column).to_pylist())


@pytest.mark.parametrize("run", ["window", "full"])
def test_memmap_export_opens_with_numpy_memmap_and_equals_the_parquet_rows(wiki, run):
    r, spec = wiki[run]
    sh = r["dirs"][3]
    for split in ("train", "validation"):
        d = sh / split / "memmap"
        meta = read_json(d / "meta.json")
        assert meta["arrays"]["input_ids"]["dtype"] == "uint16"  # GPT-2's 50257 ids fit
        for name, spec_ in meta["arrays"].items():
            arr = np.memmap(d / spec_["file"], dtype=spec_["dtype"], mode="r", shape=tuple(spec_["shape"]))
            assert isinstance(arr, np.memmap) and arr.shape == (meta["rows"], 1024)
            assert np.array_equal(arr, _parquet_rows(sh / split, name)), (split, name)


def test_megatron_export_matches_the_published_index_layout(wiki):
    r, _ = wiki["window"]
    sh, g = r["dirs"][3], r["dirs"][2]
    gold = pq.read_table(g / "examples.parquet", columns=["split", "token_ids"]).to_pylist()
    for split in ("train", "validation"):
        docs = [row["token_ids"] for row in gold if row["split"] == split]
        m = read_mmidx(sh / split / "megatron" / "text_document")
        assert m["version"] == 1 and m["code"] == 8 and m["rest"] == 0
        assert m["sizes"].tolist() == [len(d) for d in docs] and max(m["sizes"]) > 1024  # whole documents
        assert m["pointers"].tolist() == (np.cumsum([0] + [len(d) for d in docs[:-1]]) * 2).tolist()
        assert m["doc_idx"].tolist() == list(range(len(docs) + 1))
        for k in (0, len(docs) - 1):
            start = m["pointers"][k] // m["itemsize"]
            assert m["data"][start : start + m["sizes"][k]].tolist() == docs[k]


def test_window_gates_catch_a_missing_window_and_a_swapped_token(wiki, tmp_path: Path):
    r, spec = wiki["window"]
    g = r["dirs"][2]
    sh = tmp_path / "shards"
    shutil.copytree(r["dirs"][3], sh)
    part = sorted((sh / "train").glob("part-*.parquet"))[0]
    table = pq.read_table(part)
    windowed = [i for i, offs in enumerate(table.column("example_offsets").to_pylist()) if any(offs)]
    pq.write_table(table.filter(pa.array([i != windowed[0] for i in range(table.num_rows)])), part)
    out = inv.shards_tokens_conserved(inv.shard_files(sh), g, gates.layout(spec))
    assert not out.passed and any("expected_tokens" in o for o in out.offending)
    ids = table.column("input_ids").to_pylist()
    ids[0][5], ids[0][6] = ids[0][6], ids[0][5]
    pq.write_table(table.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int32()))), part)
    out = inv.shards_match_gold(inv.shard_files(sh), g, spec.sequence.overlap)
    assert not out.passed and out.offending[0]["token"] in (6, 7)
