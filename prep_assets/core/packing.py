"""Packing: planned, then materialized (the shard format: docs/shards.md).

`plan_rows` is a pure function from example lengths to a `RowPlan`: which piece of which example goes
into which row. A piece is a whole example (`bfd`, `ffd`, `single`), a window of a long example
(`sequence.overflow: window`) or a cut of the concatenated stream (`full`). `materialize_rows` gathers
the token arrays into fixed-length rows with numpy, no per-token loop.

Strategies (examples are never split except by `full` and by windows):
- `bfd`: best fit decreasing, bin by bin ("minimum bin slack"): each row opens with the longest
  remaining example and is completed with the subset of the remaining examples that leaves the least
  free space (an exact subset sum over their lengths, longest examples preferred). Item-by-item best-fit
  decreasing is also run and the plan with fewer rows is kept.
- `ffd`: first fit decreasing: longest first, each into the first row with room.
- `single`: one example (or window) per row, in input order.
- `full`: the examples concatenated in input order and cut every `capacity` tokens; an example cut at a
  row end continues at the start of the next row as a new segment. The last row is padded.

Worked example (capacity 8), lengths [5, 3, 4, 2, 6] with `bfd`:
    6(#4) opens row A, free 2: the best completion is 2(#3) -> A = [4, 3], full
    5(#0) opens row B, free 3: 3(#1) -> B = [0, 1], full
    4(#2) opens row C, nothing left -> C = [2]
    rows: [[4, 3], [0, 1], [2]]

Window overflow (capacity 8, overlap 2, an example of 13 tokens): stride 6, windows [0, 8) and [6, 13)
(windows start every 6 tokens while one still has a token not seen before): the second window's first 2
tokens repeat the first window's last 2 and are masked. A window with no loss token left is not emitted
(tokens then in no window are counted as dropped).

The first token of every piece has loss_mask 0 (with block-diagonal attention it has no context).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, within_offsets

Bins = list[list[int]]
STRATEGIES = ("bfd", "ffd", "full", "single", "greedy")


def _check_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"lengths must be within 1..{capacity} (got {lengths.min()}..{lengths.max()})")
    return lengths


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


def _best_fit_items(lengths: np.ndarray, capacity: int, limit: int) -> Bins:
    """Item-by-item best-fit decreasing: longest first, each into the open bin it fills most tightly."""
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


def _neg(x: int) -> int:
    return -x


class _Pool:
    """Unplaced items by length; each length's items leave in index order. `sizes`: the lengths some item still
    has, longest first."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.items: dict[int, list[int]] = {}
        for i in np.argsort(-lengths, kind="stable")[::-1].tolist():  # so pop() yields the lowest index
            self.items.setdefault(int(lengths[i]), []).append(i)
        self.sizes = sorted(self.items, reverse=True)
        self.left = len(lengths)

    def largest(self) -> int:
        return self.sizes[0]

    def take(self, size: int, count: int = 1) -> list[int]:
        self.left -= count
        stack = self.items[size]
        out = [stack.pop() for _ in range(count)]
        if not stack:
            del self.sizes[bisect_left(self.sizes, -size, key=_neg)]
        return out

    def best_subset(self, gap: int) -> list[tuple[int, int]]:
        """(size, count) pairs of the subset of pool items with the largest sum <= gap.

        A subset sum over bitsets, sizes visited longest first with counts split in powers of two; walking back
        skips the shortest sizes where it can, so long items go first. Bit gap - t set = sum t reachable: a
        shift right adds an item, and the sums past gap fall off the end by themselves (no mask per step).
        """
        reach, steps = 1 << gap, []
        items, sizes = self.items, self.sizes
        for i in range(bisect_left(sizes, -gap, key=_neg), len(sizes)):  # the sizes that fit, longest first
            size = sizes[i]
            count = len(items[size])
            if count * size > gap:
                count = gap // size
            chunk = 1
            while count > 0:
                take = chunk if chunk < count else count
                steps.append((size, take, reach))
                reach |= reach >> (size * take)
                count -= take
                chunk <<= 1
            if reach & 1:  # gap itself is reachable
                break
        free = (reach & -reach).bit_length() - 1  # gap - the largest reachable sum
        chosen = []
        for size, take, before in reversed(steps):
            if free == gap:
                break
            if not (before >> free) & 1:
                free += size * take
                chosen.append((size, take))
        return chosen

    def greedy(self, gap: int, slots: int) -> list[tuple[int, int]]:
        """(size, count) pairs of the longest items that fit, at most `slots` of them."""
        chosen = []
        for size in self.sizes:
            n = min(len(self.items[size]), gap // size, slots)
            if n:
                chosen.append((size, n))
                gap, slots = gap - size * n, slots - n
        return chosen


def _min_slack(lengths: np.ndarray, capacity: int, limit: int) -> Bins:
    """Bin by bin: the longest remaining item, completed by the subset leaving the least free space."""
    pool = _Pool(lengths)
    bins: Bins = []
    while pool.left:
        first = pool.largest()
        row = pool.take(first)
        gap = capacity - first
        if gap > 0 and pool.left and limit > 1:
            chosen = pool.best_subset(gap)
            if sum(c for _, c in chosen) > limit - 1:
                chosen = pool.greedy(gap, limit - 1)
            for size, count in chosen:
                row += pool.take(size, count)
        bins.append(row)
    return bins


def plan_bfd(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> Bins:
    """Best fit decreasing (bin-oriented minimum slack, or item-oriented if that needs fewer rows)."""
    lengths = _check_lengths(lengths, capacity)
    limit = max_per_bin or capacity
    by_bin = _min_slack(lengths, capacity, limit)
    if len(by_bin) <= int(np.ceil(lengths.sum() / capacity)):
        return by_bin  # already at the lower bound
    by_item = _best_fit_items(lengths, capacity, limit)
    return by_bin if len(by_bin) <= len(by_item) else by_item


def plan_ffd(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> Bins:
    """First fit decreasing: longest first, each into the first (oldest) row with room.

    A max segment tree over rows' free space finds the leftmost row with room in O(log rows).
    """
    lengths = _check_lengths(lengths, capacity)
    limit = max_per_bin or capacity
    size = 1 << max(1, int(len(lengths)).bit_length())
    tree = [-1] * (2 * size)  # free space per row; -1 = no such row (or closed)
    bins: Bins = []

    def update(row: int, free: int) -> None:
        i = row + size
        tree[i] = free
        i >>= 1
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i >>= 1

    for idx in np.argsort(-lengths, kind="stable").tolist():
        need = int(lengths[idx])
        if tree[1] >= need:
            i = 1
            while i < size:
                i = 2 * i if tree[2 * i] >= need else 2 * i + 1
            row = i - size
            bins[row].append(idx)
            free = tree[i] - need
        else:
            row = len(bins)
            bins.append([idx])
            free = capacity - need
        update(row, free if len(bins[row]) < limit else -1)
    return bins


def plan_single(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> Bins:
    """One example per row, in input order."""
    lengths = _check_lengths(lengths, capacity)
    return [[i] for i in range(len(lengths))]


def plan_greedy(
    lengths: np.ndarray, capacity: int, max_per_bin: int | None = None, *, closes: np.ndarray | None = None
) -> Bins:
    """Next fit in input order (gdp's `greedy`): an example joins the open row if it fits, else the row closes
    and the example opens the next one; rows never reorder examples. `closes` (a flag per example) closes the
    open row before the flagged ones: where gold dropped an example too long for any row, which gdp's greedy
    meets as not fitting.

    >>> plan_greedy(np.array([3, 4, 2, 5, 1]), 8)
    [[0, 1], [2, 3, 4]]
    >>> plan_greedy(np.array([3, 4, 2, 5, 1]), 8, closes=np.array([0, 0, 0, 1, 0]))
    [[0, 1], [2], [3, 4]]
    """
    lengths = _check_lengths(lengths, capacity)
    limit = max_per_bin or capacity
    close = np.zeros(len(lengths), dtype=bool) if closes is None else np.asarray(closes, dtype=bool)
    if len(close) != len(lengths):
        raise ValueError(f"closes has {len(close)} flags for {len(lengths)} examples")
    bins: Bins = []
    free = 0
    for idx, (need, closed) in enumerate(zip(lengths.tolist(), close.tolist(), strict=True)):
        if not bins or need > free or len(bins[-1]) >= limit or closed:
            bins.append([])
            free = capacity
        bins[-1].append(idx)
        free -= need
    return bins


PLANNERS = {"bfd": plan_bfd, "ffd": plan_ffd, "single": plan_single, "greedy": plan_greedy}


def unit_offsets(keys: list[str | None]) -> np.ndarray:
    """Offsets of packing units: runs of consecutive equal non-null keys (a preference pair) stay together."""
    starts = [i for i, k in enumerate(keys) if i == 0 or k is None or k != keys[i - 1]]
    return np.array([*starts, len(keys)], dtype=np.int64)


def plan_unit_bins(
    lengths: np.ndarray,
    units: np.ndarray | None,
    *,
    capacity: int,
    strategy: str,
    max_per_bin: int | None = None,
    closes: np.ndarray | None = None,
) -> Bins:
    """Bins over units of consecutive items (offsets `units`; None = every item alone): a unit never spans rows.

    `max_per_bin` still counts items: a bin takes at most max_per_bin // (largest unit) units. `closes` (per
    item, `greedy` only, items alone) closes the open row before the flagged items (`plan_greedy`).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if closes is not None:
        if strategy != "greedy" or not (units is None or len(units) == len(lengths) + 1):
            raise ValueError("closes applies to greedy packing of single examples only")
        return plan_greedy(lengths, capacity, max_per_bin, closes=closes)
    if units is None or len(units) == len(lengths) + 1:
        return PLANNERS[strategy](lengths, capacity, max_per_bin)
    sizes = np.diff(units)
    unit_lengths = np.add.reduceat(lengths, units[:-1]) if len(lengths) else np.zeros(0, dtype=np.int64)
    per_bin = None if max_per_bin is None else max(1, max_per_bin // max(1, int(sizes.max(initial=1))))
    bins = PLANNERS[strategy](unit_lengths, capacity, per_bin)
    return [[e for u in b for e in range(int(units[u]), int(units[u + 1]))] for b in bins]


# ---------------------------------------------------------------- pieces and rows


@dataclass(frozen=True)
class RowPlan:
    """Pieces of examples in row order: row r holds pieces row_offsets[r]..row_offsets[r+1]-1."""

    example: np.ndarray  # int64 per piece: the example index
    start: np.ndarray  # int64 per piece: offset of its first token within the example
    length: np.ndarray  # int64 per piece
    masked: np.ndarray  # int64 per piece: leading tokens forced to loss 0 (window overlap, continuation)
    row_offsets: np.ndarray  # int64, num_rows + 1
    dropped_tokens: int = 0  # tokens of windows left out (no loss token): their tokens not in any kept window
    dropped_pieces: int = 0
    overlap_tokens: int = 0  # tokens repeated at the start of windows (masked)
    dropped_rows: int = 0  # rows left out whole (`drop_rows_without`); their tokens are in dropped_tokens

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    def rows(self, lo: int, hi: int) -> RowPlan:
        """Rows [lo, hi) of the plan, as a plan of their own (what is materialized one chunk at a time)."""
        a, b = int(self.row_offsets[lo]), int(self.row_offsets[hi])
        return RowPlan(
            self.example[a:b], self.start[a:b], self.length[a:b], self.masked[a:b], self.row_offsets[lo : hi + 1] - a
        )


@dataclass(frozen=True)
class _Pieces:
    example: np.ndarray
    start: np.ndarray
    length: np.ndarray
    masked: np.ndarray


def _whole(lengths: np.ndarray) -> _Pieces:
    n = len(lengths)
    zero = np.zeros(n, dtype=np.int64)
    return _Pieces(np.arange(n, dtype=np.int64), zero, lengths.astype(np.int64), zero.copy())


def window_pieces(
    lengths: np.ndarray,
    capacity: int,
    overlap: int,
    loss_mask: np.ndarray | None = None,
    example_loss: np.ndarray | None = None,
) -> tuple[_Pieces, int, int, int]:
    """Examples longer than `capacity` as windows of `capacity` tokens sharing `overlap` with the previous one.

    Returns (kept pieces, tokens dropped, windows dropped, overlap tokens). A window is dropped when none of
    its tokens is a loss target after its overlap (and, with overlap 0, its first token) is masked. Tokens
    dropped = gold tokens in no kept window; overlap tokens = tokens in two kept windows (each counted once
    more), so kept window tokens = gold tokens - dropped + overlap. `loss_mask` is the flat mask of all
    examples (concatenated in order), or anything whose slices are (a spilled split read front to back);
    None keeps every window. `example_loss` (each example's loss tokens, if known) spares reading the mask of the
    examples that are one window (their window is the whole example): only longer examples' windows are summed.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not 0 <= 2 * overlap <= capacity:
        raise ValueError(f"overlap must be within 0..{capacity // 2} (max_seq_len / 2), got {overlap}")
    stride = capacity - overlap
    over = np.maximum(lengths - capacity, 0)
    counts = 1 + (over + stride - 1) // stride
    example = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    k = within_offsets(counts)
    start = k * stride
    length = np.minimum(capacity, lengths[example] - start)
    masked = np.where(k > 0, max(overlap, 1), 0).astype(np.int64)
    keep = np.ones(len(example), dtype=bool)
    if loss_mask is not None and len(example):
        first = offsets_from_lengths(lengths)[:-1][example] + start
        lo, hi = first + masked, first + length
        if example_loss is None:
            keep = range_sums(loss_mask, lo, hi) > 0
        else:
            if len(example_loss) != len(lengths):
                raise ValueError(f"example_loss has {len(example_loss)} counts for {len(lengths)} examples")
            keep = np.asarray(example_loss, dtype=np.int64)[example] > 0
            split = counts[example] > 1
            keep[split] = range_sums(loss_mask, lo[split], hi[split]) > 0
    kept = _Pieces(example[keep], start[keep], length[keep], masked[keep])
    # windows of one example are in start order and only neighbours overlap (stride >= capacity / 2)
    same = np.concatenate([[False], kept.example[1:] == kept.example[:-1]])
    prev_end = np.concatenate([[0], kept.start[:-1] + kept.length[:-1]])
    repeated = int(np.where(same, np.maximum(prev_end - kept.start, 0), 0).sum())
    dropped = int(lengths.sum() - (kept.length.sum() - repeated))
    return kept, dropped, int(np.count_nonzero(~keep)), repeated


def drop_rows_without(plan: RowPlan, lengths: np.ndarray, flags: np.ndarray) -> RowPlan:
    """The plan without its rows none of whose tokens is flagged: gdp's removal of prompt-only sequences
    (`--keep_prompt_only_sequences` false), which under `full` drops a row cut from the middle of a long prompt.

    `flags` holds a value per token of the examples concatenated in order (`lengths`), non-zero on the tokens that
    keep a row (gdp: its completion tokens, type 1), or anything whose slices are. The left-out rows' tokens are
    added to `dropped_tokens` (they are in no row), the rows counted in `dropped_rows`.

    >>> plan = plan_rows(np.array([2, 6]), capacity=3, strategy="full")
    >>> kept = drop_rows_without(plan, np.array([2, 6]), np.array([1, 1, 0, 0, 0, 0, 0, 1]))
    >>> kept.row_offsets.tolist(), kept.dropped_tokens, kept.dropped_rows
    ([0, 2, 3], 3, 1)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    lo = offsets_from_lengths(lengths)[:-1][plan.example] + plan.start
    order = np.argsort(lo, kind="stable")  # range_sums reads ranges front to back
    sums = np.empty(len(lo), dtype=np.int64)
    sums[order] = range_sums(flags, lo[order], lo[order] + plan.length[order])
    rows = np.repeat(np.arange(plan.num_rows), np.diff(plan.row_offsets))
    keep_row = np.bincount(rows, weights=sums, minlength=plan.num_rows) > 0
    if keep_row.all():
        return plan
    keep = keep_row[rows]
    return RowPlan(
        plan.example[keep],
        plan.start[keep],
        plan.length[keep],
        plan.masked[keep],
        offsets_from_lengths(np.diff(plan.row_offsets)[keep_row]),
        plan.dropped_tokens + int(plan.length[~keep].sum()),
        plan.dropped_pieces,
        plan.overlap_tokens,
        plan.dropped_rows + int(np.count_nonzero(~keep_row)),
    )


def range_sums(
    values: np.ndarray, lo: np.ndarray, hi: np.ndarray, span: int = 1 << 22, skip: int = 1 << 16
) -> np.ndarray:
    """sum(values[lo[i]:hi[i]]) for ranges whose `lo` and `hi` never decrease, a cumulative sum over at most
    `span` values at a time (a whole-split cumsum of a 100M-token mask would take 800 MB). A gap of more than
    `skip` values between one range's end and the next one's start is not read: a few long examples' windows
    read those examples, not the split (through a spill file's mapping, every page between them).

    >>> range_sums(np.array([1, 0, 1, 1]), np.array([0, 1, 2]), np.array([2, 4, 4])).tolist()
    [1, 2, 2]
    """
    out = np.zeros(len(lo), dtype=np.int64)
    i = 0
    while i < len(lo):
        base = int(lo[i])
        j = max(i + 1, int(np.searchsorted(hi, base + span, side="right")))
        gaps = np.flatnonzero(lo[i + 1 : j] - hi[i : j - 1] > skip)
        if len(gaps):
            j = i + 1 + int(gaps[0])
        top = int(hi[j - 1])
        cum = np.zeros(top - base + 1, dtype=np.int64)
        np.cumsum(values[base:top], dtype=np.int64, out=cum[1:])
        out[i:j] = cum[hi[i:j] - base] - cum[lo[i:j] - base]
        i = j
    return out


def full_pieces(lengths: np.ndarray, capacity: int, max_per_bin: int | None = None) -> tuple[_Pieces, np.ndarray]:
    """The examples concatenated in order and cut every `capacity` tokens (or after `max_per_bin` segments).

    Returns the pieces in row order and the row offsets over them.
    """
    lengths = _check_lengths(lengths, capacity=np.iinfo(np.int64).max)
    if max_per_bin is None:
        ends = offsets_from_lengths(lengths)
        total = int(ends[-1])
        cuts = np.union1d(ends, np.arange(0, total, capacity, dtype=np.int64))
        cuts = cuts[cuts <= total]
        starts, stops = cuts[:-1], cuts[1:]
        example = np.searchsorted(ends, starts, side="right") - 1
        start = starts - ends[example]
        row = starts // capacity
        row_offsets = np.searchsorted(row, np.arange(int(row[-1]) + 2 if len(row) else 1), side="left")
        return _Pieces(example, start, stops - starts, (start > 0).astype(np.int64)), row_offsets.astype(np.int64)
    example_l, start_l, length_l, row_l = [], [], [], []
    row, used, segments = 0, 0, 0
    for e, n in enumerate(lengths.tolist()):
        off = 0
        while off < n:
            if used == capacity or segments == max_per_bin:
                row, used, segments = row + 1, 0, 0
            take = min(n - off, capacity - used)
            example_l.append(e)
            start_l.append(off)
            length_l.append(take)
            row_l.append(row)
            used, segments, off = used + take, segments + 1, off + take
    start = np.array(start_l, dtype=np.int64)
    rows = np.array(row_l, dtype=np.int64)
    row_offsets = np.searchsorted(rows, np.arange(row + 2 if row_l else 1), side="left").astype(np.int64)
    pieces = _Pieces(
        np.array(example_l, dtype=np.int64), start, np.array(length_l, dtype=np.int64), (start > 0).astype(np.int64)
    )
    return pieces, row_offsets


def plan_rows(
    lengths: np.ndarray,
    *,
    capacity: int,
    strategy: str,
    overflow: str = "drop",
    overlap: int = 0,
    loss_mask: np.ndarray | None = None,
    example_loss: np.ndarray | None = None,
    units: np.ndarray | None = None,
    max_per_bin: int | None = None,
    shuffle_seed: int | tuple[int, ...] | None = None,
    groups: np.ndarray | None = None,
    closes: np.ndarray | None = None,
) -> RowPlan:
    """Which piece of which example goes into which row, rows shuffled with the seed when one is given.

    Examples longer than `capacity` are an error unless the strategy is `full` or the overflow `window`
    (gold has already truncated or dropped them under the other policies). `units` (offsets over examples)
    keeps consecutive examples in one row (a preference pair); only for whole-example strategies. `loss_mask` and
    `example_loss` decide which windows are kept (`window_pieces`). `groups` (a number per example, e.g. its
    domain's) packs each group apart, groups in ascending order: a row holds one group, a group's rows are
    contiguous, and the seed shuffles rows within their group only (`(*seed, group)`). `closes` (per example,
    `greedy`): the open row closes before the flagged examples (`plan_greedy`).

    >>> plan_rows(np.array([3, 3, 2, 2]), capacity=5, strategy="ffd", groups=np.array([1, 0, 1, 0])).row_offsets
    array([0, 2, 4])
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown packing strategy {strategy!r}; one of {STRATEGIES}")
    lengths = np.asarray(lengths, dtype=np.int64)
    windowed = overflow == "window" and strategy != "full"
    if units is not None and len(units) != len(lengths) + 1 and (windowed or strategy == "full"):
        raise ValueError("multi-example units (preference pairs) cannot be split by `full` or windows")
    group_ids = np.zeros(len(lengths), dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if len(group_ids) != len(lengths):
        raise ValueError(f"groups has {len(group_ids)} numbers for {len(lengths)} examples")
    dropped = dropped_pieces = added = 0
    parts: list[tuple[int, Bins]] = []  # (group, its bins over the pieces)
    if strategy == "full":
        chunks, base = [], 0
        for g in np.unique(group_ids).tolist():
            idx = np.flatnonzero(group_ids == g)
            p, row_offsets = full_pieces(lengths[idx], capacity, max_per_bin)
            chunks.append(_Pieces(idx[p.example], p.start, p.length, p.masked))
            parts.append((g, [list(range(base + int(a), base + int(b))) for a, b in pairwise(row_offsets.tolist())]))
            base += len(p.example)
        pieces = _concat_pieces(chunks) if len(chunks) != 1 else chunks[0]
    else:
        if windowed:
            _check_lengths(lengths, np.iinfo(np.int64).max)
            pieces, dropped, dropped_pieces, added = window_pieces(lengths, capacity, overlap, loss_mask, example_loss)
            units = None
        else:
            pieces = _whole(_check_lengths(lengths, capacity))
        piece_groups = group_ids[pieces.example]
        for g in np.unique(piece_groups).tolist():
            sel = np.flatnonzero(piece_groups == g)
            local = plan_unit_bins(
                pieces.length[sel],
                _group_units(units, group_ids, g),
                capacity=capacity,
                strategy=strategy,
                max_per_bin=max_per_bin,
                closes=None if closes is None or windowed else np.asarray(closes, dtype=bool)[pieces.example[sel]],
            )
            parts.append((g, [sel[b].tolist() for b in local] if groups is not None else local))
    bins: Bins = []
    for g, part in parts:
        if shuffle_seed is not None and len(part) > 1:
            seed = shuffle_seed if groups is None else (*np.atleast_1d(shuffle_seed).tolist(), g)
            order = np.random.default_rng(seed).permutation(len(part))
            part = [part[i] for i in order.tolist()]
        bins += part
    counts = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    idx = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=int(counts.sum()))
    return RowPlan(
        pieces.example[idx],
        pieces.start[idx],
        pieces.length[idx],
        pieces.masked[idx],
        offsets_from_lengths(counts),
        dropped,
        dropped_pieces,
        added,
    )


def _concat_pieces(chunks: list[_Pieces]) -> _Pieces:
    if not chunks:
        return _whole(np.zeros(0, dtype=np.int64))
    return _Pieces(
        *(np.concatenate([getattr(c, f) for c in chunks]) for f in ("example", "start", "length", "masked"))
    )


def _group_units(units: np.ndarray | None, groups: np.ndarray, g: int) -> np.ndarray | None:
    """The units (offsets over examples) of group `g`'s examples, counted among them: a unit lies in one group."""
    if units is None or len(units) == len(groups) + 1:
        return None
    sizes = np.diff(units)
    first = groups[units[:-1]]
    if not np.array_equal(np.repeat(first, sizes), groups):
        raise ValueError("a packing unit (preference pair) spans two groups (domains)")
    return offsets_from_lengths(sizes[first == g])
