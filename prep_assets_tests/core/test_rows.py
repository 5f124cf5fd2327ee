"""Rows from a plan (`core/rows.py`) against a row-by-row reference: every strategy, windows with overlap, row
lengths where padded rows are copied row by row and where one mask places them, chunks of a plan, empty chunks."""

import numpy as np
import pytest

from prep_assets.core.arrays import offsets_from_lengths
from prep_assets.core.packing import RowPlan, plan_rows
from prep_assets.core.records import TYPE_PADDING, TYPE_PROMPT
from prep_assets.core.rows import RowCounts, materialize_rows, rows_from_values, segment_sources

PAD = 7


def _reference(plan: RowPlan, ids: np.ndarray, mask: np.ndarray, types: np.ndarray, row_len: int) -> dict:
    """The rows built one token at a time, as docs/shards.md states them."""
    out = {k: [] for k in ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids")}
    at = 0
    for r in range(plan.num_rows):
        row = {k: [] for k in out}
        for seg, p in enumerate(range(int(plan.row_offsets[r]), int(plan.row_offsets[r + 1])), start=1):
            n, masked = int(plan.length[p]), max(int(plan.masked[p]), 1)
            row["input_ids"] += ids[at : at + n].tolist()
            row["loss_mask"] += [0 if i < masked else int(m) for i, m in enumerate(mask[at : at + n].tolist())]
            row["position_ids"] += list(range(n))
            row["segment_ids"] += [seg] * n
            row["token_type_ids"] += types[at : at + n].tolist()
            at += n
        pad = row_len - len(row["input_ids"])
        for k, v in zip(out, (PAD, 0, 0, 0, TYPE_PADDING), strict=True):
            out[k] += row[k] + [v] * pad
    return out


def _case(rng: np.random.Generator, row_len: int, strategy: str, overlap: int):
    long = rng.random() < 0.3 and strategy in ("bfd", "single", "full")
    lengths = rng.integers(1, row_len * 3 if long else row_len + 1, size=int(rng.integers(0, 50)))
    overflow = "window" if long and strategy != "full" else "drop"
    plan = plan_rows(lengths, capacity=row_len, strategy=strategy, overflow=overflow, overlap=overlap)
    total = int(lengths.sum())
    ids = rng.integers(0, 50_000, total).astype(np.int32)
    mask = rng.integers(0, 2, total).astype(np.uint8)
    types = rng.integers(0, 4, total).astype(np.uint8)
    return plan, offsets_from_lengths(lengths), ids, mask, types


@pytest.mark.parametrize("row_len", [4, 64, 4096])
@pytest.mark.parametrize("strategy", ["bfd", "ffd", "single", "full", "greedy"])
def test_rows_equal_the_row_by_row_reference(row_len: int, strategy: str):
    rng = np.random.default_rng(row_len)
    for _ in range(30):
        overlap = int(rng.integers(0, row_len // 2 + 1)) if strategy != "full" else 0
        plan, offsets, ids, mask, types = _case(rng, row_len, strategy, overlap)
        lo = int(rng.integers(0, plan.num_rows + 1))
        part = plan.rows(lo, int(rng.integers(lo, plan.num_rows + 1)))  # a chunk, possibly empty
        rows = materialize_rows(
            part, token_ids=ids, loss_mask=mask, token_type_ids=types, offsets=offsets, row_len=row_len, pad_id=PAD
        )
        pieces = zip(segment_sources(part, offsets), part.length, strict=True)
        src = np.concatenate([np.arange(s, s + n) for s, n in pieces] + [[]]).astype(np.int64)
        want = _reference(part, ids[src], mask[src], types[src], row_len)
        for name, values in want.items():
            got = getattr(rows, name)
            assert got.tolist() == values, name
            assert got.dtype == (np.int32 if name in ("input_ids", "position_ids", "segment_ids") else np.uint8)
        by_row = np.array(want["loss_mask"], dtype=np.int64).reshape(-1, row_len).sum(axis=1)
        assert rows.num_loss_tokens.tolist() == by_row.tolist() and rows.num_loss_tokens.dtype == np.int32
        real = np.array(want["segment_ids"]) > 0
        counts = RowCounts()
        counts.add(rows)
        counts.add(rows)  # counted once per rows object, added per sink
        assert (counts.output, counts.loss, counts.prompt) == (
            2 * int(real.sum()),
            2 * int(by_row.sum()),
            2 * int((real & (np.array(want["token_type_ids"]) == TYPE_PROMPT)).sum()),
        )


def test_rows_refuse_an_overfull_row_and_an_empty_piece():
    zero = np.zeros(2, dtype=np.int64)
    over = RowPlan(np.array([0, 1]), zero, np.array([3, 2]), zero, np.array([0, 2]))
    values = np.zeros(5, dtype=np.int32), np.zeros(5, dtype=np.uint8), np.zeros(5, dtype=np.uint8)
    with pytest.raises(ValueError, match="more tokens than the row length"):
        rows_from_values(over, *values, row_len=4, pad_id=0)
    empty = RowPlan(np.array([0, 1]), zero, np.array([3, 0]), zero, np.array([0, 2]))
    with pytest.raises(ValueError, match="no token"):
        rows_from_values(empty, *(v[:3] for v in values), row_len=4, pad_id=0)


def test_grid_memory_reuses_a_buffer_only_once_nothing_holds_it():
    import pyarrow as pa

    from prep_assets.core.rows import GridMemory

    grids = GridMemory()
    a = grids.empty(1_000, np.int32)
    column = pa.array(a[10:20])  # zero-copy: Arrow holds the buffer through a view of a view
    del a
    b = grids.empty(1_000, np.int32)
    assert not np.shares_memory(np.asarray(column), b)  # still in use: new memory
    small = grids.empty(100, np.uint8)  # 4,000 bytes kept, 100 asked: not more than twice, new memory
    assert not np.shares_memory(small, b)
    del column, b
    c = grids.empty(900, np.int32)  # one of the two 4,000-byte buffers, free again
    assert c.dtype == np.int32 and len(c) == 900 and c.base is not None
    assert len(grids._buffers) == 3
    d = grids.empty(1_000, np.int32)
    assert not np.shares_memory(c, d) and len(grids._buffers) == 3
    del small
    grids.empty(10_000, np.uint8)  # fits no buffer: the unused one (small's) goes, those in use stay
    assert sorted(len(b) for b in grids._buffers) == [4_000, 4_000, 10_000]
    del c, d
    grids.empty(20_000, np.uint8)  # only the new one and this one are left (the 10,000 one is unused too)
    assert sorted(len(b) for b in grids._buffers) == [20_000]
    grids.release()
    assert len(grids._buffers) == 0 and len(GridMemory(keep=False).empty(5, np.uint8)) == 5


def test_rows_in_reused_grids_equal_rows_in_new_arrays():
    from prep_assets.core.rows import GridMemory

    rng = np.random.default_rng(5)
    plan, offsets, ids, mask, types = _case(rng, 64, "bfd", 0)
    grids, kept = GridMemory(), []
    for _ in range(3):  # the same chunk again and again: freed grids are written over
        for lo in range(0, plan.num_rows, 7):
            part = plan.rows(lo, min(lo + 7, plan.num_rows))
            src = np.concatenate([np.arange(s, s + n) for s, n in zip(segment_sources(part, offsets), part.length)])
            values = ids[src], mask[src], types[src]
            want = rows_from_values(part, *values, row_len=64, pad_id=PAD)
            got = rows_from_values(part, *values, row_len=64, pad_id=PAD, grids=grids)
            kept = kept[-1:] + [(got, want)]  # the chunk before stays in use while this one is made
            for got, want in kept:  # neither written over
                for name in ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids"):
                    assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert len(grids._buffers) <= 3 * 5
