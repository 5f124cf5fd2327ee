"""`hdf5`: the packed rows of a split in SambaNova generative_data_prep's (gdp) HDF5 layout, which SambaStudio reads.

Per split, in `<split>/hdf5/`: `<prefix>_<i>_of_<N>.hdf5` (prefix `train`, `dev` for validation, `test`; i from 1),
each holding `input_ids` and `token_type_ids`, int32 `(rows, max_seq_len)`, and a `metadata.yaml` with gdp's
dataset fields. Rows keep the order of the split's Parquet parts and are cut into N contiguous blocks whose sizes
differ by at most one (gdp's `balance_hdf5_files` promise; the first `rows % N` files hold one row more).
N is the number of Parquet parts of the split, ceil(rows / rows_per_file), rows_per_file coming from
`output.max_tokens_per_shard // max_seq_len`: a SambaStudio run needs at least as many training files as
workers, so lower `max_tokens_per_shard` to get more files.

Token types. gdp: 0 prompt, 1 completion, 2 padding, 3 "SEP", the attention boundary it puts on the last token
of each article (a JSONL line), which is the EOS it appends; the EOS it appends to every other prompt/completion
pair of the article is a completion token, 1. Ours (docs/shards.md): 0 prompt, 1 completion, 2 padding, 3 every
EOS, each trained turn's of a dialogue included. The export maps, per segment of a row (an example, or the piece
of one, packed there): the segment's last EOS (our 3) becomes gdp's 3, every earlier EOS of it becomes 1; 0, 1
and 2 are kept. Tokens a chat template renders after the last EOS (ChatML's newline after `<|im_end|>`) keep
their type, so the boundary is the segment's last token where the example ends in its EOS (text, turns) and the
last EOS otherwise. A segment holding no EOS (a window or `full` cut before the example's end) has no boundary,
as gdp's article continuing in the next sequence; a cut segment of a dialogue marks its last turn's EOS.

Rows are written as chunks arrive into one resizable, chunked staging file (memory bounded by a chunk); `close`
renames it when N is 1, else copies it block by block into the N files and removes it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import pyarrow as pa
import yaml

from prep_assets.core.exports import file_entry
from prep_assets.core.record_types import record_type
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS

if TYPE_CHECKING:
    from prep_assets.core.formats import SplitTarget
    from prep_assets.core.rows import PackedRows
    from prep_assets.core.spec import DatasetSpec

HDF5_DIR, METADATA = "hdf5", "metadata.yaml"
GDP_PREFIX = {"train": "train", "validation": "dev", "test": "test"}
DATASETS = ("input_ids", "token_type_ids")
# gdp's metadata.yaml names SambaStudio compares with the model it trains. `tokenizer_model_type` is
# `str(type(model_config))` of the Hugging Face model in gdp; a tokenizer-only pipeline has no model config.
TOKENIZER_MODEL_TYPE = "unknown"
_CHUNK_BYTES = 1 << 20  # HDF5 chunk (and copy block) size target
_STAGING = ".rows.hdf5"


def gdp_token_types(token_type_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """gdp's token types of rows `(n, L)`: the last EOS (3) of each segment stays 3, its earlier EOS become 1."""
    out = token_type_ids.astype(np.int32)
    flat = out.reshape(-1)
    eos = np.flatnonzero(flat == TYPE_EOS)
    # one key per (row, segment); an EOS is its segment's last where the next EOS has another key
    key = (eos // out.shape[1]) * (out.shape[1] + 1) + segment_ids.reshape(-1)[eos]
    earlier = np.zeros(len(eos), dtype=bool)
    earlier[:-1] = key[:-1] == key[1:]
    flat[eos[earlier]] = TYPE_COMPLETION
    return out


def file_names(split: str, n: int) -> list[str]:
    return [f"{GDP_PREFIX[split]}_{i}_of_{n}.hdf5" for i in range(1, n + 1)]


def block_sizes(rows: int, n: int) -> list[int]:
    """Rows per file: contiguous blocks differing by at most one, the larger first (as gdp balances)."""
    base, extra = divmod(rows, n)
    return [base + (i < extra) for i in range(n)]


def _create(f: h5py.File, rows: int, row_len: int) -> None:
    chunk_rows = max(1, _CHUNK_BYTES // (4 * row_len))
    for name in DATASETS:
        f.create_dataset(
            name,
            shape=(rows, row_len),
            maxshape=(None, row_len),
            dtype=np.int32,
            chunks=(chunk_rows, row_len),
            track_times=False,
        )


class Hdf5Rows:
    """A split's packed rows as gdp HDF5 files plus metadata.yaml (module docstring)."""

    def __init__(self, target: SplitTarget) -> None:
        self.target, self.split = target, target.rel.rsplit("/", 1)[-1]
        self.dest = target.dir / HDF5_DIR
        self.dest.mkdir(parents=True, exist_ok=True)
        self.rel = f"{target.rel}/{HDF5_DIR}"
        self.rows = 0
        self.file: h5py.File | None = h5py.File(self.dest / _STAGING, "w", track_order=False)
        _create(self.file, 0, target.row_len)

    def append(self, rows: PackedRows, example_ids: pa.Array) -> None:
        assert self.file is not None
        n, L = rows.num_rows, rows.row_len
        values = {
            "input_ids": rows.input_ids[: n * L].reshape(n, L).astype(np.int32, copy=False),
            "token_type_ids": gdp_token_types(
                rows.token_type_ids[: n * L].reshape(n, L), rows.segment_ids[: n * L].reshape(n, L)
            ),
        }
        for name, block in values.items():
            ds = self.file[name]
            ds.resize(self.rows + n, axis=0)
            ds[self.rows : self.rows + n] = block
        self.rows += n

    def close(self) -> dict[str, Any]:
        if self.file is None:
            raise RuntimeError("hdf5 export closed twice")
        self.file.close()
        self.file = None
        staging = self.dest / _STAGING
        n = max(1, math.ceil(self.rows / self.target.rows_per_file))
        names, sizes = file_names(self.split, n), block_sizes(self.rows, n)
        if n == 1:
            os.replace(staging, self.dest / names[0])
        else:
            self._split_into(staging, names, sizes)
            staging.unlink()
        files = [file_entry(self.dest / name, f"{self.rel}/{name}") for name in names]
        meta = gdp_metadata(self.split, self.target.row_len, self.target.vocab_size, sizes)
        (self.dest / METADATA).write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")
        files.append(file_entry(self.dest / METADATA, f"{self.rel}/{METADATA}"))
        return {"dir": self.rel, "rows": self.rows, "rows_per_file": sizes, "files": files}

    def _split_into(self, staging: Path, names: list[str], sizes: list[int]) -> None:
        """Copy contiguous row blocks of the staging file into the files, a bounded block at a time."""
        step = max(1, _CHUNK_BYTES // (4 * self.target.row_len))
        lo = 0
        with h5py.File(staging, "r") as src:
            for name, size in zip(names, sizes, strict=True):
                with h5py.File(self.dest / name, "w", track_order=False) as out:
                    _create(out, size, self.target.row_len)
                    for a in range(0, size, step):
                        b = min(a + step, size)
                        for ds in DATASETS:
                            out[ds][a:b] = src[ds][lo + a : lo + b]
                lo += size


def gdp_metadata(split: str, row_len: int, vocab_size: int, sizes: list[int]) -> dict[str, Any]:
    """gdp's metadata.yaml fields for a folder holding one split's files (the other splits: 0 files, no batch)."""
    counts = {"train": 0, "validation": 0, "test": 0, split: len(sizes)}
    smallest = min(sizes) if sizes else None
    return {
        "max_seq_length": int(row_len),
        "token_type_ids": True,
        "vocab_size": int(vocab_size),
        "tokenizer_model_type": TOKENIZER_MODEL_TYPE,
        "number_of_training_files": counts["train"],
        "number_of_dev_files": counts["validation"],
        "number_of_test_files": counts["test"],
        "max_batch_size_train": smallest if split == "train" else None,
        "max_batch_size_dev": smallest if split == "validation" else None,
    }


def refuses(spec: DatasetSpec) -> str | None:
    """gdp's files hold independent sequences: no layout for a paired record type (a chosen/rejected pair)."""
    if record_type(spec.input.type).paired:
        return (
            f"gdp's HDF5 layout has no chosen/rejected pair: input.type {spec.input.type} (preference pairs) "
            "cannot be written as hdf5"
        )
    return None
