"""One function per layer: read the upstream output in batches, transform, publish atomically, return stats.

These are what the Dagster assets call (and what tests and the benchmark call directly). Each writes
its whole partition into a staging directory that replaces the previous output in one atomic step.
"""

from __future__ import annotations

import gc
import shutil
from collections import Counter
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prep_assets.core.arrays import flat_values, list_array, offsets_from_lengths, percentiles, segment_sums
from prep_assets.core.clean import (
    assign_split,
    content_digest,
    left_as_is,
    normalize_content,
    quality_verdict,
    trained_roles,
)
from prep_assets.core import dedup
from prep_assets.core import invariants as inv
from prep_assets.core.drops import Drop, format_of, resolve_drop
from prep_assets.core.errors import DropError, ManifestError
from prep_assets.core.lake import (
    DatasetPaths,
    canonical_json,
    loads_json,
    partition_lock,
    read_json,
    scratch_dir,
    sha256_file,
    staged_dir,
    write_json_atomic,
)
from prep_assets.core.chat import ChatTemplate
from prep_assets.core.masking import tokenize_batches
from prep_assets.core.exports import MEGATRON_PREFIX, MEMMAP_DIR, MemmapWriter, write_megatron
from prep_assets.core.packing import PackedRows, RowPlan, plan_rows, rows_from_values, segment_sources, unit_offsets
from prep_assets.core.parquet_io import ParquetSink, iter_batches
from prep_assets.core.readers import Accounting, RawItem, RawReject, gzip_limit, read_drop
from prep_assets.core.records import (
    BRONZE_REJECT_SCHEMA,
    BRONZE_SCHEMA,
    EXTRACTORS,
    GOLD_REJECT_SCHEMA,
    Extractor,
    TabularExtractor,
    GOLD_SCHEMA,
    SHARD_SCHEMA,
    SILVER_REJECT_SCHEMA,
    SILVER_SCHEMA,
    SPLITS,
    TYPE_PROMPT,
    Invalid,
    content_texts,
    near_dup_text,
)
from prep_assets.core.spec import DatasetSpec, TabularSpec
from prep_assets.core.spill import TokenSpill
from prep_assets.core.tabular import group_label, infer_column_types, initial_prefill
from prep_assets.core.tabular_gold import build_tabular_examples
from prep_assets.core.tokenizer import PinnedTokenizer, load_pinned, load_pinned_info, pin_tokenizer

DEFAULT_BATCH = 4096
RECORDS, REJECTS, EXAMPLES, STATS, ACCOUNTING = (
    "records.parquet",
    "rejects.parquet",
    "examples.parquet",
    "stats.json",
    "accounting.json",
)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a layer's records (bronze's and gold's record loops, silver's whole pass).
    They make millions of short-lived objects (parsed JSON, token id lists) that nothing cycles through; with the
    collector on, each full collection walks the whole process' heap (the Dagster process': large): gold took ~1 s
    longer at 100 MB, bronze and silver 0.04-0.05 s each. Refcounting still frees everything; the collector is on
    again afterwards, error or not."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _columns(rows: list[dict[str, Any]], schema: pa.Schema) -> dict[str, list[Any]]:
    return {name: [r[name] for r in rows] for name in schema.names}


class _ColumnBuffer:
    """Collects rows as one list per column (no dict per row) and hands them to a sink in batches; `constant`
    columns hold one value for every row. Positional `add` follows the sink schema's other columns, in order."""

    def __init__(self, sink: ParquetSink, batch: int, constant: dict[str, Any]) -> None:
        self.sink, self.batch, self.constant = sink, batch, constant
        self.names = [n for n in sink.schema.names if n not in constant]
        self.columns: list[list[Any]] = [[] for _ in self.names]

    def add(self, *values: Any) -> None:
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        if len(self.columns[0]) >= self.batch:
            self.flush()

    def flush(self) -> None:
        n = len(self.columns[0])
        if n:
            columns = dict(zip(self.names, self.columns, strict=True))
            self.sink.write_rows({name: columns[name] if name in columns else [self.constant[name]] * n
                                  for name in self.sink.schema.names})
            self.columns = [[] for _ in self.names]


class _RowBuffer:
    """Collects dict rows and hands them to a sink in batches."""

    def __init__(self, sink: ParquetSink, batch: int) -> None:
        self.sink, self.batch, self.rows = sink, batch, []  # type: ignore[var-annotated]

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.sink.write_rows(_columns(self.rows, self.sink.schema))
            self.rows = []


# ---------------------------------------------------------------- tokenizer


def build_tokenizer(spec: DatasetSpec, paths: DatasetPaths, data_dir: Path) -> dict[str, Any]:
    with staged_dir(paths.tokenizer_dir) as stage:
        record = pin_tokenizer(spec.tokenizer, base=data_dir, dest=stage)
        if spec.input.type in ("chat", "preference"):
            ChatTemplate(load_pinned(stage))  # fail here, before any drop, if there is no template
    return record


# ---------------------------------------------------------------- bronze


def drop_format(spec: DatasetSpec, drop: Drop) -> str:
    fmt = spec.input.format if spec.input.format != "auto" else format_of(drop.file)
    if fmt is None:
        raise DropError(f"{drop.file}: no reader for this file name; set input.format in the spec")
    return fmt


def _extractor(spec: DatasetSpec, fmt: str, source: Path, drop: Drop) -> Extractor:
    """The record type's extractor. For tables, a first read fixes the drop's schema: CSV cells' column types
    (the group_by column stays text unless typed in the spec: it names groups), and for JSON rows the union
    of their keys in first-seen order."""
    if spec.input.type != "tabular":
        return EXTRACTORS[spec.input.type]
    tab = spec.tabular or TabularSpec()
    if fmt == "txt":
        raise DropError(f"{drop.file}: tabular input reads rows (csv, parquet, jsonl, json), not txt lines")
    if fmt == "parquet":
        return TabularExtractor(tab, drop.file)
    items = (r.value for r in read_drop(source, fmt, max_line_bytes=spec.input.max_line_bytes, acct=Accounting())
             if isinstance(r, RawItem))
    if fmt == "csv":
        overrides = {**({tab.group_by: "string"} if tab.group_by else {}), **tab.column_types}
        return TabularExtractor(tab, drop.file, csv_types=infer_column_types(items, tab.null_values, overrides))
    columns: dict[str, None] = {}
    for value in items:
        if isinstance(value, dict):
            columns.update(dict.fromkeys(value))
    return TabularExtractor(tab, drop.file, columns=list(columns) or None)


# What the Parquet writer raises for a value it cannot store (a lone surrogate): that record's reject, not the drop's
_UNSTORABLE = (UnicodeEncodeError, pa.ArrowException, OverflowError)


def _shown(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates) written as escapes: a reject is always storable."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _unstorable(row: dict[str, Any]) -> tuple[str, str] | None:
    """Why the Parquet writer refuses a bronze row, or None."""
    for name, value in row.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return "invalid_unicode", (f"{name}: lone surrogate \\u{ord(value[exc.start]):04x} at character "
                                           f"{exc.start}: UTF-8 cannot encode it")
    return None


class _BronzeRecords(_ColumnBuffer):
    """Bronze's records; a row the Parquet writer refuses becomes a reject through `reject` rather than the
    drop's failure (the readers reject such values first: this is only the last line)."""

    def __init__(self, sink: ParquetSink, batch: int, constant: dict[str, Any],
                 reject: Callable[[dict[str, Any], str, str], None]) -> None:
        super().__init__(sink, batch, constant)
        self.reject = reject

    def flush(self) -> None:
        try:
            super().flush()
        except _UNSTORABLE:  # a batch holds it: find the rows, write the others
            rows = [dict(zip(self.names, values, strict=True)) for values in zip(*self.columns, strict=True)]
            self.columns = [[] for _ in self.names]
            for row in rows:
                problem = _unstorable(row)
                if problem is None:
                    for column, name in zip(self.columns, self.names, strict=True):
                        column.append(row[name])
                else:
                    self.reject(row, *problem)
            super().flush()


def build_raw_records(
    spec: DatasetSpec, drop: Drop, source: Path, out_dir: Path, *, batch_size: int = DEFAULT_BATCH
) -> dict[str, Any]:
    """Bronze: every parseable record with provenance; every other line a reject with its reason."""
    fmt = drop_format(spec, drop)
    extract = _extractor(spec, fmt, source, drop)
    acct = Accounting()
    reasons: Counter[str] = Counter()
    element_no: Counter[int] = Counter()
    with staged_dir(out_dir) as stage:
        comp = spec.output.compression
        with (
            ParquetSink(stage / RECORDS, BRONZE_SCHEMA, compression=comp) as rec_sink,
            ParquetSink(stage / REJECTS, BRONZE_REJECT_SCHEMA, compression=comp) as rej_sink,
        ):
            where = {"drop": drop.partition, "source_file": drop.file}
            rejects = _RowBuffer(rej_sink, batch_size)

            def reject(line: int, offset: int, reason: str, detail: str, excerpt: str) -> None:
                reasons[reason] += 1
                rejects.add({**where, "source_line": line, "byte_offset": offset, "reason": reason,
                             "detail": _shown(detail), "excerpt": _shown(excerpt[:160])})

            records = _BronzeRecords(rec_sink, batch_size, where, lambda row, reason, detail: reject(
                row["source_line"], row["byte_offset"], reason, detail, row["record"]))
            with _gc_paused():
                for item in read_drop(source, fmt, max_line_bytes=spec.input.max_line_bytes, acct=acct,
                                      max_gzip_ratio=spec.input.max_gzip_ratio):
                    if isinstance(item, RawReject):
                        reject(item.line, item.byte_offset, item.reason, item.detail, item.excerpt)
                        continue
                    content = extract(item.value, spec.input)
                    if isinstance(content, Invalid):
                        reject(item.line, item.byte_offset, content.reason, content.detail, item.text)
                        continue
                    try:
                        canonical = canonical_json(content)
                    except (ValueError, RecursionError) as exc:
                        reject(item.line, item.byte_offset, "unstorable_value", f"{type(exc).__name__}: {exc}",
                               item.text)
                        continue
                    record_id = f"{drop.partition}:{item.line}"
                    if acct.unit == "element":  # several array elements may share a line
                        record_id += f".{element_no[item.line]}"
                        element_no[item.line] += 1
                    records.add(record_id, item.line, item.byte_offset, item.sha256, item.text, canonical)
            records.flush()
            rejects.flush()
        stats = {
            "drop": drop.partition,
            "file": drop.file,
            "sha256": drop.sha256,
            "format": fmt,
            "unit": acct.unit,
            "lines_in": acct.lines_in,
            "blank_lines": acct.blank_lines,
            "records": rec_sink.rows,
            "rejects": rej_sink.rows,
            "rejects_by_reason": dict(sorted(reasons.items())),
            "spec_version": spec.layer_version("bronze"),
        }
        if fmt == "jsonl.gz":  # the accounting gate's recount stops where the reader had to
            stats["gzip_limit"] = gzip_limit(source, spec.input.max_gzip_ratio)
        write_json_atomic(stage / ACCOUNTING, stats)
    return stats


# ---------------------------------------------------------------- silver


def _split_key(spec: DatasetSpec, content: dict[str, Any], digest: str) -> str:
    """What a record's split is drawn from: its content, or its group's value (no group in two splits)."""
    group_by = spec.tabular.group_by if spec.tabular is not None else None
    if group_by is None:
        return digest
    return "group:" + group_label(content["values"][content["columns"].index(group_by)])


def build_clean_records(
    spec: DatasetSpec, bronze_dir: Path, out_dir: Path, *, batch_size: int = DEFAULT_BATCH,
    earlier: Sequence[Path] = (), index_dir: Path | None = None, near: bool = True,
) -> dict[str, Any]:
    """Silver: normalized, quality-filtered, deduplicated records with a deterministic split.

    `earlier` are the dedup indexes of drops registered before this one (dedup_scope: dataset): their
    contents are duplicates here too. With `index_dir`, this drop's index is published there. Equal hashes
    are confirmed on the bytes: when two contents share one, the drop is processed again keying that hash by
    its content, so a collision never removes a distinct record. `near=False` skips near dedup (for an index,
    which holds exact contents only).
    """
    colliding: frozenset[str] = frozenset()
    while True:
        try:
            with _gc_paused():
                return _clean_pass(spec, bronze_dir, out_dir, batch_size, earlier, colliding, index_dir, near)
        except dedup.HashCollision as found:
            colliding |= found.digests


def _clean_pass(spec: DatasetSpec, bronze_dir: Path, out_dir: Path, batch_size: int, earlier: Sequence[Path],
                colliding: frozenset[str], index_dir: Path | None, with_near: bool) -> dict[str, Any]:
    clean = spec.clean
    norm = clean.normalization
    exact = dedup.ExactDedup(earlier, colliding) if clean.dedup != "none" else None
    near = dedup.NearDuplicates(clean.near) if clean.dedup == "near" and with_near else None
    trained = trained_roles(spec)
    near_of: dict[str, str] = {}  # record removed as a near duplicate -> the kept record it is near
    reasons: Counter[str] = Counter()
    splits: Counter[str] = Counter()
    chars = records_in = of_earlier = 0
    with staged_dir(out_dir) as stage:
        comp = spec.output.compression
        with (
            ParquetSink(stage / RECORDS, SILVER_SCHEMA, compression=comp) as keep_sink,
            ParquetSink(stage / REJECTS, SILVER_REJECT_SCHEMA, compression=comp) as rej_sink,
        ):
            rejected = _RowBuffer(rej_sink, batch_size)

            cols = ["record_id", "drop", "source_file", "source_line", "byte_offset", "content"]
            values: list[list[Any]] = []

            def reject(i: int, reason: str, detail: str, canonical: str, digest: str | None = None,
                       of: str | None = None) -> None:
                """Row `i` of the batch (its provenance columns) goes to the rejects table."""
                reasons[reason] += 1
                rejected.add({**{c: values[j][i] for j, c in enumerate(cols[:-1])}, "reason": reason,
                              "detail": detail, "duplicate_of": of, "content": canonical, "content_sha256": digest})

            for batch in iter_batches(bronze_dir / RECORDS, batch_size=batch_size, columns=cols):
                as_is = left_as_is(batch.column("content")).tolist()
                values[:] = [batch.column(c).to_pylist() for c in cols]  # a list per column: 4x faster than rows
                # the kept rows: their provenance is taken from the batch (Arrow), the rest collected here
                kept: list[int] = []
                kept_content: list[str] = []
                kept_digest: list[str] = []
                kept_chars: list[int] = []
                kept_split: list[str] = []
                for i, (record_id, canonical, same) in enumerate(zip(values[0], values[-1], as_is)):
                    records_in += 1
                    content = loads_json(canonical)
                    if not same:
                        content = normalize_content(content, norm)
                        canonical = canonical_json(content)
                    texts = content_texts(content)
                    verdict = quality_verdict(content, clean, texts, trained)
                    if verdict is not None:
                        reject(i, verdict.reason, verdict.detail, canonical)
                        continue
                    digest = content_digest(canonical)
                    if exact is not None:
                        first, in_earlier = exact.repeats(digest, canonical, record_id)
                        if first is not None and first in near_of:  # a copy of a record removed as near duplicate
                            reject(i, "near_duplicate", f"same content as {first}, a "
                                   f"near duplicate of {near_of[first]}", canonical, digest, near_of[first])
                            continue
                        if first is not None:
                            of_earlier += in_earlier
                            reject(i, "duplicate", f"same content as {first}", canonical,
                                   digest, first)
                            continue
                    if near is not None:
                        match = near.match(record_id, near_dup_text(content))
                        if match is not None:
                            near_of[record_id] = match[0]
                            reject(i, "near_duplicate", f"estimated Jaccard "
                                   f"{match[1]:.3f} >= {clean.near.threshold} with {match[0]}", canonical, digest,
                                   match[0])
                            continue
                    split = assign_split(_split_key(spec, content, digest), spec.split)
                    splits[split] += 1
                    n = sum(map(len, texts))
                    chars += n
                    kept.append(i)
                    kept_content.append(canonical)
                    kept_digest.append(digest)
                    kept_chars.append(n)
                    kept_split.append(split)
                if kept:
                    take = pa.array(kept, type=pa.int64())
                    keep_sink.write(pa.Table.from_pydict({
                        **{c: batch.column(c).take(take) for c in cols[:-1]}, "content": kept_content,
                        "content_sha256": kept_digest, "num_chars": kept_chars, "split": kept_split,
                    }, schema=SILVER_SCHEMA))
            rejected.flush()
        if exact is not None:
            found = dedup.collisions(stage / RECORDS, stage / REJECTS, earlier) - colliding
            if found:
                raise dedup.HashCollision(found)  # the stage is discarded; the caller runs the pass again
        stats = {
            "records_in": records_in,
            "records": keep_sink.rows,
            "rejects": rej_sink.rows,
            "rejects_by_reason": dict(sorted(reasons.items())),
            "records_by_split": {s: splits[s] for s in SPLITS},
            "chars": chars,
            "dedup": clean.dedup,
            "dedup_scope": clean.dedup_scope,
            "duplicates_of_earlier_drops": of_earlier,
            "earlier_drops": [path.parent.name for path in earlier],
            "hash_collisions": len(colliding),
        }
        write_json_atomic(stage / STATS, stats)
        if index_dir is not None and exact is not None:
            dedup.write_index(index_dir, exact.first_seen.values(), stage / RECORDS, stage / REJECTS)
    return stats


def earlier_indexes(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH
                    ) -> list[Path]:
    """The dedup indexes of the drops registered before `partition`, earliest first. A drop without one for
    this spec gets it from its raw file, so the answer never depends on which partitions were built before."""
    out = []
    for drop, path in dedup.earlier_indexes(spec, paths, partition):
        if not path.is_file():
            _index_drop(spec, paths, drop, path.parent, batch_size)
        out.append(path)
    return out


def _index_drop(spec: DatasetSpec, paths: DatasetPaths, drop: Drop, out_dir: Path, batch_size: int) -> None:
    """A drop's index from its raw file (bronze and silver built in a scratch dir, then discarded). A drop this
    spec cannot read (its bronze fails) holds nothing: the same outcome however often it is tried."""
    _, source = resolve_drop(paths, drop.partition)
    with scratch_dir(paths.root / "dedup_scratch") as tmp:
        bronze, silver = tmp / "bronze", tmp / "silver"
        try:
            build_raw_records(spec, drop, source, bronze, batch_size=batch_size)
        except DropError:
            dedup.write_empty_index(out_dir)
            return
        build_clean_records(spec, bronze, silver, batch_size=batch_size, index_dir=out_dir, near=False)


def build_silver(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH
                 ) -> dict[str, Any]:
    """A drop's silver; with `clean.dedup_scope: dataset`, also without copies of earlier drops' records."""
    bronze, out = paths.partition_dir("bronze", partition), paths.partition_dir("silver", partition)
    if spec.clean.dedup_scope != "dataset":
        return build_clean_records(spec, bronze, out, batch_size=batch_size)
    built_with = read_json(bronze / ACCOUNTING).get("spec_version") if (bronze / ACCOUNTING).is_file() else None
    if built_with != spec.layer_version("bronze"):
        raise DropError(f"drop {partition}: its bronze was built with another spec (or is missing); materialize "
                        "raw_records first, so its dedup index matches the spec")
    return build_clean_records(spec, bronze, out, batch_size=batch_size,
                               earlier=earlier_indexes(spec, paths, partition, batch_size=batch_size),
                               index_dir=dedup.index_dir(spec, paths, partition))


# ---------------------------------------------------------------- gold


@dataclass
class _GoldTally:
    """What gold counts while it writes: rejects by reason, token totals, overflow per split, example lengths."""

    reasons: Counter[str] = field(default_factory=Counter)
    totals: Counter[str] = field(default_factory=Counter)
    overflow_by_split: Counter[str] = field(default_factory=Counter)
    lengths: list[np.ndarray] = field(default_factory=list)


def _record_examples(spec: DatasetSpec, silver_dir: Path, pt: PinnedTokenizer, chat: ChatTemplate | None,
                     ex_sink: ParquetSink, rej_sink: ParquetSink, batch_size: int, tally: _GoldTally) -> None:
    """One gold example per silver record (two per preference pair), tokenized and written batch by batch."""
    cols = ["record_id", "drop", "source_file", "source_line", "byte_offset", "split", "content"]
    # closed on the way out, error or not, so their worker threads stop with the step (a traceback kept by the
    # caller would otherwise keep the generators, and a prefetch or an encode, alive)
    with (closing(iter_batches(silver_dir / RECORDS, batch_size=batch_size, columns=cols)) as read,
          closing(tokenize_batches(((batch, [loads_json(c) for c in batch.column("content").to_pylist()])
                                    for batch in read), spec, pt, chat)) as stream):
        for batch, tb in stream:
            tally.totals["tokens_dropped_by_overflow"] += tb.tokens_dropped
            tally.totals["examples_split_at_turn_boundary"] += tb.split_at_turn_boundary
            record_split = batch.column("split").to_pylist()
            for rec, n in tb.lost or []:
                tally.overflow_by_split[record_split[rec]] += n
            if tb.cut is not None:
                for e in np.flatnonzero(tb.cut).tolist():
                    tally.overflow_by_split[record_split[int(tb.kept[e])]] += int(tb.cut[e])
            if tb.rejects:
                idx = pa.array([r[0] for r in tb.rejects], type=pa.int64())
                rej = batch.select(cols[:-1]).take(idx)
                for r in tb.rejects:
                    tally.reasons[r[1]] += 1
                rej_sink.write(
                    pa.Table.from_batches([rej]).append_column("reason", pa.array([r[1] for r in tb.rejects]))
                    .append_column("detail", pa.array([r[2] for r in tb.rejects]))
                    .append_column("num_tokens", pa.array([r[3] for r in tb.rejects], type=pa.int32()))
                    .append_column("group_key", pa.nulls(len(tb.rejects), pa.string()))
                )
            if len(tb.kept) == 0:
                continue
            lengths = np.diff(tb.offsets)
            n_loss = segment_sums(tb.loss_mask, tb.offsets)
            n_prompt = segment_sums(tb.token_type_ids == TYPE_PROMPT, tb.offsets)
            kept = pa.Table.from_batches([batch.select(cols[:-1])]).take(pa.array(tb.kept, type=pa.int64()))
            pair_id = branch = pa.nulls(len(tb.kept), pa.string())
            shared = pa.nulls(len(tb.kept), pa.int32())
            example_id = kept.column("record_id")
            if tb.branches is not None and tb.shared_prefix is not None:
                pair_id, branch = example_id, pa.array(tb.branches, pa.string())
                shared = pa.array(tb.shared_prefix.astype(np.int32))
                example_id = pc.binary_join_element_wise(example_id, branch, "/")
            ex_sink.write(
                pa.table(
                    {
                        "example_id": example_id,
                        **{c: kept.column(c) for c in cols[:-1]},
                        "token_ids": list_array(tb.token_ids, tb.offsets, pa.int32()),
                        "loss_mask": list_array(tb.loss_mask, tb.offsets, pa.uint8()),
                        "token_type_ids": list_array(tb.token_type_ids, tb.offsets, pa.uint8()),
                        "num_tokens": pa.array(lengths.astype(np.int32)),
                        "num_loss_tokens": pa.array(n_loss.astype(np.int32)),
                        "num_prompt_tokens": pa.array(n_prompt.astype(np.int32)),
                        "pair_id": pair_id,
                        "branch": branch,
                        "shared_prefix_tokens": shared,
                        "record_ids": pa.nulls(len(tb.kept), pa.list_(pa.string())),
                        "group_keys": pa.nulls(len(tb.kept), pa.list_(pa.string())),
                    },
                    schema=GOLD_SCHEMA,
                )
            )
            tally.lengths.append(lengths)
            tally.totals["tokens"] += int(lengths.sum())
            tally.totals["loss_tokens"] += int(n_loss.sum())
            tally.totals["prompt_tokens"] += int(n_prompt.sum())


def build_tokenized_examples(
    spec: DatasetSpec, silver_dir: Path, tokenizer_dir: Path, out_dir: Path, *, batch_size: int = DEFAULT_BATCH
) -> dict[str, Any]:
    """Gold: one example per record (a preference pair: two) with token ids, loss mask and token types
    (DESIGN §4); for tables, examples assembled from rows (DESIGN §6, `tabular_gold`)."""
    pt = load_pinned(tokenizer_dir)
    tally = _GoldTally()
    with staged_dir(out_dir) as stage:
        comp = spec.output.compression
        with (
            ParquetSink(stage / EXAMPLES, GOLD_SCHEMA, compression=comp, row_group_size=4096) as ex_sink,
            ParquetSink(stage / REJECTS, GOLD_REJECT_SCHEMA, compression=comp) as rej_sink,
        ):
            extra: dict[str, Any] = {}
            if spec.input.type == "tabular":
                tab = build_tabular_examples(spec, silver_dir / RECORDS, pt, ex_sink, rej_sink)
                tally.lengths.append(tab["lengths"])
                tally.totals.update({k: tab[k] for k in ("tokens", "loss_tokens", "prompt_tokens")})
                tally.reasons.update(tab["rejects_by_reason"])
                extra["tabular"] = tab["tabular"]
            else:
                chat = ChatTemplate(pt) if spec.input.type in ("chat", "preference") else None
                with _gc_paused():
                    _record_examples(spec, silver_dir, pt, chat, ex_sink, rej_sink, batch_size, tally)
        lengths_cat = np.concatenate(tally.lengths) if tally.lengths else np.zeros(0, dtype=np.int64)
        totals = tally.totals
        stats = {
            "examples": ex_sink.rows,
            "rejects": rej_sink.rows,
            "rejects_by_reason": dict(sorted(tally.reasons.items())),
            "tokens": totals["tokens"],
            "loss_tokens": totals["loss_tokens"],
            "prompt_tokens": totals["prompt_tokens"],
            "tokens_dropped_by_overflow": totals["tokens_dropped_by_overflow"],
            "tokens_dropped_by_overflow_by_split": {s: tally.overflow_by_split[s] for s in SPLITS},
            # chat: examples whose ids differ from tokenizer(rendering), cut where a trained turn starts or ends
            **({"examples_split_at_turn_boundary": totals["examples_split_at_turn_boundary"]}
               if spec.input.type in ("chat", "preference") else {}),
            "overflow": spec.gold_overflow,
            "example_length": percentiles(lengths_cat),
            "tokenizer_fingerprint": pt.info.fingerprint,
            "vocab_size": pt.info.vocab_size,
            "max_seq_len": spec.sequence.max_seq_len,
            **extra,
        }
        write_json_atomic(stage / STATS, stats)
    return stats


# ---------------------------------------------------------------- packed shards


def _row_table(rows: PackedRows, example_ids: pa.Array, lo: int, hi: int) -> pa.Table:
    """Rows [lo, hi) of packed output as a shard table."""
    L = rows.row_len
    n = hi - lo
    tok = slice(lo * L, hi * L)
    row_offsets = np.arange(n + 1, dtype=np.int64) * L
    s0, s1 = int(rows.seg_offsets[lo]), int(rows.seg_offsets[hi])
    seg_offsets = rows.seg_offsets[lo : hi + 1] - s0
    return pa.table(
        {
            "input_ids": list_array(rows.input_ids[tok], row_offsets, pa.int32()),
            "loss_mask": list_array(rows.loss_mask[tok], row_offsets, pa.uint8()),
            "position_ids": list_array(rows.position_ids[tok], row_offsets, pa.int32()),
            "segment_ids": list_array(rows.segment_ids[tok], row_offsets, pa.int32()),
            "token_type_ids": list_array(rows.token_type_ids[tok], row_offsets, pa.uint8()),
            "seq_lengths": list_array(rows.seg_lengths[s0:s1], seg_offsets, pa.int32()),
            "example_ids": pa.ListArray.from_arrays(pa.array(seg_offsets.astype(np.int32)), example_ids[s0:s1]),
            "example_offsets": list_array(rows.seg_starts[s0:s1], seg_offsets, pa.int32()),
            "num_loss_tokens": pa.array(rows.num_loss_tokens[lo:hi]),
        },
        schema=SHARD_SCHEMA,
    )


@dataclass(frozen=True)
class GoldArrays:
    """Gold examples as flat arrays with offsets (the columnar form packing and the exports work on)."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    token_type_ids: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, table: pa.Table) -> GoldArrays:
        ids, offsets = flat_values(table.column("token_ids"), np.int32)
        mask, _ = flat_values(table.column("loss_mask"), np.uint8)
        types, _ = flat_values(table.column("token_type_ids"), np.uint8)
        return cls(ids, mask, types, offsets)


def plan_split(spec: DatasetSpec, pair_ids: list[str | None], offsets: np.ndarray, loss_mask: Any,
               seed: tuple[int, ...] | None, example_loss: np.ndarray | None = None) -> RowPlan:
    """The row plan of one split's gold examples (`pair_ids` in gold order keep preference pairs together);
    `loss_mask` is the split's flat mask, or anything that slices into it (`FrontToBack`); `example_loss` the
    examples' loss token counts, where known."""
    return plan_rows(
        np.diff(offsets),
        capacity=spec.sequence.max_seq_len,
        strategy=spec.packing.strategy,
        overflow=spec.sequence.overflow,
        overlap=spec.sequence.overlap,
        loss_mask=loss_mask,
        example_loss=example_loss,
        units=unit_offsets(pair_ids) if spec.input.type == "preference" else None,
        max_per_bin=spec.max_per_example,
        shuffle_seed=seed,
    )


TABULAR_MANIFEST_KEYS = ("mode", "columns", "schema_prompt", "bos_id", "eos_id", "order_by", "order_by_type",
                         "initial_prefill")


SHARD_CHUNK_ROWS = 1024  # rows materialized at once: bounds memory; the bytes never depend on it
# Rows per Parquet row group of a shard (at 4096 tokens, ~1M tokens). DuckDB works through a row group at a time,
# so list functions in the shard gates hold about this many rows' lists: 1024-row groups took the row checksum of
# `packed_shards_match_gold` to +740 MiB, 256-row groups to +220 MiB (and the decoded-row metadata reads one group).
SHARD_ROW_GROUP = 256
_SPILL = "_gold_spill"


@dataclass
class _SplitGold:
    """One split of gold, spilled to a flat file in the staging dir (memory stays bounded): planning reads it
    mapped front to back, rows read their pieces from it."""

    spill: TokenSpill
    offsets: np.ndarray
    example_ids: pa.Array
    pair_ids: list[str | None]
    loss: np.ndarray  # loss tokens per example (summed as it was spilled)

    def id_chunks(self, tokens: int = 1 << 22) -> Iterator[np.ndarray]:
        """The token ids front to back, a chunk at a time (the pages of the one before dropped)."""
        ids = self.spill.front_to_back("id")
        for lo in range(0, len(ids), tokens):
            yield ids[lo : lo + tokens]
        self.spill.release()


def _spill_gold(gold_path: Path, spill: Path, batch_size: int) -> dict[str, _SplitGold]:
    """Stream gold once: per split, its tokens appended to a spill file, its example ids kept."""
    spill.mkdir()
    out: dict[str, dict[str, Any]] = {
        s: {"spill": TokenSpill(spill / f"{s}.tokens"), "lengths": [], "loss": [], "ids": [], "pairs": []}
        for s in SPLITS}
    try:
        cols = ["example_id", "split", "token_ids", "loss_mask", "token_type_ids", "pair_id"]
        for batch in iter_batches(gold_path, batch_size=batch_size, columns=cols):
            splits = batch.column("split")
            for split in SPLITS:
                rows = pc.equal(splits, split)
                n = pc.sum(rows).as_py() or 0
                if n == 0:
                    continue
                sub = batch if n == batch.num_rows else batch.filter(rows)  # a batch of one split is not copied
                acc = out[split]
                ids, offsets = flat_values(sub.column("token_ids"), np.int32)
                mask, _ = flat_values(sub.column("loss_mask"), np.uint8)
                types, _ = flat_values(sub.column("token_type_ids"), np.uint8)
                acc["spill"].append(ids, mask, types)
                acc["lengths"].append(np.diff(offsets))
                acc["loss"].append(segment_sums(mask, offsets))
                acc["ids"].append(sub.column("example_id"))
                acc["pairs"] += sub.column("pair_id").to_pylist()
        result = {}
        for split, acc in out.items():
            acc["spill"].seal()
            lengths = np.concatenate(acc["lengths"]) if acc["lengths"] else np.zeros(0, dtype=np.int64)
            loss = np.concatenate(acc["loss"]) if acc["loss"] else np.zeros(0, dtype=np.int64)
            ids = pa.concat_arrays(acc["ids"]) if acc["ids"] else pa.array([], pa.string())
            result[split] = _SplitGold(acc["spill"], offsets_from_lengths(lengths), ids, acc["pairs"], loss)
        return result
    except BaseException:
        for acc in out.values():
            acc["spill"].close()
        raise


def build_packed_shards(spec: DatasetSpec, gold_dir: Path, tokenizer_dir: Path, out_dir: Path, *,
                        batch_size: int = DEFAULT_BATCH) -> dict[str, Any]:
    """Shards: fixed-length packed rows per split, in Parquet files of at most max_tokens_per_shard tokens,
    plus the optional memmap and Megatron exports. Streams: gold is read once in batches and spilled per split
    to flat files (mapped back), rows are planned from the lengths and materialized SHARD_CHUNK_ROWS at a time."""
    info = load_pinned_info(tokenizer_dir)  # ids and fingerprint only: packing never encodes
    gold_stats = read_json(gold_dir / STATS)
    if gold_stats["tokenizer_fingerprint"] != info.fingerprint:
        raise DropError(
            "gold was tokenized with another tokenizer than the pinned one "
            f"({gold_stats['tokenizer_fingerprint'][:12]} != {info.fingerprint[:12]}); rematerialize gold"
        )
    if gold_stats.get("overflow") != spec.gold_overflow:
        raise DropError(f"gold was built for overflow {gold_stats.get('overflow')!r}, the spec now needs "
                        f"{spec.gold_overflow!r}; rematerialize gold")
    L = spec.sequence.max_seq_len
    rows_per_shard = max(1, spec.output.max_tokens_per_shard // L)
    split_stats: dict[str, Any] = {}
    with staged_dir(out_dir) as stage:
        spilled = _spill_gold(gold_dir / EXAMPLES, stage / _SPILL, batch_size)
        try:
            for split_no, split in enumerate(SPLITS):
                sg = spilled[split]
                seed = (spec.packing.seed, split_no) if spec.shuffles_rows else None
                plan = plan_split(spec, sg.pair_ids, sg.offsets, sg.spill.front_to_back("mask"), seed, sg.loss)
                sg.spill.release()
                examples = len(sg.offsets) - 1
                if plan.num_rows or examples:
                    (stage / split).mkdir()
                memmap = (MemmapWriter(stage / split / MEMMAP_DIR, f"{split}/{MEMMAP_DIR}", L, info.vocab_size)
                          if "npy" in spec.output.formats and plan.num_rows else None)
                counts, files = RowCounts(), []
                for k, lo in enumerate(range(0, plan.num_rows, rows_per_shard)):
                    hi = min(lo + rows_per_shard, plan.num_rows)
                    rel = f"{split}/part-{k:05d}.parquet"
                    in_file = RowCounts()
                    with ParquetSink(stage / rel, SHARD_SCHEMA, compression=spec.output.compression,
                                     row_group_size=SHARD_ROW_GROUP) as sink:
                        for c_lo in range(lo, hi, SHARD_CHUNK_ROWS):
                            part = plan.rows(c_lo, min(c_lo + SHARD_CHUNK_ROWS, hi))
                            values = sg.spill.read(segment_sources(part, sg.offsets), part.length)
                            rows = rows_from_values(part, *values, row_len=L, pad_id=info.pad_id)
                            del values
                            example_ids = sg.example_ids.take(pa.array(part.example, type=pa.int64()))
                            sink.write(_row_table(rows, example_ids, 0, rows.num_rows))
                            in_file.add(rows)
                            if memmap is not None:
                                memmap.append(rows)
                            del rows
                    counts.merge(in_file)
                    files.append({"path": rel, "sha256": sha256_file(stage / rel), "sequences": hi - lo,
                                  "tokens": in_file.output, "loss_tokens": in_file.loss})
                exports: dict[str, Any] = {}
                if memmap is not None:
                    exports["npy"] = memmap.close()
                if "megatron" in spec.output.formats and examples:
                    exports["megatron"] = write_megatron(stage / split / MEGATRON_PREFIX, f"{split}/{MEGATRON_PREFIX}",
                                                         sg.id_chunks(), sg.offsets, info.vocab_size)
                overflow = gold_stats.get("tokens_dropped_by_overflow_by_split", {}).get(split, 0)
                split_stats[split] = {**split_metrics(sg.offsets, plan, counts, L, overflow),
                                      "max_batch_size": min((f["sequences"] for f in files), default=0),
                                      "files": files, "exports": exports}
        finally:
            for sg in spilled.values():
                sg.spill.close()
        shutil.rmtree(stage / _SPILL)
        stats = {
            "tokenizer_fingerprint": info.fingerprint,
            "max_seq_len": L,
            "strategy": spec.packing.strategy,
            "overflow": spec.sequence.overflow,
            "overlap": spec.sequence.overlap,
            "splits": split_stats,
            "totals": totals(split_stats.values(), L),
        }
        if "tabular" in gold_stats:  # what a generator needs beside the shards (the manifest collects it)
            stats["tabular"] = {k: gold_stats["tabular"][k] for k in TABULAR_MANIFEST_KEYS}
        write_json_atomic(stage / STATS, stats)
    return stats


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
        self.output, self.loss, self.prompt = (self.output + other.output, self.loss + other.loss,
                                               self.prompt + other.prompt)


def _ratio(a: int, b: int, empty: float) -> float:
    return round(a / b, 6) if b else empty


def split_metrics(gold_offsets: np.ndarray, plan: RowPlan, counts: RowCounts, row_len: int,
                  dropped_by_overflow: int) -> dict[str, Any]:
    """DESIGN §5 metrics of one split. Input tokens are gold's plus what overflow cut or dropped in gold."""
    capacity = plan.num_rows * row_len
    examples = len(gold_offsets) - 1
    gold_tokens = int(gold_offsets[-1])
    input_tokens = gold_tokens + dropped_by_overflow
    pieces = np.bincount(plan.example, minlength=examples)
    metrics = {
        "examples": examples,
        "examples_split": int(np.count_nonzero(pieces > 1)),
        "sequences": plan.num_rows,
        "segments": int(len(plan.example)),
        "input_tokens": input_tokens,
        "gold_tokens": gold_tokens,
        "output_tokens": counts.output,
        "loss_tokens": counts.loss,
        "prompt_tokens": counts.prompt,
        "padding_tokens": capacity - counts.output,
        "tokens_dropped_by_overflow": dropped_by_overflow,
        "tokens_dropped_by_packing": plan.dropped_tokens,
        "windows_dropped": plan.dropped_pieces,
        "overlap_tokens": plan.overlap_tokens,
    }
    distributions = {"segment_length": percentiles(plan.length),
                     "segments_per_row": percentiles(np.diff(plan.row_offsets))}
    return {**metrics, **_utilizations(metrics, row_len), "distributions": distributions}


def _utilizations(m: dict[str, Any], row_len: int) -> dict[str, Any]:
    capacity = m["sequences"] * row_len
    return {
        "data_utilization": _ratio(m["output_tokens"] - m["overlap_tokens"], m["input_tokens"], 1.0),
        "sequence_utilization": _ratio(m["output_tokens"], capacity, 0.0),
        "loss_token_utilization": _ratio(m["loss_tokens"], capacity, 0.0),
    }


SUMMED = ("examples", "examples_split", "sequences", "segments", "input_tokens", "gold_tokens", "output_tokens",
          "loss_tokens", "prompt_tokens", "padding_tokens", "tokens_dropped_by_overflow", "tokens_dropped_by_packing",
          "windows_dropped", "overlap_tokens")


def totals(splits: Iterable[dict[str, Any]], row_len: int) -> dict[str, Any]:
    """Partition (or dataset) totals of split metrics; ratios recomputed, max_batch_size the smallest file's rows."""
    splits = list(splits)
    out: dict[str, Any] = {k: sum(s.get(k, 0) for s in splits) for k in SUMMED}
    sizes = [f["sequences"] for s in splits for f in s.get("files", [])]
    out["max_batch_size"] = min(sizes, default=0)
    return {**out, **_utilizations(out, row_len)}


# ---------------------------------------------------------------- manifest


def build_manifest(spec: DatasetSpec, paths: DatasetPaths, partitions: list[str]) -> dict[str, Any]:
    """The dataset manifest: every published shard and export of the given partitions, by split, with checksums
    and the split metrics summed over partitions."""
    tok = read_json(paths.tokenizer_dir / "fingerprint.json")
    files: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    exports: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    metrics: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    parts: dict[str, Any] = {}
    fingerprints = set()
    tabular: dict[str, Any] | None = None
    for partition in sorted(partitions):
        stats_path = paths.partition_dir("shards", partition) / STATS
        if not stats_path.is_file():
            continue
        stats = read_json(stats_path)
        fingerprints.add(stats["tokenizer_fingerprint"])
        parts[partition] = {"tokenizer_fingerprint": stats["tokenizer_fingerprint"], **stats["totals"]}
        if "tabular" in stats:
            tabular = _merge_tabular(tabular, stats["tabular"])
        base = f"shards/{partition}"
        for split, s in stats["splits"].items():
            metrics[split].append(s)
            files[split] += [{**f, "path": f"{base}/{f['path']}", "partition": partition} for f in s["files"]]
            for fmt, e in sorted(s.get("exports", {}).items()):
                where = {k: f"{base}/{e[k]}" for k in ("dir", "prefix") if k in e}
                exports[split].append({**e, **where, "format": fmt, "partition": partition,
                                       "files": [{**f, "path": f"{base}/{f['path']}"} for f in e["files"]]})
    L = spec.sequence.max_seq_len
    manifest = {
        "dataset": spec.name,
        "max_seq_len": L,
        "strategy": spec.packing.strategy,
        "config_hash": spec.fingerprint(),
        "tokenizer_fingerprint": tok["fingerprint"],
        "tokenizer_vocab_size": tok["info"]["vocab_size"],
        "pad_id": tok["info"]["pad_id"],
        "shard_tokenizer_fingerprints": sorted(fingerprints),
        "partitions": parts,
        "splits": {s: {**totals(metrics[s], L), "files": files[s], "exports": exports[s]} for s in SPLITS},
        "schema": {f.name: str(f.type) for f in SHARD_SCHEMA},
        **({"tabular": tabular} if tabular is not None else {}),
    }
    with partition_lock(paths.manifest_path):  # two refreshes at once take turns: each publishes a whole manifest
        problems = manifest_file_problems(paths.root, manifest)
        if problems:
            raise ManifestError(f"{paths.manifest_path} not published, {len(problems)} file(s) differ from what "
                                "their shards recorded (rebuild those drops): " + "; ".join(problems[:5]))
        failed = [o for o in manifest_outcomes(spec, paths, manifest) if not o.passed]
        if failed:  # the manifest's own gates judge it before trainers can read it
            raise ManifestError(f"{paths.manifest_path} not published: " + "; ".join(
                f"{o.name} failed ({o.violations} violation(s): {o.description})" for o in failed))
        write_json_atomic(paths.manifest_path, manifest)
    return manifest


def manifest_outcomes(spec: DatasetSpec, paths: DatasetPaths, manifest: dict[str, Any]) -> list[inv.Outcome]:
    """The manifest's gates, judged on a manifest (built or published): the asset checks run the same."""
    parts = [{"partition": k, **v} for k, v in manifest["partitions"].items()]
    outcomes = [inv.shards_one_tokenizer(parts, manifest["tokenizer_fingerprint"])]
    if spec.clean.dedup_scope == "dataset":
        partitions = sorted(manifest["partitions"])
        outcomes.append(inv.duplicates_resolve_to_kept([paths.partition_dir("silver", k) for k in partitions]))
    return outcomes


def manifest_file_problems(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Every file a manifest names (shards and exports, paths relative to `root`) checked against the sha256 (and
    size, where recorded) its shards step recorded: a manifest never names bytes that are not the recorded ones."""
    entries = [f for split in manifest["splits"].values()
               for f in [*split["files"], *(g for e in split["exports"] for g in e["files"])]]
    problems = []
    for entry in entries:
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']}: missing")
        elif "bytes" in entry and path.stat().st_size != entry["bytes"]:
            problems.append(f"{entry['path']}: {path.stat().st_size} bytes, {entry['bytes']} recorded")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 differs from the recorded one")
    return problems


def _merge_tabular(acc: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """The dataset's tabular section: the first partition's schema (in partition order); `initial_prefill` per
    group: the earliest 3 (by order_by) of the training records every partition kept for it."""
    if acc is None:
        acc = {**part, "initial_prefill": {} if part["mode"] == "sequential" else None}
    if acc["initial_prefill"] is None:
        return acc
    gathered = {g: list(v) for g, v in acc["initial_prefill"].items()}
    for group, records in (part.get("initial_prefill") or {}).items():
        gathered.setdefault(group, []).extend(records)
    acc["initial_prefill"] = initial_prefill(gathered, part.get("order_by"))
    return acc
