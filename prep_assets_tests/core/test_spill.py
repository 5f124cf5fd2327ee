"""The spill file packing reads gold from: exact pieces back, and memory that does not grow with the file."""

import re
from pathlib import Path

import numpy as np
import pytest

from prep_assets.core.arrays import offsets_from_lengths
from prep_assets.core.packing import plan_rows
from prep_assets.core.rows import materialize_rows, rows_from_values, segment_sources
from prep_assets.core.spill import TOKEN, TokenSpill, runs


def _spill(path: Path, tokens: int, seed: int = 0) -> tuple[TokenSpill, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50_000, tokens, dtype=np.int32)
    mask = rng.integers(0, 2, tokens, dtype=np.uint8)
    types = rng.integers(0, 4, tokens, dtype=np.uint8)
    spill = TokenSpill(path)
    for lo in range(0, tokens, 100_000):  # appended batch by batch, as gold streams in
        spill.append(ids[lo : lo + 100_000], mask[lo : lo + 100_000], types[lo : lo + 100_000])
    spill.seal()
    return spill, ids, mask, types


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process' mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_runs_merges_only_pieces_that_touch():
    starts, lengths = runs(np.array([0, 5, 9, 20, 21]), np.array([5, 4, 2, 1, 0]))
    assert starts.tolist() == [0, 20] and lengths.tolist() == [11, 1]
    assert [a.tolist() for a in runs(np.array([], dtype=np.int64), np.array([], dtype=np.int64))] == [[], []]


def test_read_returns_the_pieces_in_order_scattered_adjacent_and_empty(tmp_path: Path):
    spill, ids, mask, types = _spill(tmp_path / "t.tokens", 300_000)
    starts = np.array([250_000, 10, 20, 299_990, 5, 7], dtype=np.int64)
    lengths = np.array([100, 10, 0, 10, 2, 3], dtype=np.int64)  # 10+10 touch 20; one empty piece
    got = spill.read(starts, lengths)
    src = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    for a, b in zip(got, (ids[src], mask[src], types[src])):
        assert a.flags.c_contiguous and a.tolist() == b.tolist()
    spill.close()


def test_records_into_a_reused_buffer_are_the_pieces_of_each_read(tmp_path: Path):
    spill, ids, mask, types = _spill(tmp_path / "t.tokens", 50_000)
    buffer = np.empty(1_000, dtype=TOKEN)
    for starts, lengths in (([40_000, 3], [600, 400]), ([7], [250]), ([], [])):
        starts, lengths = np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)
        got = spill.records(starts, lengths, buffer)
        src = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)] + [[]]).astype(int)
        assert len(got) == len(src) and (np.shares_memory(got, buffer) or not len(src))
        assert [got[f].tolist() for f in ("id", "mask", "type")] == [
            ids[src].tolist(),
            mask[src].tolist(),
            types[src].tolist(),
        ]
    with pytest.raises(ValueError, match="buffer of 1000"):
        spill.records(np.array([0]), np.array([1_001]), buffer)
    spill.close()


def test_read_past_the_end_names_the_file(tmp_path: Path):
    spill, *_ = _spill(tmp_path / "t.tokens", 1000)
    with pytest.raises(OSError, match="t.tokens: spill file ends"):
        spill.read(np.array([990]), np.array([20]))
    spill.close()


def test_rows_from_a_spill_equal_rows_gathered_in_memory(tmp_path: Path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 900, 400)
    spill, ids, mask, types = _spill(tmp_path / "t.tokens", int(lengths.sum()))
    offsets = offsets_from_lengths(lengths)
    plan = plan_rows(lengths, capacity=1024, strategy="bfd", overflow="window", loss_mask=spill.front_to_back("mask"))
    assert (
        plan.num_rows == plan_rows(lengths, capacity=1024, strategy="bfd", overflow="window", loss_mask=mask).num_rows
    )
    want = materialize_rows(
        plan, token_ids=ids, loss_mask=mask, token_type_ids=types, offsets=offsets, row_len=1024, pad_id=0
    )
    got = rows_from_values(plan, *spill.read(segment_sources(plan, offsets), plan.length), row_len=1024, pad_id=0)
    for name in ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids", "num_loss_tokens"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    spill.close()


def test_scattered_reads_and_front_to_back_passes_keep_little_of_the_file_resident(tmp_path: Path):
    # 8M tokens = 48 MB. Through the mapping, 2,000 scattered pieces would map ~2,000 fault-around windows
    # (64 KB each: most of the file); reads copy only what they ask for, and a front-to-back pass drops
    # the pages of each slice before the next.
    path = tmp_path / "t.tokens"
    spill, ids, mask, _ = _spill(path, 8_000_000)
    rng = np.random.default_rng(1)
    starts = np.sort(rng.integers(0, 8_000_000 - 500, 2000))
    spill.read(starts, np.full(2000, 300))
    assert _mapped_kib(path) < 1024
    view = spill.front_to_back("mask")
    total = sum(int(view[lo : lo + (1 << 20)].sum()) for lo in range(0, len(view), 1 << 20))
    assert total == int(mask.sum(dtype=np.int64))
    assert _mapped_kib(path) < 8 * 1024  # one slice of 1M records (6 MB), not 48 MB
    spill.close()
