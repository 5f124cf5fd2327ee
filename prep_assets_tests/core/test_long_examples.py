"""Gates over examples longer than many rows: gold meets the shard segments a chunk at a time, so a gate's memory
does not grow with the length of one example."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import invariants as inv
from prep_assets.core import sql
from prep_assets.core.invariants import shards_gold
from prep_assets.core.records import GOLD_SCHEMA, SHARD_SCHEMA


def _gold_example(dir_: Path, n: int, seed: int = 0) -> tuple[Path, np.ndarray]:
    """One text example of `n` tokens (every token trains but the first, type completion; the last EOS)."""
    dir_.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(3, 50_000, n).astype(np.int32)
    mask = np.ones(n, np.uint8)
    mask[0] = 0
    types = np.ones(n, np.uint8)
    types[-1] = 3
    row = {
        "example_id": "d:1",
        "record_id": "d:1",
        "drop": "d",
        "source_file": "f.jsonl",
        "source_line": 1,
        "byte_offset": 0,
        "split": "train",
        "token_ids": ids,
        "loss_mask": mask,
        "token_type_ids": types,
        "num_tokens": n,
        "num_loss_tokens": int(mask.sum()),
        "num_prompt_tokens": 0,
    }
    pq.write_table(pa.Table.from_pylist([row], schema=GOLD_SCHEMA), dir_ / "examples.parquet")
    return dir_, ids


def _full_rows(path: Path, ids: np.ndarray, row_len: int, corrupt: dict[int, int] | None = None) -> list[Path]:
    """The example packed `full` into rows of `row_len`: segment k holds tokens [k * row_len, (k + 1) * row_len),
    its first token masked; the last row padded with id 0. `corrupt`: token index -> id written instead."""
    ids = ids.copy()
    for at, value in (corrupt or {}).items():
        ids[at] = value
    rows = []
    for off in range(0, len(ids), row_len):
        n = min(row_len, len(ids) - off)
        pad = row_len - n
        mask = [0] + [1] * (n - 1) + [0] * pad
        types = [1] * n + [2] * pad
        if off + n == len(ids):
            types[n - 1] = 3
        rows.append(
            {
                "input_ids": ids[off : off + n].tolist() + [0] * pad,
                "loss_mask": mask,
                "position_ids": list(range(n)) + [0] * pad,
                "segment_ids": [1] * n + [0] * pad,
                "token_type_ids": types,
                "seq_lengths": [n],
                "example_ids": ["d:1"],
                "example_offsets": [off],
                "num_loss_tokens": n - 1,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), path, row_group_size=256)
    return [path]


@pytest.mark.parametrize("chunk", [1, 5, 8, 64], ids=["chunk_1", "chunk_5", "chunk_8", "chunk_over_the_example"])
def test_match_gold_over_a_long_example_is_the_same_whatever_the_chunk(tmp_path: Path, monkeypatch, chunk):
    monkeypatch.setattr(shards_gold, "GOLD_CHUNK", chunk)
    g, ids = _gold_example(tmp_path / "g", 50)
    assert inv.shards_match_gold(_full_rows(tmp_path / "ok" / "train" / "part-00000.parquet", ids, 12), g).passed
    # token 29 (0-based) sits in row 2 (offset 24) at row position 6 (1-based)
    bad = _full_rows(tmp_path / "bad" / "train" / "part-00000.parquet", ids, 12, {29: 1})
    out = inv.shards_match_gold(bad, g)
    assert out.violations == 1
    assert [(r["row"], r["off"], r["token"]) for r in out.offending] == [(2, 24, 6)]


def test_match_gold_windows_overlapping_in_gold_check_each_window(tmp_path: Path, monkeypatch):
    """Windows of 8 tokens with an overlap of 3 (stride 5) read gold chunks of 4 tokens in several segments."""
    monkeypatch.setattr(shards_gold, "GOLD_CHUNK", 4)
    g, ids = _gold_example(tmp_path / "g", 18)
    rows = []
    for off in (0, 5, 10):
        n = min(8, 18 - off)
        masked = 1 if off == 0 else 3
        types = [1] * n
        if off + n == 18:
            types[-1] = 3
        rows.append(
            {
                "input_ids": ids[off : off + n].tolist(),
                "loss_mask": [0] * masked + [1] * (n - masked),
                "position_ids": list(range(n)),
                "segment_ids": [1] * n,
                "token_type_ids": types,
                "seq_lengths": [n],
                "example_ids": ["d:1"],
                "example_offsets": [off],
                "num_loss_tokens": n - masked,
            }
        )
    f = tmp_path / "train" / "part-00000.parquet"
    f.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), f)
    assert inv.shards_match_gold([f], g, overlap=3).passed
    rows[1]["loss_mask"] = [0, 0, 1, 1, 1, 1, 1, 1]  # the overlap's last token trained
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), f)
    out = inv.shards_match_gold([f], g, overlap=3)
    assert [(r["row"], r["token"]) for r in out.offending] == [(1, 3)]


def test_shard_gates_on_a_long_example_stay_within_a_small_duckdb_budget(tmp_path: Path, monkeypatch):
    """300k tokens in 586 rows of 512: joining the whole example per segment asked DuckDB for ~1 GB; in chunks
    the gates keep within 64 MB, passing and failing alike."""
    monkeypatch.setenv(sql.MEMORY_ENV, "64MB")
    g, ids = _gold_example(tmp_path / "g", 300_000)
    ok = _full_rows(tmp_path / "ok" / "train" / "part-00000.parquet", ids, 512)
    assert inv.shards_match_gold(ok, g).passed
    assert inv.shards_tokens_conserved(ok, g, inv.Layout(512, "full")).passed
    bad = _full_rows(
        tmp_path / "bad" / "train" / "part-00000.parquet", ids, 512, {k * 512 + 7: 1 for k in range(0, 586, 10)}
    )
    out = inv.shards_match_gold(bad, g)
    assert out.violations == 59 and out.offending[0] == {
        "file": str(bad[0]),
        "row": 0,
        "seg": 1,
        "example_id": "d:1",
        "off": 0,
        "len": 512,
        "token": 8,
    }
