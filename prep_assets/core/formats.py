"""Output formats: the writers a split of packed shards goes through, registered by name.

Two kinds, chosen by what a trainer reads:
- a *row format* receives the split's packed rows (fixed-length sequences) chunk by chunk, in order, and
  returns its manifest entry when closed (`parquet`, always written: the gates check it; `npy`); it may also
  have a partition-level `finish`, called once after every split (`hdf5`: one folder and metadata per drop);
- a *document format* receives the split's gold examples whole (token ids in consecutive chunks and the
  example offsets) and returns its manifest entry (`megatron`).

`output.formats` in a spec names them; a format refuses, when the spec loads, a dataset it cannot represent.
The shards layer writes every named format without knowing any of them, so a new trainer format is one
`register(...)` (see docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from prep_assets.core.arrays import list_array
from prep_assets.core.exports import MEGATRON_PREFIX, MEMMAP_DIR, MemmapWriter, write_megatron
from prep_assets.core.lake import sha256_file
from prep_assets.core.parquet_io import ParquetSink
from prep_assets.core.record_types import record_type
from prep_assets.core.records import DEFAULT_DOMAIN, shard_schema
from prep_assets.core.rows import PackedRows, RowCounts

if TYPE_CHECKING:
    from prep_assets.core.spec import DatasetSpec

# Rows per Parquet row group of a shard (at 4096 tokens, ~1M tokens). DuckDB works through a row group at a time,
# so list functions in the shard gates hold about this many rows' lists (and the decoded-row metadata reads one).
SHARD_ROW_GROUP = 256


@dataclass(frozen=True)
class SplitTarget:
    """Where and how one split of a partition is written."""

    dir: Path  # the split's folder in the staging directory
    rel: str  # the same folder relative to the partition, as manifest paths name it
    row_len: int
    vocab_size: int
    compression: str
    rows_per_file: int  # a row format may cut its files here; chunks never straddle these boundaries
    max_tokens_per_file: int = 0  # `output.max_tokens_per_shard`, for a document format's files
    overlap: int = 0  # sequence.overlap: tokens a window repeats from the previous one
    eos_id: int | None = None  # the pinned tokenizer's EOS (a document format's end-of-document token)
    partition: str = ""  # the partition the split belongs to (names files that may share a folder)
    spec: DatasetSpec | None = None  # the dataset spec (a format's own `output` options)
    domains: Sequence[str | None] = ()  # the split's examples' domains in gold order (`PackedRows.example_order`)
    categories: Sequence[int] | None = None  # their gdp category ids (`input.categories`), in the same order


@dataclass(frozen=True)
class PartitionTarget:
    """What a format's partition-level step sees once every split is written (`RowFormat.finish`)."""

    dir: Path  # the partition's staging directory (manifest paths are relative to it)
    spec: DatasetSpec
    tokenizer_dir: Path  # the pinned tokenizer
    row_len: int
    vocab_size: int
    silver_records: Path | None = None  # the partition's silver records (normalized content, split, domain)


class RowSink(Protocol):
    def append(self, rows: PackedRows, example_ids: pa.Array) -> None: ...

    def close(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RowFormat:
    name: str
    open: Callable[[SplitTarget], RowSink]
    refuses: Callable[[DatasetSpec], str | None] = lambda spec: None  # why it cannot represent a dataset
    # optional: called once after every split with the splits' entries (split -> the entry its sink returned);
    # returns the partition-level entry (its `files` listed in the manifest's `exports` like a split's)
    finish: Callable[[PartitionTarget, dict[str, dict[str, Any]]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Documents:
    """One split's gold examples, whole and in gold order, as a document format reads them."""

    offsets: np.ndarray  # example i is tokens [offsets[i], offsets[i + 1]) of the split
    example_ids: pa.Array
    domains: list[str | None]  # each example's domain (`input.domain_key`; None: it names none)
    id_chunks: Callable[[], Iterator[np.ndarray]]  # the token ids front to back, a bounded chunk at a time
    # (token ids, loss mask, token types) of the examples given by index, concatenated in that order
    gather: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class DocumentFormat:
    name: str
    write: Callable[[SplitTarget, Documents], dict[str, Any]]  # -> the split's manifest entry
    refuses: Callable[[DatasetSpec], str | None] = lambda spec: None


FORMATS: dict[str, RowFormat | DocumentFormat] = {}


def register(fmt: RowFormat | DocumentFormat) -> RowFormat | DocumentFormat:
    if fmt.name in FORMATS:
        raise ValueError(f"output format {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    return fmt


def problems(spec: DatasetSpec) -> list[str]:
    """Why a spec's `output.formats` cannot be written: unknown names, formats that refuse the dataset."""
    out = []
    for name in spec.output.formats:
        fmt = FORMATS.get(name)
        if fmt is None:
            out.append(f"output.formats: unknown format {name!r}; known: {sorted(FORMATS)}")
        elif (why := fmt.refuses(spec)) is not None:
            out.append(f"output.formats {name}: {why}")
    return out


def row_table(rows: PackedRows, example_ids: pa.Array, domains: list[str] | None = None) -> pa.Table:
    """Packed rows as a shard table (the `SHARD_SCHEMA` columns, and `domain` when `domains` names each row's)."""
    n, L = rows.num_rows, rows.row_len
    row_offsets = np.arange(n + 1, dtype=np.int64) * L
    s0, s1 = int(rows.seg_offsets[0]), int(rows.seg_offsets[n])
    seg_offsets = rows.seg_offsets[: n + 1] - s0
    return pa.table(
        {
            "input_ids": list_array(rows.input_ids[: n * L], row_offsets, pa.int32()),
            "loss_mask": list_array(rows.loss_mask[: n * L], row_offsets, pa.uint8()),
            "position_ids": list_array(rows.position_ids[: n * L], row_offsets, pa.int32()),
            "segment_ids": list_array(rows.segment_ids[: n * L], row_offsets, pa.int32()),
            "token_type_ids": list_array(rows.token_type_ids[: n * L], row_offsets, pa.uint8()),
            "seq_lengths": list_array(rows.seg_lengths[s0:s1], seg_offsets, pa.int32()),
            "example_ids": pa.ListArray.from_arrays(pa.array(seg_offsets.astype(np.int32)), example_ids[s0:s1]),
            "example_offsets": list_array(rows.seg_starts[s0:s1], seg_offsets, pa.int32()),
            "num_loss_tokens": pa.array(rows.num_loss_tokens[:n]),
            **({"domain": pa.array(domains, pa.string())} if domains is not None else {}),
        },
        schema=shard_schema(domains is not None),
    )


def row_domains(rows: PackedRows, example_domains: Sequence[str | None]) -> list[str]:
    """Each row's domain: its first segment's example's (`DEFAULT_DOMAIN` for none); packing keeps rows pure."""
    first = rows.example_order[rows.seg_offsets[: rows.num_rows]]
    return [d if d is not None else DEFAULT_DOMAIN for d in (example_domains[int(e)] for e in first)]


def add_domain_runs(runs: dict[str, list[int]], domains: list[str], at: int) -> None:
    """Extend a file's `{domain: [start, stop)}` with rows `at`.. of `domains`; a domain's rows must be one run."""
    for i, d in enumerate(domains, start=at):
        run = runs.setdefault(d, [i, i])
        if run[1] != i:
            raise ValueError(f"domain {d!r} rows are not contiguous in the file (row {i} after {run})")
        run[1] = i + 1


class ParquetRows:
    """`part-NNNNN.parquet` files of at most `rows_per_file` rows; each listed with its sha256 and counts."""

    def __init__(self, target: SplitTarget) -> None:
        self.target = target
        self.files: list[dict[str, Any]] = []
        self.sink: ParquetSink | None = None
        self.counts, self.rows = RowCounts(), 0
        spec = target.spec
        self.domains = spec is not None and spec.input.domain_key is not None
        self.runs: dict[str, list[int]] = {}  # the open file's domain row ranges

    def append(self, rows: PackedRows, example_ids: pa.Array) -> None:
        if self.sink is None:
            rel = f"{self.target.rel}/part-{len(self.files):05d}.parquet"
            self.sink = ParquetSink(
                self.target.dir.parent / rel,
                shard_schema(self.domains),
                compression=self.target.compression,
                row_group_size=SHARD_ROW_GROUP,
            ).__enter__()
            self.files.append({"path": rel})
        domains = row_domains(rows, self.target.domains) if self.domains else None
        if domains is not None:
            add_domain_runs(self.runs, domains, self.rows)
        self.sink.write(row_table(rows, example_ids, domains))
        self.counts.add(rows)
        self.rows += rows.num_rows
        if self.rows == self.target.rows_per_file:
            self._finish()

    def _finish(self) -> None:
        assert self.sink is not None
        self.sink.__exit__(None, None, None)
        self.sink = None
        entry = self.files[-1]
        entry.update(
            sha256=sha256_file(self.target.dir.parent / entry["path"]),
            sequences=self.rows,
            tokens=self.counts.output,
            loss_tokens=self.counts.loss,
            **({"domain_rows": dict(sorted(self.runs.items()))} if self.domains else {}),
        )
        self.counts, self.rows, self.runs = RowCounts(), 0, {}

    def close(self) -> dict[str, Any]:
        if self.sink is not None:
            self._finish()
        return {"files": self.files}


def _npy(target: SplitTarget) -> RowSink:
    writer = MemmapWriter(target.dir / MEMMAP_DIR, f"{target.rel}/{MEMMAP_DIR}", target.row_len, target.vocab_size)
    return _MemmapRows(writer)


@dataclass
class _MemmapRows:
    writer: MemmapWriter

    def append(self, rows: PackedRows, example_ids: pa.Array) -> None:
        self.writer.append(rows)

    def close(self) -> dict[str, Any]:
        return self.writer.close()


def _megatron(target: SplitTarget, docs: Documents) -> dict[str, Any]:
    return write_megatron(
        target.dir / MEGATRON_PREFIX,
        f"{target.rel}/{MEGATRON_PREFIX}",
        docs.id_chunks(),
        docs.offsets,
        target.vocab_size,
    )


def _documents_only(spec: DatasetSpec) -> str | None:
    """Megatron's indexed dataset holds independent documents with no loss mask (docs/formats.md): text,
    instruction and chat examples go in whole, masks dropped; a preference pair, whose two branches must stay
    together, and table examples, built for one example per row with a masked schema prompt and in order, do not."""
    kind = record_type(spec.input.type)
    if kind.paired:
        return f"Megatron's .bin/.idx holds single documents: input.type {spec.input.type} (preference pairs) cannot"
    if kind.table_rows:
        return (
            f"Megatron's GPT dataset concatenates documents and cuts them at its sequence length: input.type "
            f"{spec.input.type} examples (one per row, schema prompt masked, in order) cannot be represented"
        )
    return None


PARQUET = register(RowFormat("parquet", ParquetRows))
register(RowFormat("npy", _npy))
register(DocumentFormat("megatron", _megatron, refuses=_documents_only))

# Formats in their own modules register here with the built-ins, so loading a spec knows them all (they import
# this module's types only when type checking).
from prep_assets.core import format_astrai, format_gpt_simple, format_hdf5  # noqa: E402

register(RowFormat("hdf5", format_hdf5.Hdf5Rows, refuses=format_hdf5.refuses, finish=format_hdf5.finish))
register(DocumentFormat("gpt_simple", format_gpt_simple.write, refuses=format_gpt_simple.refuses))
register(DocumentFormat("astrai_bin", format_astrai.write, refuses=format_astrai.refuses))
