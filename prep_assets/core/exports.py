"""Trainer formats beside the Parquet shards: a flat memmap of the packed rows, and Megatron's indexed dataset.

- `npy` (per split): `input_ids.bin` (uint16 when the vocabulary fits, else uint32), `loss_mask.bin` (uint8),
  `position_ids.bin` and `segment_ids.bin` (int32), `token_type_ids.bin` (uint8), each C-order
  `rows x max_seq_len`, and `meta.json` with the shapes and dtypes. Rows are in the order of the split's
  Parquet parts. `numpy.memmap(dir / meta["arrays"][name]["file"], dtype, mode="r", shape=shape)` opens
  them without a copy.
- `megatron` (per split; text, instruction and chat gold, masks not kept): the gold documents of the split in gold
  order as Megatron-LM's `MMIDIDX` indexed dataset, `text_document.bin` + `text_document.idx`, one sequence per
  document.
  The .idx layout: magic `MMIDIDX\\x00\\x00`, version u64 = 1, dtype code u8 (uint16 = 8, int32 = 4),
  sequence count u64, document count u64 (documents + 1), then sequence lengths int32[sequences],
  sequence byte pointers int64[sequences], document indices int64[documents + 1]; all little-endian.
  Token dtype as Megatron picks it: uint16 below a vocabulary of 65,500, else int32.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from prep_assets.core.lake import sha256_file, write_json_atomic
from prep_assets.core.rows import PackedRows

MEMMAP_DIR, MEGATRON_PREFIX = "memmap", "megatron/text_document"
MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
MMIDIDX_VERSION = 1
MEGATRON_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def memmap_token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def megatron_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def file_entry(path: Path, rel: str) -> dict[str, Any]:
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


class MemmapWriter:
    """The packed rows of a split as flat little-endian arrays in `dest` (relative path `rel`) plus meta.json,
    appended chunk by chunk (the same bytes whatever the chunks)."""

    NAMES = ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids")

    def __init__(self, dest: Path, rel: str, row_len: int, vocab_size: int) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        self.dest, self.rel, self.row_len, self.rows = dest, rel, row_len, 0
        self.dtypes = {
            "input_ids": memmap_token_dtype(vocab_size).newbyteorder("<"),
            "loss_mask": np.dtype(np.uint8),
            "position_ids": np.dtype("<i4"),
            "segment_ids": np.dtype("<i4"),
            "token_type_ids": np.dtype(np.uint8),
        }
        self._files = {name: (dest / f"{name}.bin").open("wb") for name in self.NAMES}

    def append(self, rows: PackedRows) -> None:
        for name in self.NAMES:
            getattr(rows, name).astype(self.dtypes[name], copy=False).tofile(self._files[name])
        self.rows += rows.num_rows

    def close(self) -> dict[str, Any]:
        shape = [self.rows, self.row_len]
        meta: dict[str, Any] = {"rows": self.rows, "seq_len": self.row_len, "order": "C", "arrays": {}}
        files = []
        for name, f in self._files.items():
            f.close()
            path = self.dest / f"{name}.bin"
            meta["arrays"][name] = {
                "file": path.name,
                "dtype": self.dtypes[name].newbyteorder("=").name,
                "shape": shape,
            }
            files.append(file_entry(path, f"{self.rel}/{path.name}"))
        write_json_atomic(self.dest / "meta.json", meta)
        files.append(file_entry(self.dest / "meta.json", f"{self.rel}/meta.json"))
        return {"dir": self.rel, "rows": self.rows, "files": files}


def write_memmap(dest: Path, rel: str, rows: PackedRows, vocab_size: int) -> dict[str, Any]:
    """All packed rows of a split at once (see `MemmapWriter`)."""
    writer = MemmapWriter(dest, rel, rows.row_len, vocab_size)
    writer.append(rows)
    return writer.close()


def write_megatron(
    prefix: Path, rel: str, token_ids: np.ndarray | Iterable[np.ndarray], offsets: np.ndarray, vocab_size: int
) -> dict[str, Any]:
    """Documents (token_ids split at `offsets`) as `<prefix>.bin` + `<prefix>.idx` in the MMIDIDX layout.
    `token_ids` may come as consecutive chunks (a spilled split is written without being held in memory)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = megatron_dtype(vocab_size)
    lengths = np.diff(offsets).astype("<i4")
    with open(prefix.with_suffix(".bin"), "wb") as f:
        for chunk in [token_ids] if isinstance(token_ids, np.ndarray) else token_ids:
            chunk.astype(dtype.newbyteorder("<")).tofile(f)
    pointers = (offsets[:-1] * dtype.itemsize).astype("<i8")
    documents = np.arange(len(lengths) + 1, dtype="<i8")  # one sequence per document
    with open(prefix.with_suffix(".idx"), "wb") as f:
        f.write(MMIDIDX_MAGIC)
        f.write(struct.pack("<Q", MMIDIDX_VERSION))
        f.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(documents)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(documents.tobytes(order="C"))
    files = [file_entry(prefix.with_suffix(s), f"{rel}{s}") for s in (".bin", ".idx")]
    return {
        "prefix": rel,
        "documents": int(len(lengths)),
        "tokens": int(offsets[-1] - offsets[0]),
        "dtype": dtype.name,
        "files": files,
    }
