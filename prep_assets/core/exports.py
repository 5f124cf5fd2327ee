"""Trainer formats beside the Parquet shards: a flat memmap of the packed rows, and Megatron's indexed dataset.

- `npy` (per split): `input_ids.bin` (uint16 when the vocabulary fits, else uint32), `loss_mask.bin` (uint8),
  `position_ids.bin` and `segment_ids.bin` (int32), `token_type_ids.bin` (uint8), each C-order
  `rows x max_seq_len`, and `meta.json` with the shapes and dtypes. Rows are in the order of the split's
  Parquet parts. `numpy.memmap(dir / meta["arrays"][name]["file"], dtype, mode="r", shape=shape)` opens
  them without a copy.
- `megatron` (per split, `text` datasets): the gold documents of the split in gold order as Megatron-LM's
  `MMIDIDX` indexed dataset, `text_document.bin` + `text_document.idx`, one sequence per document.
  The .idx layout: magic `MMIDIDX\\x00\\x00`, version u64 = 1, dtype code u8 (uint16 = 8, int32 = 4),
  sequence count u64, document count u64 (documents + 1), then sequence lengths int32[sequences],
  sequence byte pointers int64[sequences], document indices int64[documents + 1]; all little-endian.
  Token dtype as Megatron picks it: uint16 below a vocabulary of 65,500, else int32.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from prep_assets.core.lake import sha256_file, write_json_atomic
from prep_assets.core.packing import PackedRows

MEMMAP_DIR, MEGATRON_PREFIX = "memmap", "megatron/text_document"
MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
MMIDIDX_VERSION = 1
MEGATRON_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def memmap_token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def megatron_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def _file_entry(path: Path, rel: str) -> dict[str, Any]:
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_memmap(dest: Path, rel: str, rows: PackedRows, vocab_size: int) -> dict[str, Any]:
    """The packed rows as flat little-endian arrays in `dest` (relative path `rel`) plus meta.json."""
    dest.mkdir(parents=True, exist_ok=True)
    shape = [rows.num_rows, rows.row_len]
    arrays = {
        "input_ids": rows.input_ids.astype(memmap_token_dtype(vocab_size).newbyteorder("<")),
        "loss_mask": rows.loss_mask,
        "position_ids": rows.position_ids.astype("<i4"),
        "segment_ids": rows.segment_ids.astype("<i4"),
        "token_type_ids": rows.token_type_ids,
    }
    meta: dict[str, Any] = {"rows": rows.num_rows, "seq_len": rows.row_len, "order": "C", "arrays": {}}
    files = []
    for name, values in arrays.items():
        path = dest / f"{name}.bin"
        values.tofile(path)
        meta["arrays"][name] = {"file": path.name, "dtype": np.dtype(values.dtype).newbyteorder("=").name,
                                "shape": shape}
        files.append(_file_entry(path, f"{rel}/{path.name}"))
    write_json_atomic(dest / "meta.json", meta)
    files.append(_file_entry(dest / "meta.json", f"{rel}/meta.json"))
    return {"dir": rel, "rows": rows.num_rows, "files": files}


def write_megatron(prefix: Path, rel: str, token_ids: np.ndarray, offsets: np.ndarray, vocab_size: int) -> dict[str, Any]:
    """Documents (token_ids split at `offsets`) as `<prefix>.bin` + `<prefix>.idx` in the MMIDIDX layout."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = megatron_dtype(vocab_size)
    lengths = np.diff(offsets).astype("<i4")
    token_ids.astype(dtype.newbyteorder("<")).tofile(prefix.with_suffix(".bin"))
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
    files = [_file_entry(prefix.with_suffix(s), f"{rel}{s}") for s in (".bin", ".idx")]
    return {"prefix": rel, "documents": int(len(lengths)), "tokens": int(offsets[-1] - offsets[0]),
            "dtype": dtype.name, "files": files}
