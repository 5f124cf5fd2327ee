"""`gpt_simple`: the gold documents of a split as GPT-Simple's pretokenized shards (`gpt-simple-lm`, `.bin` + `.idx`).

Written from the layout GPT-Simple's `gpt_simple/pretokenize.py` (0.1.2) writes and `gpt_simple/data.py`'s
`PreTokenizedDataset` reads:
- `.bin`: the entries' token ids back to back, little-endian uint16 when the vocabulary has fewer than 65,536
  ids, else uint32.
- `.idx`: magic `GPTS`, then uint32 version (1), dtype code (2 = uint16, 4 = uint32) and entry count n; int64
  token offsets[n + 1] (the last is the token total); uint16 overlap prefix length per entry.

An entry is a document, or a window of a long one. GPT-Simple tokenizes a document without special tokens and
ends it with its EOD token, the tokenizer's EOS. Our document is a gold example: its content is the example's
token ids less one trailing EOS (text gold appends exactly one), so a document never carries two; the EOD is the
pinned tokenizer's EOS. Windows are GPT-Simple's `create_windows` (deterministic variant) with `max_length =
sequence.max_seq_len` and `overlap_size = sequence.overlap`: a content of at least max_length tokens becomes the
windows starting every `max(max_length - overlap, max_length // 2)` tokens while the start is inside the
content, each `max_length` tokens or to the content's end; every window reaching the end gets the EOD, every window
after the first carries `min(overlap, its content tokens)` as overlap prefix (GPT-Simple masks them). Unlike
GPT-Simple's pretokenizer we do not stop after 10,001 windows, and an empty content is kept as a lone EOD.

Files: `<split>/gpt_simple/<partition>-<i>.bin/.idx` (i from 00000), a new file starting before the entry that
would take the current one past `output.max_tokens_per_shard` (rounded down to whole rows): GPT-Simple's trainer
needs at least one file per rank in a bucket, and partition-named files can share one bucket folder.
"""

from __future__ import annotations

import struct
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from prep_assets.core.exports import file_entry
from prep_assets.core.record_types import record_type

if TYPE_CHECKING:
    from prep_assets.core.formats import Documents, SplitTarget
    from prep_assets.core.spec import DatasetSpec

GPTS_DIR = "gpt_simple"
GPTS_MAGIC, GPTS_VERSION = b"GPTS", 1
GPTS_DTYPE_CODES = {np.dtype(np.uint16): 2, np.dtype(np.uint32): 4}
_MAX_OVERLAP = np.iinfo(np.uint16).max  # the .idx holds overlap prefix lengths as uint16
_MAX_ENTRIES = np.iinfo(np.uint32).max  # and the entry count as uint32


def gpts_dtype(vocab_size: int) -> np.dtype:
    """GPT-Simple's token dtype: uint16 below a vocabulary of 65,536 ids, else uint32."""
    return np.dtype(np.uint16) if vocab_size < 1 << 16 else np.dtype(np.uint32)


def windows(content: np.ndarray, max_len: int, overlap: int) -> tuple[np.ndarray, ...]:
    """GPT-Simple's entries of documents with `content` tokens each: per entry (document, start, tokens taken from
    the content, EOD appended, overlap prefix length), in document then window order."""
    stride = max(max_len - overlap, max_len // 2)
    count = np.where(content < max_len, 1, -(-content // stride))
    doc = np.repeat(np.arange(len(content)), count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    start = k * stride
    end = np.minimum(start + max_len, content[doc])
    prefix = np.where((k > 0) & (overlap > 0), np.minimum(overlap, end - start), 0)
    return doc, start, end - start, end >= content[doc], prefix


class _Files:
    """The split's entries appended to `<partition>-<i>.bin`, a new file past `budget` tokens; `.idx` on close."""

    def __init__(self, target: SplitTarget) -> None:
        self.dest, self.rel = target.dir / GPTS_DIR, f"{target.rel}/{GPTS_DIR}"
        self.dest.mkdir(parents=True, exist_ok=True)
        self.stem = target.partition or "part"
        self.dtype = gpts_dtype(target.vocab_size)
        self.budget = target.rows_per_file * target.row_len
        self.names: list[str] = []
        self.bin: IO[bytes] | None = None
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []  # the open file's (entry lengths, overlap prefixes)
        self.fill = 0

    def append(self, tokens: np.ndarray, lengths: np.ndarray, prefixes: np.ndarray) -> None:
        """Entries of `lengths` tokens (consecutive in `tokens`), cut into files at the budget."""
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        i = 0
        while i < len(lengths):
            if self.bin is None:
                self._open()
            # entries [i, j) fit in the current file; an empty file takes at least one entry
            j = int(np.searchsorted(bounds, bounds[i] + self.budget - self.fill, side="right")) - 1
            j = max(j, i + (self.fill == 0))
            if j == i:
                self._close_file()
                continue
            out = self.bin
            assert out is not None
            out.write(tokens[bounds[i] : bounds[j]].astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
            self.parts.append((lengths[i:j], prefixes[i:j]))
            self.fill += int(bounds[j] - bounds[i])
            i = j

    def _open(self) -> None:
        self.names.append(f"{self.stem}-{len(self.names):05d}")
        self.bin = (self.dest / f"{self.names[-1]}.bin").open("wb")
        self.parts, self.fill = [], 0

    def _close_file(self) -> None:
        assert self.bin is not None
        self.bin.close()
        self.bin = None
        lengths = np.concatenate([p[0] for p in self.parts])
        prefixes = np.concatenate([p[1] for p in self.parts])
        if len(lengths) > _MAX_ENTRIES:
            raise ValueError(f"gpt_simple: {len(lengths)} entries exceed the .idx entry count (uint32)")
        with (self.dest / f"{self.names[-1]}.idx").open("wb") as f:
            f.write(GPTS_MAGIC + struct.pack("<III", GPTS_VERSION, GPTS_DTYPE_CODES[self.dtype], len(lengths)))
            f.write(np.concatenate([[0], np.cumsum(lengths)]).astype("<i8").tobytes())
            f.write(prefixes.astype("<u2").tobytes())

    def close(self) -> list[dict[str, Any]]:
        if self.bin is not None:
            self._close_file()
        return [
            file_entry(self.dest / f"{name}{suffix}", f"{self.rel}/{name}{suffix}")
            for name in self.names
            for suffix in (".bin", ".idx")
        ]


def write(target: SplitTarget, docs: Documents) -> dict[str, Any]:
    """The split's gold examples (token ids read front to back, split at the examples' offsets) as GPT-Simple
    shards."""
    if target.eos_id is None:
        raise ValueError("gpt_simple needs the tokenizer's EOS id (its EOD token)")
    eod = target.eos_id
    files = _Files(target)
    stats = {"entries": 0, "windowed_documents": 0, "overlap_tokens": 0, "tokens": 0}
    offsets = docs.offsets
    doc, base = 0, int(offsets[0])
    carry = np.zeros(0, dtype=np.int64)

    def emit(buf: np.ndarray, rel: np.ndarray) -> None:
        """Documents whose tokens are `buf` split at `rel` (offsets into `buf`) as entries."""
        lengths = np.diff(rel)
        ends_eos = (lengths > 0) & (buf[np.maximum(rel[1:] - 1, 0)] == eod) if len(buf) else lengths < 0
        d, start, taken, with_eod, prefix = windows(lengths - ends_eos, target.row_len, target.overlap)
        sizes = taken + with_eod
        out_start = np.cumsum(sizes) - sizes
        pos = np.arange(int(sizes.sum())) - np.repeat(out_start, sizes)
        src = np.repeat(rel[:-1][d] + start, sizes) + pos
        tokens = buf[np.minimum(src, max(len(buf) - 1, 0))] if len(buf) else np.zeros(len(src), np.int64)
        tokens[(out_start + taken)[with_eod]] = eod
        files.append(tokens, sizes, prefix)
        stats["entries"] += len(sizes)
        stats["windowed_documents"] += int(np.count_nonzero(np.bincount(d, minlength=len(lengths)) > 1))
        stats["overlap_tokens"] += int(prefix.sum())
        stats["tokens"] += int(sizes.sum())

    for chunk in docs.id_chunks():
        buf = np.concatenate([carry, chunk]) if len(carry) else chunk
        hi = int(np.searchsorted(offsets, base + len(buf), side="right")) - 1  # documents [doc, hi) are whole
        if hi > doc:
            emit(buf, offsets[doc : hi + 1] - base)
            doc = hi
        carry, base = np.array(buf[int(offsets[doc]) - base :]), int(offsets[doc])
    if doc < len(offsets) - 1:
        emit(carry, offsets[doc:] - base)
    return {
        "dir": files.rel,
        "documents": len(offsets) - 1,
        **stats,
        "eod_id": eod,
        "dtype": files.dtype.name,
        "files": files.close(),
    }


def refuses(spec: DatasetSpec) -> str | None:
    """GPT-Simple trains on every token but the overlap prefixes and the token after each EOD: it has no loss mask,
    so it takes documents all of whose tokens train (text), never pairs, table rows or masked prompts."""
    kind = record_type(spec.input.type)
    if kind.paired:
        return f"GPT-Simple's shards hold single documents: input.type {spec.input.type} (preference pairs) cannot"
    if kind.shape != "text":
        return (
            f"GPT-Simple's shards have no loss mask: input.type {spec.input.type} has masked tokens (prompts, "
            "schema or non-assistant turns) a GPT-Simple run would train on; use parquet, npy or hdf5"
        )
    masked = sorted(k for k in spec.mask_keys if spec.mask_action(k) != "train")
    if masked:
        return f"GPT-Simple's shards have no loss mask: mask {masked} would be trained on"
    if spec.sequence.overlap > _MAX_OVERLAP:
        return f"sequence.overlap {spec.sequence.overlap} exceeds the .idx overlap field (uint16, {_MAX_OVERLAP})"
    return None
