"""Packed rows materialized from a row plan: the flat token, mask, position, segment and type arrays of fixed-length
rows, read from the examples' values, and their counts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, ranges_index, within_offsets
from prep_assets.core.packing import RowPlan
from prep_assets.core.records import TYPE_PADDING, TYPE_PROMPT


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
    example_order: np.ndarray  # example index per segment (aligned with seg_lengths)
    seg_starts: np.ndarray  # int32 per segment: offset of its first token within its example
    num_loss_tokens: np.ndarray  # int32 per row

    @property
    def num_rows(self) -> int:
        return len(self.seg_offsets) - 1

    @cached_property
    def token_counts(self) -> tuple[int, int, int]:
        """(tokens, loss tokens, prompt tokens) of the rows, padding not counted: counted once however many
        sinks (`RowCounts`) add these rows."""
        real = self.segment_ids != 0
        prompt = np.count_nonzero(real & (self.token_type_ids == TYPE_PROMPT))
        return int(np.count_nonzero(real)), int(self.loss_mask.sum(dtype=np.int64)), int(prompt)


def segment_sources(plan: RowPlan, offsets: np.ndarray) -> np.ndarray:
    """Where each planned piece starts in the flat token arrays of its examples (`offsets`)."""
    return offsets[plan.example] + plan.start


def materialize_rows(
    plan: RowPlan,
    *,
    token_ids: np.ndarray,
    loss_mask: np.ndarray,
    token_type_ids: np.ndarray,
    offsets: np.ndarray,
    row_len: int,
    pad_id: int,
) -> PackedRows:
    """Gather the planned pieces from in-memory arrays into rows of exactly `row_len` tokens (`rows_from_values`)."""
    index_type = np.int32 if len(token_ids) < np.iinfo(np.int32).max else np.int64
    src = np.repeat(segment_sources(plan, offsets).astype(index_type), plan.length)
    src += within_offsets(plan.length, index_type)
    values = token_ids[src], loss_mask[src], token_type_ids[src]
    return rows_from_values(plan, *values, row_len=row_len, pad_id=pad_id)


def rows_from_values(
    plan: RowPlan,
    token_ids: np.ndarray,
    loss_mask: np.ndarray,
    token_type_ids: np.ndarray,
    *,
    row_len: int,
    pad_id: int,
    grids: GridMemory | None = None,
) -> PackedRows:
    """Rows of exactly `row_len` tokens from the planned pieces' tokens, concatenated in plan order (what a
    gather from memory or a read from a spill file returns), padding the rest. The five token columns are made
    in `grids` when given (a writer building one chunk after another), else in new arrays.

    Padding: the pad id, loss_mask 0, segment 0, position 0, token type 2. Positions restart at 0 at
    every segment; segments are numbered 1..k within a row; each segment's first token and its `masked`
    leading tokens have loss_mask 0.
    """
    lengths = plan.length
    num_rows = plan.num_rows
    if len(lengths) and int(lengths.min()) < 1:
        raise ValueError("a planned piece holds no token")
    seg_ends = offsets_from_lengths(lengths)
    row_starts = seg_ends[plan.row_offsets]  # where each row's tokens start among the values
    used = np.diff(row_starts)
    if np.any(used > row_len):
        raise ValueError("a row holds more tokens than the row length")
    grids = grids if grids is not None else GridMemory(keep=False)
    layout = _Layout(used, row_len, grids)
    # Segments fill each row from its start: a segment's first token is at this cell of the flat grid
    row = np.repeat(np.arange(num_rows, dtype=np.int64), np.diff(plan.row_offsets))
    first = seg_ends[:-1] - row_starts[:-1][row] + row * row_len
    opens = np.ones(len(lengths), dtype=bool)  # the segment opens its row
    opens[1:] = row[1:] != row[:-1]
    input_ids = layout.place(token_ids, pad_id, np.int32)
    types = layout.place(token_type_ids, TYPE_PADDING, np.uint8)
    mask = layout.place(loss_mask, 0, np.uint8)
    mask[first] = 0
    masked = np.minimum(plan.masked, lengths)
    more = masked > 1
    if more.any():
        mask[ranges_index(first[more], masked[more])] = 0
    # Positions and segment numbers as running sums along each row: +1 a token, a segment's first token steps
    # back to 0 (positions) or up by one (segments); the sums run on through padding, which is then cleared.
    positions = grids.empty(num_rows * row_len, np.int32)
    positions.fill(1)
    positions[first] = np.where(opens, 0, 1 - np.concatenate([[1], lengths[:-1]]))
    segments = grids.empty(num_rows * row_len, np.int32)
    segments.fill(0)
    segments[first] = 1
    for grid in (positions, segments):
        np.cumsum(grid.reshape(num_rows, row_len), axis=1, out=grid.reshape(num_rows, row_len))
        layout.clear_padding(grid)
    row_loss = mask.reshape(num_rows, row_len).sum(axis=1, dtype=np.int64) if num_rows else np.zeros(0)
    return PackedRows(
        row_len=row_len,
        input_ids=input_ids,
        loss_mask=mask,
        position_ids=positions,
        segment_ids=segments,
        token_type_ids=types,
        seg_lengths=lengths.astype(np.int32),
        seg_offsets=plan.row_offsets.astype(np.int64),
        example_order=plan.example,
        seg_starts=plan.start.astype(np.int32),
        num_loss_tokens=row_loss.astype(np.int32),
    )


class GridMemory:
    """Memory for the grids of one chunk of rows after another. A chunk's grids (60 MB for 1,024 rows of 4,096)
    reuse the memory of an earlier chunk's once nothing holds an array made from it any more (the Parquet writer
    lets go of a chunk's columns once it has written them), rather than fault in fresh pages for every chunk.
    CPython's reference count tells: every array viewing a buffer, however derived, holds the buffer itself.
    `keep=False`: every request is new memory (one-off rows)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self._buffers: list[np.ndarray] = []

    def empty(self, size: int, dtype: type) -> np.ndarray:
        """An uninitialized flat array of `size` values: the smallest kept buffer no array uses any more that
        holds it and is at most twice its size (a mask's grid does not take an id grid's memory), else a new
        buffer, kept for later requests, once the kept buffers nothing uses are let go."""
        nbytes = size * np.dtype(dtype).itemsize
        if not self.keep:
            return np.empty(size, dtype=dtype)
        free = [
            i for i in range(len(self._buffers)) if nbytes <= len(self._buffers[i]) <= 2 * nbytes and self._unused(i)
        ]
        if free:
            buffer = self._buffers[min(free, key=lambda i: len(self._buffers[i]))]
        else:  # the unused buffers do not fit (a last, shorter chunk): their memory goes before new memory comes
            used = [i for i in range(len(self._buffers)) if not self._unused(i)]
            self._buffers = [self._buffers[i] for i in used]
            buffer = np.empty(nbytes, dtype=np.uint8)
            self._buffers.append(buffer)
        return buffer[:nbytes].view(dtype)

    def _unused(self, i: int) -> bool:
        return sys.getrefcount(self._buffers[i]) == _UNUSED_REFS

    def release(self) -> None:
        """Let go of every kept buffer (arrays still using one keep it alive)."""
        self._buffers = []


# References to a kept buffer nothing else uses: the list holding it and getrefcount's own argument
_UNUSED_REFS = 2


# Cells a padded row may hold for its padding to be written row by row rather than by one mask over the grid: a
# slice copy costs about a microsecond, a masked copy about a nanosecond per cell of the whole grid.
_ROW_COPY_CELLS = 2048


class _Layout:
    """Where a chunk's tokens go in its (rows, row_len) grid: the first `used[r]` cells of row r, in order, then
    padding. Rows that are full (nearly all of them with best-fit packing) run together in the values as in the
    grid, so each padded row ends one contiguous copy; with many padded rows (short rows, one example per row),
    one boolean mask over the grid places every column instead."""

    def __init__(self, used: np.ndarray, row_len: int, grids: GridMemory) -> None:
        self.row_len, self.grids = row_len, grids
        self.num_rows = len(used)
        self.padded = np.flatnonzero(used < row_len)
        self.padded_used = used[self.padded]
        self.filled: np.ndarray | None = None
        if len(self.padded) * _ROW_COPY_CELLS > self.num_rows * row_len:
            self.filled = np.arange(row_len, dtype=np.int32)[None, :] < used[:, None]

    def place(self, values: np.ndarray, pad: int, dtype: type) -> np.ndarray:
        """The flat grid of `values` (the rows' tokens, concatenated) with `pad` after each row's tokens."""
        L = self.row_len
        if self.filled is not None:
            out = self.grids.empty(self.num_rows * L, dtype)
            out.fill(pad)
            out.reshape(self.num_rows, L)[self.filled] = values
            return out
        out = self.grids.empty(self.num_rows * L, dtype)
        row = src = 0  # the first row not written yet; where its tokens start among the values
        for r, u in zip(self.padded.tolist(), self.padded_used.tolist(), strict=True):
            cells = (r - row) * L + u  # the full rows before row r, then row r's tokens
            out[row * L : row * L + cells] = values[src : src + cells]
            out[row * L + cells : (r + 1) * L] = pad
            row, src = r + 1, src + cells
        out[row * L :] = values[src:]
        return out

    def clear_padding(self, grid: np.ndarray) -> None:
        """Zero the padding cells of a flat grid."""
        L = self.row_len
        if self.filled is not None:
            np.copyto(grid.reshape(self.num_rows, L), 0, where=~self.filled)
            return
        for r, u in zip(self.padded.tolist(), self.padded_used.tolist(), strict=True):
            grid[r * L + u : (r + 1) * L] = 0


@dataclass
class RowCounts:
    """Token counts over packed rows, accumulated chunk by chunk."""

    output: int = 0
    loss: int = 0
    prompt: int = 0

    def add(self, rows: PackedRows) -> None:
        output, loss, prompt = rows.token_counts
        self.output, self.loss, self.prompt = self.output + output, self.loss + loss, self.prompt + prompt

    def merge(self, other: RowCounts) -> None:
        self.output, self.loss, self.prompt = (
            self.output + other.output,
            self.loss + other.loss,
            self.prompt + other.prompt,
        )
