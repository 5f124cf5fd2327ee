"""Vectorised helpers over flat token arrays with offsets (the columnar form of list columns)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def ranges_index(starts: np.ndarray, lengths: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Flat indices of the ranges [start, start+length) concatenated in order, without a Python loop.

    >>> ranges_index(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=dtype)
    out_starts = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=dtype) - np.repeat(
        (out_starts - np.asarray(starts, dtype=np.int64)).astype(dtype), lengths
    )


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def within_offsets(lengths: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """For each element of the concatenated ranges, its index within its own range (`dtype` must hold the
    total length)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return ranges_index(np.zeros(len(lengths), dtype=np.int64), lengths, dtype)


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 sums of values[offsets[i]:offsets[i+1]] (empty segments sum to 0), one pass over the values.

    >>> segment_sums(np.array([1, 0, 1, 1], dtype=np.uint8), np.array([0, 2, 2, 4])).tolist()
    [1, 0, 2]
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    out = np.zeros(len(lengths), dtype=np.int64)
    some = lengths > 0
    if some.any():  # reduceat gives an empty segment its next value, and refuses an offset at the end
        out[some] = np.add.reduceat(values, offsets[:-1][some], dtype=np.int64)
    return out


def list_array(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def flat_values(column: pa.ChunkedArray | pa.ListArray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column, zero-copy where Arrow allows."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values, dtype=dtype)[offsets[0] : offsets[-1]] if len(arr) else np.zeros(0, dtype=dtype)
    return values, offsets - offsets[0]


def percentiles(values: Any) -> dict[str, float]:
    """A distribution in a few figures: count, min, mean, p50/p90/p99 (lower), max; zeros when empty."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {"count": 0, "min": 0, "mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    q = np.percentile(v, [50, 90, 99], method="lower")
    return {
        "count": int(len(v)),
        "min": int(v.min()),
        "mean": round(float(v.mean()), 2),
        "p50": int(q[0]),
        "p90": int(q[1]),
        "p99": int(q[2]),
        "max": int(v.max()),
    }
