"""Packing: planned, then materialized.

`plan_packs` is a pure function from example lengths to bins (lists of example indices);
`materialize_rows` gathers the token arrays into fixed-length rows with numpy, no per-token loop.

Worked example (capacity 8): lengths [5, 3, 4, 2, 6] with `bfd`
    sorted by length: 6(#4) 5(#0) 4(#2) 3(#1) 2(#3)
    6 -> new bin A (free 2); 5 -> new bin B (free 3); 4 -> new bin C (free 4);
    3 -> best fit is B (free 3 -> 0); 2 -> best fit is A (free 2 -> 0)
    bins: [[4, 3], [0, 1], [2]]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, ranges_index, within_offsets
from prep_assets.core.records import TYPE_PADDING

Bins = list[list[int]]


class _FreeSpaceTree:
    """A max segment tree over free space 0..capacity; leaf r holds r while an open bin has r free.

    `smallest_at_least(n)` finds the tightest open bin for an item of n tokens in O(log capacity).
    """

    def __init__(self, capacity: int) -> None:
        self.size = 1 << max(1, capacity.bit_length())
        self.tree = [0] * (2 * self.size)

    def set(self, space: int, present: bool) -> None:
        i = space + self.size
        self.tree[i] = space if present else 0
        i >>= 1
        tree = self.tree
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = left if left > right else right
            i >>= 1

    def smallest_at_least(self, need: int) -> int | None:
        tree = self.tree
        if tree[1] < need:
            return None
        i = 1
        while i < self.size:
            i = 2 * i if tree[2 * i] >= need else 2 * i + 1
        return i - self.size


def plan_bfd(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> Bins:
    """Best-fit decreasing: longest first, each into the open bin it fills most tightly.

    Examples are never split; every length must be in 1..capacity. Ties go to the earliest bin.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"lengths must be within 1..{capacity} (got {lengths.min()}..{lengths.max()})")
    limit = max_per_bin or capacity
    tree = _FreeSpaceTree(capacity)
    open_bins: dict[int, deque[int]] = {}
    bins: Bins = []
    for idx in np.argsort(-lengths, kind="stable").tolist():
        need = int(lengths[idx])
        space = tree.smallest_at_least(need)
        if space is None:
            bin_id, free = len(bins), capacity - need
            bins.append([idx])
        else:
            queue = open_bins[space]
            bin_id = queue.popleft()
            if not queue:
                del open_bins[space]
                tree.set(space, False)
            bins[bin_id].append(idx)
            free = space - need
        if free > 0 and len(bins[bin_id]) < limit:
            if free not in open_bins:
                open_bins[free] = deque()
                tree.set(free, True)
            open_bins[free].append(bin_id)
    return bins


def plan_single(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> Bins:
    """One example per row, in input order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and lengths.max() > capacity:
        raise ValueError(f"lengths must be at most {capacity}")
    return [[i] for i in range(len(lengths))]


PLANNERS = {"bfd": plan_bfd, "single": plan_single}


def plan_packs(
    lengths: np.ndarray,
    *,
    capacity: int,
    strategy: str,
    max_per_bin: int | None = None,
    shuffle_seed: int | tuple[int, ...] | None = None,
) -> Bins:
    """Bins of example indices for a strategy; rows shuffled with the seed when one is given."""
    bins = PLANNERS[strategy](lengths, capacity, max_per_bin)
    if shuffle_seed is not None and len(bins) > 1:
        order = np.random.default_rng(shuffle_seed).permutation(len(bins))
        bins = [bins[i] for i in order.tolist()]
    return bins


def unit_offsets(keys: list[str | None]) -> np.ndarray:
    """Offsets of packing units: runs of consecutive equal non-null keys (a preference pair) stay together."""
    starts = [i for i, k in enumerate(keys) if i == 0 or k is None or k != keys[i - 1]]
    return np.array([*starts, len(keys)], dtype=np.int64)


def plan_unit_packs(
    lengths: np.ndarray,
    units: np.ndarray,
    *,
    capacity: int,
    strategy: str,
    max_per_bin: int | None = None,
    shuffle_seed: int | tuple[int, ...] | None = None,
) -> Bins:
    """`plan_packs` over units of consecutive examples (offsets `units`): a unit never spans two rows.

    `max_per_bin` still counts examples: a bin takes at most max_per_bin // (largest unit) units.
    """
    sizes = np.diff(units)
    unit_lengths = np.add.reduceat(lengths, units[:-1]) if len(lengths) else np.zeros(0, dtype=np.int64)
    per_bin = None if max_per_bin is None else max(1, max_per_bin // max(1, int(sizes.max(initial=1))))
    bins = plan_packs(unit_lengths, capacity=capacity, strategy=strategy, max_per_bin=per_bin,
                      shuffle_seed=shuffle_seed)
    return [[e for u in b for e in range(int(units[u]), int(units[u + 1]))] for b in bins]


@dataclass(frozen=True)
class PackedRows:
    """Fixed-length rows as flat arrays of num_rows * row_len, plus per-row segment info."""

    row_len: int
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    position_ids: np.ndarray  # int32
    segment_ids: np.ndarray  # int32
    token_type_ids: np.ndarray  # uint8
    seg_lengths: np.ndarray  # int32, concatenated per row
    seg_offsets: np.ndarray  # int64, num_rows + 1
    example_order: np.ndarray  # example indices in row order (aligned with seg_lengths)
    num_loss_tokens: np.ndarray  # int32 per row

    @property
    def num_rows(self) -> int:
        return len(self.seg_offsets) - 1


def materialize_rows(
    bins: Bins,
    *,
    token_ids: np.ndarray,
    loss_mask: np.ndarray,
    token_type_ids: np.ndarray,
    offsets: np.ndarray,
    row_len: int,
    pad_id: int,
) -> PackedRows:
    """Gather examples into rows of exactly `row_len` tokens, padding the rest.

    Padding: the pad id, loss_mask 0, segment 0, position 0, token type 2. Positions restart at 0 at
    every segment; segments are numbered 1..k within a row.
    """
    counts = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    order = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=int(counts.sum()))
    lengths = (offsets[1:] - offsets[:-1])[order]
    num_rows = len(bins)
    row_of_segment = np.repeat(np.arange(num_rows, dtype=np.int64), counts)
    seg_offsets = offsets_from_lengths(counts)
    seg_start_in_row = offsets_from_lengths(lengths)[:-1] - np.repeat(
        offsets_from_lengths(lengths)[seg_offsets[:-1]], counts
    )
    if np.any(np.bincount(row_of_segment, weights=lengths, minlength=num_rows) > row_len):
        raise ValueError("a bin holds more tokens than the row length")
    src = ranges_index(offsets[order], lengths)
    pos = within_offsets(lengths)
    dest = np.repeat(row_of_segment * row_len + seg_start_in_row, lengths) + pos
    total = num_rows * row_len
    input_ids = np.full(total, pad_id, dtype=np.int32)
    input_ids[dest] = token_ids[src]
    mask = np.zeros(total, dtype=np.uint8)
    mask[dest] = loss_mask[src]
    positions = np.zeros(total, dtype=np.int32)
    positions[dest] = pos
    segments = np.zeros(total, dtype=np.int32)
    segments[dest] = np.repeat(within_offsets(counts) + 1, lengths)
    types = np.full(total, TYPE_PADDING, dtype=np.uint8)
    types[dest] = token_type_ids[src]
    row_loss = mask.reshape(num_rows, row_len).sum(axis=1, dtype=np.int64) if num_rows else np.zeros(0)
    return PackedRows(
        row_len=row_len,
        input_ids=input_ids,
        loss_mask=mask,
        position_ids=positions,
        segment_ids=segments,
        token_type_ids=types,
        seg_lengths=lengths.astype(np.int32),
        seg_offsets=seg_offsets,
        example_order=order,
        num_loss_tokens=row_loss.astype(np.int32),
    )
