"""Packed rows materialized from a row plan: the flat token, mask, position, segment and type arrays of fixed-length
rows, read from the examples' values, and their counts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, within_offsets
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
) -> PackedRows:
    """Rows of exactly `row_len` tokens from the planned pieces' tokens, concatenated in plan order (what a
    gather from memory or a read from a spill file returns), padding the rest.

    Padding: the pad id, loss_mask 0, segment 0, position 0, token type 2. Positions restart at 0 at
    every segment; segments are numbered 1..k within a row; each segment's first token and its `masked`
    leading tokens have loss_mask 0.
    """
    index_type = np.int32 if int(plan.length.sum()) < np.iinfo(np.int32).max else np.int64
    return _rows(
        plan,
        token_ids,
        loss_mask.astype(np.uint8, copy=True),
        token_type_ids,
        within_offsets(plan.length, index_type),
        row_len=row_len,
        pad_id=pad_id,
    )


def _rows(
    plan: RowPlan,
    token_ids: np.ndarray,
    kept: np.ndarray,
    token_type_ids: np.ndarray,
    pos: np.ndarray,
    *,
    row_len: int,
    pad_id: int,
) -> PackedRows:
    """`rows_from_values` with the pieces' token positions given and the mask `kept` owned (masked in place)."""
    counts = np.diff(plan.row_offsets)
    lengths = plan.length
    num_rows = plan.num_rows
    seg_ends = offsets_from_lengths(lengths)
    used = seg_ends[plan.row_offsets[1:]] - seg_ends[plan.row_offsets[:-1]]
    if np.any(used > row_len):
        raise ValueError("a row holds more tokens than the row length")
    # Segments fill each row from its start, so the tokens of row r are its first used[r] cells: one boolean
    # grid places every column (numpy's masked assignment, no per-token destination index).
    filled = np.arange(row_len, dtype=np.int32)[None, :] < used[:, None]
    grid = (num_rows, row_len)
    input_ids = np.full(grid, pad_id, dtype=np.int32)
    input_ids[filled] = token_ids
    types = np.full(grid, TYPE_PADDING, dtype=np.uint8)
    types[filled] = token_type_ids
    kept[pos < np.repeat(np.maximum(plan.masked, 1).astype(pos.dtype), lengths)] = 0
    mask = np.zeros(grid, dtype=np.uint8)
    mask[filled] = kept
    positions = np.zeros(grid, dtype=np.int32)
    positions[filled] = pos  # < row_len: fits int32 whatever the index type
    segments = np.zeros(grid, dtype=np.int32)
    segments[filled] = np.repeat(within_offsets(counts, np.int32) + 1, lengths)
    row_loss = mask.sum(axis=1, dtype=np.int64) if num_rows else np.zeros(0)
    input_ids, types, mask, positions, segments = (
        a.reshape(-1) for a in (input_ids, types, mask, positions, segments)
    )
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


@dataclass
class RowCounts:
    """Token counts over packed rows, accumulated chunk by chunk."""

    output: int = 0
    loss: int = 0
    prompt: int = 0

    def add(self, rows: PackedRows) -> None:
        real = rows.segment_ids > 0
        self.output += int(np.count_nonzero(real))
        self.loss += int(rows.loss_mask.sum(dtype=np.int64))
        self.prompt += int(np.count_nonzero(real & (rows.token_type_ids == TYPE_PROMPT)))

    def merge(self, other: RowCounts) -> None:
        self.output, self.loss, self.prompt = (
            self.output + other.output,
            self.loss + other.loss,
            self.prompt + other.prompt,
        )
