"""Gold tokens spilled to a flat file, so packing a drop never holds the drop's tokens in memory.

One record per token, (token id, loss mask, token type), 6 bytes, in example order. Two ways back:
- `view()`: the file mapped as numpy arrays, for the passes that read it front to back (planning's loss sums,
  the Megatron export), which call `release()` as they go to drop the pages they touched (`FrontToBack`).
- `read(starts, lengths)`: the tokens of a list of pieces, concatenated, with one `pread` per run of adjacent
  pieces (`records`: the same as records, into a buffer the caller reuses chunk after chunk: memory once
  faulted in, not fresh pages for every chunk). Packing gathers pieces from all over the file; through a
  mapping every fault would also map the kernel's fault-around window (64 KB) of cached pages, so one chunk of
  1,024 rows of 4,096 tokens kept ~470 MB of the file resident. Reads copy exactly the bytes asked for.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from prep_assets.core.parquet_io import ClosedOnExit

TOKEN = np.dtype([("id", "<i4"), ("mask", "u1"), ("type", "u1")])


def token_records(token_ids: np.ndarray, loss_mask: np.ndarray, token_type_ids: np.ndarray) -> np.ndarray:
    out = np.empty(len(token_ids), dtype=TOKEN)
    out["id"], out["mask"], out["type"] = token_ids, loss_mask, token_type_ids
    return out


def runs(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pieces merged where one ends exactly where the next starts (in-order strategies read a chunk at once).

    >>> [a.tolist() for a in runs(np.array([0, 5, 9, 20]), np.array([5, 4, 2, 1]))]
    [[0, 20], [11, 1]]
    """
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    if len(starts) == 0:
        return starts, lengths
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] != starts[:-1] + lengths[:-1]
    first = np.flatnonzero(new)
    return starts[first], np.add.reduceat(lengths, first)


class TokenSpill(ClosedOnExit):
    """A spill file of TOKEN records: appended while gold streams in, then mapped and read back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokens = 0
        self._out = path.open("wb")
        self._fd = -1
        self._map: mmap.mmap | None = None

    def append(self, token_ids: np.ndarray, loss_mask: np.ndarray, token_type_ids: np.ndarray) -> None:
        token_records(token_ids, loss_mask, token_type_ids).tofile(self._out)
        self.tokens += len(token_ids)

    def seal(self) -> None:
        """Done appending: open for reading."""
        self._out.close()
        self._fd = os.open(self.path, os.O_RDONLY)
        if self.tokens:
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)

    def view(self) -> np.ndarray:
        """All records, mapped (fields: `id`, `mask`, `type`)."""
        if self._map is None:
            return np.zeros(0, dtype=TOKEN)
        return np.frombuffer(self._map, dtype=TOKEN)

    def front_to_back(self, field: str, equals: int | None = None) -> FrontToBack:
        return FrontToBack(self, field, equals)

    def release(self) -> None:
        """Drop the mapped pages this process touched (they stay in the page cache)."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def read(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token ids, loss mask, token types) of the pieces [start, start + length), concatenated in order."""
        out = self.records(starts, lengths)
        return np.ascontiguousarray(out["id"]), np.ascontiguousarray(out["mask"]), np.ascontiguousarray(out["type"])

    def records(self, starts: np.ndarray, lengths: np.ndarray, buffer: np.ndarray | None = None) -> np.ndarray:
        """The TOKEN records of the pieces [start, start + length), concatenated in order: the front of `buffer`
        (TOKEN records, at least as many as the pieces hold) when given, so a caller reading one chunk after
        another reuses its memory (the next read overwrites it), else a new array."""
        total = int(np.sum(lengths, dtype=np.int64))
        if buffer is None:
            out = np.empty(total, dtype=TOKEN)
        elif buffer.dtype != TOKEN or len(buffer) < total:
            raise ValueError(f"a buffer of {len(buffer)} {buffer.dtype} for {total} TOKEN records")
        else:
            out = buffer[:total]
        buf = memoryview(out).cast("B")
        size, pos = TOKEN.itemsize, 0
        for start, n in zip(*(a.tolist() for a in runs(starts, lengths)), strict=True):
            want, at = n * size, start * size
            while want:
                got = os.preadv(self._fd, [buf[pos : pos + want]], at)
                if got <= 0:
                    raise OSError(f"{self.path}: spill file ends at byte {at}, {want} more bytes expected")
                pos, at, want = pos + got, at + got, want - got
        return out

    def close(self) -> None:
        if not self._out.closed:
            self._out.close()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an array still views it: the mapping goes with the last view
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FrontToBack:
    """One field of a spill file for a pass from front to back (`range_sums`): each slice first drops the pages
    the earlier slices mapped, so the pass holds one slice of the file, not all of it. With `equals`, a slice is
    whether each value equals it (e.g. which tokens are of one type)."""

    def __init__(self, spill: TokenSpill, field: str, equals: int | None = None) -> None:
        self._spill, self._field, self._equals = spill, field, equals

    def __len__(self) -> int:
        return self._spill.tokens

    def __getitem__(self, key: slice) -> np.ndarray:
        self._spill.release()
        values = self._spill.view()[self._field][key]
        return values if self._equals is None else values == self._equals
