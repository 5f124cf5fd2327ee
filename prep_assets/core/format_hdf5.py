"""`hdf5`: a drop's packed rows as one SambaNova generative_data_prep (gdp) output folder, which SambaStudio reads.

In `shards/<drop>/hdf5/`, as gdp lays out its output directory: `<prefix>_<i>_of_<N>.hdf5` per split (prefix
`train`, `dev` for validation, `test`; i from 1), each holding `input_ids` and `token_type_ids` (and
`category_ids` with `output.categories`), int32 `(rows, max_seq_len)`; one `metadata.yaml` over all splits; a
`tokenizer/` copy of the pinned tokenizer; with `output.hdf5_test_jsonl` the test split as gdp keeps it,
untokenized JSONL in `test_files/`; with categories gdp's `category_to_id.json`. The split files are written by
`Hdf5Rows` (one split at a time), the rest by `finish` once every split is written (docs/formats.md).

Rows keep the order of the split's Parquet parts and are cut into N contiguous blocks whose sizes differ by at
most one (gdp's `balance_hdf5_files` promise; the first `rows % N` files hold one row more). N is
`output.num_training_splits` for train, `output.num_dev_splits` for dev and `output.num_test_splits` for test
(gdp's flags; a split with fewer rows than its N is a drop error, as gdp refuses more files than lines; with
`output.hdf5_test_jsonl`, N test JSONL files of the test records), else the number of Parquet parts of the split,
ceil(rows / rows_per_file), rows_per_file coming from `output.max_tokens_per_shard // max_seq_len`: a SambaStudio
run needs at least as many training files as workers.

Token types. gdp: 0 prompt, 1 completion, 2 padding, 3 "SEP", the attention boundary it puts on the last token
of each article (a JSONL line), which is the EOS it appends; the EOS it appends to every other prompt/completion
pair of the article is a completion token, 1 (with `--attention_boundary prompt_completion_pair` every pair's EOS
is a 3, which the export keeps; under packing_boundary prompt_completion_pair with attention_boundary jsonl, gold
types the EOS of a record's earlier pairs 1 already). Ours (docs/shards.md): 0 prompt, 1 completion, 2 padding, 3 every
EOS, each trained turn's of a dialogue included. The export maps, per segment of a row (an example, or the piece
of one, packed there): the segment's last EOS (our 3) becomes gdp's 3, every earlier EOS of it becomes 1; 0, 1
and 2 are kept. Tokens a chat template renders after the last EOS (ChatML's newline after `<|im_end|>`) keep
their type, so the boundary is the segment's last token where the example ends in its EOS (text, turns) and the
last EOS otherwise. A segment holding no EOS (a window or `full` cut before the example's end) has no boundary,
as gdp's article continuing in the next sequence; a cut segment of a dialogue marks its last turn's EOS. Then the
loss mask decides what gdp's trainer trains (1 and 3): a trained 0 becomes 1, an untrained 1 (a window's overlap)
becomes 0, a segment's first token keeps its type (`gdp_token_types`).

Rows are written as chunks arrive into one resizable, chunked staging file per split (memory bounded by a chunk);
`close` renames it when N is 1, else copies it block by block into the N files and removes it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from prep_assets.core.errors import DropError
from prep_assets.core.exports import file_entry
from prep_assets.core.parquet_io import iter_batches
from prep_assets.core.record_types import record_type
from prep_assets.core.records import CATEGORY, TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT
from prep_assets.core.tokenizer import is_tokenizer_file

if TYPE_CHECKING:
    from prep_assets.core.formats import PartitionTarget, SplitTarget
    from prep_assets.core.rows import PackedRows
    from prep_assets.core.spec import DatasetSpec

HDF5_DIR, METADATA, TOKENIZER_DIR, TEST_DIR = "hdf5", "metadata.yaml", "tokenizer", "test_files"
CATEGORY_FILE = "category_to_id.json"  # gdp writes its --categories_path list as {name: id} here
GDP_PREFIX = {"train": "train", "validation": "dev", "test": "test"}
DATASETS = ("input_ids", "token_type_ids")
CATEGORY_IDS = "category_ids"  # the dataset name gdp's HDF5 writer and balancer use
NO_CATEGORY = -1  # gdp's category id of padding and of a line naming no category
# gdp's metadata.yaml names SambaStudio compares with the model it trains. `tokenizer_model_type` is
# `str(type(model_config))` of the Hugging Face model in gdp; a tokenizer-only pipeline has none unless the spec
# gives `output.hdf5_model_type`.
TOKENIZER_MODEL_TYPE = "unknown"
_CHUNK_BYTES = 1 << 20  # HDF5 chunk (and copy block) size target
_STAGING = ".rows.hdf5"
_TEST_SHAPES = ("text", "turns")  # record shapes gdp's prompt/completion JSONL can hold
# the output keys of gdp's file counts per split (gdp's --num_training_splits, --num_dev_splits, --num_test_splits)
_NUM_FILES_KEY = {"train": "num_training_splits", "validation": "num_dev_splits", "test": "num_test_splits"}


def gdp_token_types(
    token_type_ids: np.ndarray, segment_ids: np.ndarray, loss_mask: np.ndarray, per_pair: bool = False
) -> np.ndarray:
    """gdp's token types of rows `(n, L)`: the last EOS (3) of each segment stays 3, its earlier EOS become 1;
    with `per_pair` (gdp's attention_boundary prompt_completion_pair) every EOS stays 3. Then the loss mask
    decides what gdp's trainer trains (types 1 and 3; 0 is left out under gdp's `prompt_loss_weight` 0): a
    trained prompt token (`mask: {prompt: train}`) becomes 1, an untrained 1 (a window's overlap, a weight-0
    turn) becomes 0, except a segment's first token, which no row trains and gdp types as its text."""
    out = token_type_ids.astype(np.int32)
    flat = out.reshape(-1)
    if not per_pair:
        eos = np.flatnonzero(flat == TYPE_EOS)
        # one key per (row, segment); an EOS is its segment's last where the next EOS has another key
        key = (eos // out.shape[1]) * (out.shape[1] + 1) + segment_ids.reshape(-1)[eos]
        earlier = np.zeros(len(eos), dtype=bool)
        earlier[:-1] = key[:-1] == key[1:]
        flat[eos[earlier]] = TYPE_COMPLETION
    trained = loss_mask.reshape(-1) != 0
    segments = segment_ids.reshape(-1)
    first = np.ones(len(flat), dtype=bool)  # each row's and each segment's first token
    first[1:] = segments[1:] != segments[:-1]
    first[:: out.shape[1]] = True
    flat[trained & (flat == TYPE_PROMPT)] = TYPE_COMPLETION
    flat[~trained & ~first & (flat == TYPE_COMPLETION)] = TYPE_PROMPT
    return out


def category_map(spec: DatasetSpec | None) -> dict[str, int] | None:
    """gdp's category ids (the list's positions) of `input.categories` or `output.categories`; None without."""
    names = None if spec is None else spec.input.categories or spec.output.categories
    return None if names is None else {name: i for i, name in enumerate(names)}


def category_of(domain: str | None, ids: dict[str, int]) -> int:
    """A record's category id: -1 when it names no domain (gdp: no `category` key), an error when not listed."""
    if domain is None:
        return NO_CATEGORY
    if domain not in ids:
        raise DropError(f"hdf5: domain {domain!r} is not in output.categories {list(ids)}")
    return ids[domain]


def row_categories(rows: PackedRows, per_example: Sequence[int]) -> np.ndarray:
    """Per token of rows `(n, L)`: its example's category id (gdp's layout), -1 on padding."""
    n, L = rows.num_rows, rows.row_len
    per_segment = np.array([per_example[e] for e in rows.example_order], dtype=np.int32).reshape(-1)
    segments = rows.segment_ids[: n * L].reshape(n, L).astype(np.int64)
    index = rows.seg_offsets[:n, None] + segments - 1  # the segment's index in the chunk (padding: segment 0)
    out = np.full((n, L), NO_CATEGORY, dtype=np.int32)
    out[segments > 0] = per_segment[index[segments > 0]]
    return out


def file_names(split: str, n: int, ext: str = "hdf5") -> list[str]:
    return [f"{GDP_PREFIX[split]}_{i}_of_{n}.{ext}" for i in range(1, n + 1)]


def block_sizes(rows: int, n: int) -> list[int]:
    """Rows per file: contiguous blocks differing by at most one, the larger first (as gdp balances)."""
    base, extra = divmod(rows, n)
    return [base + (i < extra) for i in range(n)]


def _create(f: h5py.File, rows: int, row_len: int, names: Sequence[str]) -> None:
    chunk_rows = max(1, _CHUNK_BYTES // (4 * row_len))
    for name in names:
        f.create_dataset(
            name,
            shape=(rows, row_len),
            maxshape=(None, row_len),
            dtype=np.int32,
            chunks=(chunk_rows, row_len),
            track_times=False,
        )


class Hdf5Rows:
    """A split's packed rows as gdp HDF5 files in the drop's `hdf5/` folder (module docstring). With
    `output.hdf5_test_jsonl` the test split only counts its rows: `finish` writes its records as JSONL."""

    def __init__(self, target: SplitTarget) -> None:
        self.target, self.split = target, target.rel.rsplit("/", 1)[-1]
        self.dest = target.dir.parent / HDF5_DIR
        self.categories = category_map(target.spec)
        self.names = DATASETS + ((CATEGORY_IDS,) if self.categories is not None else ())
        spec = target.spec
        self.per_pair = spec is not None and spec.packing.attention_boundary == "prompt_completion_pair"
        self.rows = 0
        self._domain_ids: list[int] | None = None
        self.file: h5py.File | None = None
        self.as_jsonl = self.split == "test" and target.spec is not None and target.spec.output.hdf5_test_jsonl
        if not self.as_jsonl:
            self.dest.mkdir(exist_ok=True)
            self.file = h5py.File(self.dest / f".{self.split}{_STAGING}", "w", track_order=False)
            _create(self.file, 0, target.row_len, self.names)

    def append(self, rows: PackedRows, example_ids: pa.Array) -> None:
        n, L = rows.num_rows, rows.row_len
        if self.as_jsonl:
            self.rows += n
            return
        assert self.file is not None
        values = {
            "input_ids": rows.input_ids[: n * L].reshape(n, L).astype(np.int32, copy=False),
            "token_type_ids": gdp_token_types(
                rows.token_type_ids[: n * L].reshape(n, L),
                rows.segment_ids[: n * L].reshape(n, L),
                rows.loss_mask[: n * L].reshape(n, L),
                self.per_pair,
            ),
        }
        if self.categories is not None:
            values[CATEGORY_IDS] = row_categories(rows, self.example_categories())
        for name, block in values.items():
            ds = self.file[name]
            ds.resize(self.rows + n, axis=0)
            ds[self.rows : self.rows + n] = block
        self.rows += n

    def example_categories(self) -> Sequence[int]:
        """Each example's category id: gold's `category_id` (`input.categories`), else its domain's."""
        if self.target.categories is not None:
            return self.target.categories
        assert self.categories is not None
        if self._domain_ids is None:
            self._domain_ids = [category_of(d, self.categories) for d in self.target.domains]
        return self._domain_ids

    def num_files(self) -> int:
        """How many files the split's rows are cut into: the spec's gdp count, else one per Parquet part. With
        `hdf5_test_jsonl` the test split's count is of JSONL files, checked against its records by `finish`."""
        output = self.target.spec.output if self.target.spec is not None else None
        key = _NUM_FILES_KEY[self.split]
        asked = getattr(output, key) if output is not None else None
        if asked is None:
            return max(1, math.ceil(self.rows / self.target.rows_per_file))
        if self.as_jsonl:
            return asked
        _require_rows(self.split, asked, self.rows)
        return asked

    def close(self) -> dict[str, Any]:
        n = self.num_files()
        if self.as_jsonl:  # the number of files `finish` cuts the test records into, as many as Parquet parts
            return {"dir": HDF5_DIR, "rows": self.rows, "test_jsonl_files": n, "files": []}
        if self.file is None:
            raise RuntimeError("hdf5 export closed twice")
        self.file.close()
        self.file = None
        staging = self.dest / f".{self.split}{_STAGING}"
        names, sizes = file_names(self.split, n), block_sizes(self.rows, n)
        if n == 1:
            os.replace(staging, self.dest / names[0])
        else:
            self._split_into(staging, names, sizes)
            staging.unlink()
        files = [file_entry(self.dest / name, f"{HDF5_DIR}/{name}") for name in names]
        return {"dir": HDF5_DIR, "rows": self.rows, "rows_per_file": sizes, "files": files}

    def _split_into(self, staging: Path, names: list[str], sizes: list[int]) -> None:
        """Copy contiguous row blocks of the staging file into the files, a bounded block at a time."""
        step = max(1, _CHUNK_BYTES // (4 * self.target.row_len))
        lo = 0
        with h5py.File(staging, "r") as src:
            for name, size in zip(names, sizes, strict=True):
                with h5py.File(self.dest / name, "w", track_order=False) as out:
                    _create(out, size, self.target.row_len, self.names)
                    for a in range(0, size, step):
                        b = min(a + step, size)
                        for ds in self.names:
                            out[ds][a:b] = src[ds][lo + a : lo + b]
                lo += size


def _require_rows(split: str, asked: int, rows: int) -> None:
    """A DropError when the spec asks for more files of `split` than it has rows (a file would be empty)."""
    if rows < asked:
        key = _NUM_FILES_KEY[split]
        raise DropError(
            f"hdf5: output.{key} asks for {asked} {GDP_PREFIX[split]} files, but the drop's {split} split has {rows} "
            f"rows: a file would be empty; lower output.{key} or leave it unset"
        )


def finish(target: PartitionTarget, entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The drop's gdp folder completed once every split is written: the test JSONL (when asked), the tokenizer
    copy, category_to_id.json (with categories) and the one metadata.yaml; returns their manifest entry. A split
    of no rows has no sink: the files asked of it are checked here."""
    dest = target.dir / HDF5_DIR
    dest.mkdir(exist_ok=True)
    output = target.spec.output
    for split, key in _NUM_FILES_KEY.items():
        asked = getattr(output, key)
        if asked is not None and split not in entries and not (split == "test" and output.hdf5_test_jsonl):
            _require_rows(split, asked, 0)
    files: list[dict[str, Any]] = []
    sizes = {s: e.get("rows_per_file", []) for s, e in entries.items()}
    if output.hdf5_test_jsonl:
        files += _write_test_jsonl(target, entries.get("test", {}).get("test_jsonl_files", 1))
        sizes["test"] = [0] * len(files)
    files += _copy_tokenizer(target.tokenizer_dir, dest / TOKENIZER_DIR)
    if (ids := category_map(target.spec)) is not None:
        (dest / CATEGORY_FILE).write_text(json.dumps(ids), encoding="utf-8")
        files.append(file_entry(dest / CATEGORY_FILE, f"{HDF5_DIR}/{CATEGORY_FILE}"))
    meta = gdp_metadata(target.row_len, target.vocab_size, sizes, output.hdf5_model_type or TOKENIZER_MODEL_TYPE)
    (dest / METADATA).write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")
    files.append(file_entry(dest / METADATA, f"{HDF5_DIR}/{METADATA}"))
    return {"dir": HDF5_DIR, "files": files}


def _copy_tokenizer(src: Path, dest: Path) -> list[dict[str, Any]]:
    """The pinned tokenizer's files copied beside the data (gdp saves its tokenizer in `tokenizer/`)."""
    dest.mkdir()
    out = []
    for path in sorted(p for p in src.iterdir() if p.is_file() and is_tokenizer_file(p.name)):
        shutil.copyfile(path, dest / path.name)
        out.append(file_entry(dest / path.name, f"{HDF5_DIR}/{TOKENIZER_DIR}/{path.name}"))
    return out


def gdp_record(content: dict[str, Any], category: str | None) -> dict[str, Any] | list[dict[str, Any]]:
    """A normalized record as a line of gdp's input JSONL: `{"prompt", "completion"}`, a list of them for a
    dialogue (one gdp article), text as a completion with an empty prompt; `category` on each pair when given."""
    pairs = [{"prompt": "", "completion": content["text"]}] if "text" in content else list(content["turns"])
    if category is not None:
        pairs = [{**p, "category": category} for p in pairs]
    return pairs[0] if len(pairs) == 1 else pairs


def _test_records(silver: Path) -> Iterator[tuple[str, str | None]]:
    """The partition's test records in silver order: (content JSON, domain)."""
    for batch in iter_batches(silver, batch_size=4096, columns=["content", "split", "domain"]):
        sub = batch.filter(pc.equal(batch.column("split"), "test"))
        yield from zip(sub.column("content").to_pylist(), sub.column("domain").to_pylist(), strict=True)


def _write_test_jsonl(target: PartitionTarget, n: int) -> list[dict[str, Any]]:
    """The test split's records as gdp keeps them, `test_files/test_<i>_of_<N>.jsonl`, N contiguous blocks."""
    if target.silver_records is None:
        raise DropError("hdf5: output.hdf5_test_jsonl needs the partition's silver records")
    total = sum(1 for _ in _test_records(target.silver_records))
    asked = target.spec.output.num_test_splits
    if asked is not None and total < asked:
        raise DropError(
            f"hdf5: output.num_test_splits asks for {asked} test files, but the drop's test split has {total} "
            "records: a file would be empty; lower output.num_test_splits or leave it unset"
        )
    if total == 0:
        return []
    ids = category_map(target.spec)
    dest = target.dir / HDF5_DIR / TEST_DIR
    dest.mkdir()
    names = file_names("test", min(max(1, n), total), "jsonl")
    records = _test_records(target.silver_records)
    for name, size in zip(names, block_sizes(total, len(names)), strict=True):
        with open(dest / name, "w", encoding="utf-8", newline="\n") as f:
            for _ in range(size):
                content, domain = next(records)
                record = json.loads(content)
                listed = target.spec.input.categories
                if listed is not None:  # gdp's category as the record named it
                    domain = listed[record[CATEGORY]] if CATEGORY in record else None
                elif ids is not None:
                    category_of(domain, ids)  # a domain missing from the list is an error, as in the rows
                line = gdp_record(record, domain if ids is not None else None)
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return [file_entry(dest / name, f"{HDF5_DIR}/{TEST_DIR}/{name}") for name in names]


def gdp_metadata(row_len: int, vocab_size: int, sizes: dict[str, list[int]], model_type: str) -> dict[str, Any]:
    """gdp's metadata.yaml fields (its `DatasetMetadata`) over the folder's splits: `sizes` holds the rows per file
    of each split. gdp types max_batch_size_train int (0 here when there is no training file, which SambaStudio
    then refuses) and max_batch_size_dev optional (null without dev files)."""
    train, dev = sizes.get("train", []), sizes.get("validation", [])
    return {
        "max_seq_length": int(row_len),
        "token_type_ids": True,
        "vocab_size": int(vocab_size),
        "tokenizer_model_type": model_type,
        "number_of_training_files": len(train),
        "number_of_dev_files": len(dev),
        "number_of_test_files": len(sizes.get("test", [])),
        "max_batch_size_train": int(min(train, default=0)),
        "max_batch_size_dev": int(min(dev)) if dev else None,
    }


def refuses(spec: DatasetSpec) -> str | None:
    """gdp's files hold independent sequences: no layout for a paired record type (a chosen/rejected pair); its
    test JSONL holds prompt/completion lines; its categories are our domains."""
    kind = record_type(spec.input.type)
    if kind.paired:
        return (
            f"gdp's HDF5 layout has no chosen/rejected pair: input.type {spec.input.type} (preference pairs) "
            "cannot be written as hdf5"
        )
    if spec.output.hdf5_test_jsonl and kind.shape not in _TEST_SHAPES:
        return (
            f"output.hdf5_test_jsonl writes gdp's prompt/completion JSONL: input.type {spec.input.type} records "
            "have no such form (text and instruction do)"
        )
    if spec.output.categories is not None and spec.input.domain_key is None:
        return "output.categories maps domains to gdp's category ids: set input.domain_key"
    return None
