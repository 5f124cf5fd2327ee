"""Bronze: a drop's records as written, with provenance; every unreadable one a reject with its reason."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from prep_assets.core.drops import Drop, format_of, resolve_drop
from prep_assets.core.errors import DropError
from prep_assets.core.lake import (
    ACCOUNTING,
    RECORDS,
    REJECTS,
    DatasetPaths,
    canonical_json,
    staged_dir,
    write_json_atomic,
)
from prep_assets.core.parquet_io import DEFAULT_BATCH, ColumnBuffer, ParquetSink, RowBuffer, gc_paused
from prep_assets.core.progress import Progress
from prep_assets.core.readers import Accounting, RawItem, RawReject, gzip_limit, read_drop
from prep_assets.core.record_types import record_type
from prep_assets.core.records import (
    BRONZE_REJECT_SCHEMA,
    BRONZE_SCHEMA,
    CATEGORY,
    DEFAULT_DOMAIN,
    Extractor,
    Invalid,
    TabularExtractor,
)
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import InputSpec, TabularSpec
from prep_assets.core.stats import LayerStats, figure
from prep_assets.core.tabular import infer_column_types


def drop_format(spec: DatasetSpec, drop: Drop) -> str:
    fmt = spec.input.format if spec.input.format != "auto" else format_of(drop.file)
    if fmt is None:
        raise DropError(f"{drop.file}: no reader for this file name; set input.format in the spec")
    return fmt


def _extractor(spec: DatasetSpec, fmt: str, source: Path, drop: Drop) -> Extractor:
    """The record type's extractor. For tables, a first read fixes the drop's schema: CSV cells' column types
    (the group_by column stays text unless typed in the spec: it names groups), and for JSON rows the union
    of their keys in first-seen order."""
    kind = record_type(spec.input.type)
    if kind.extract is not None:
        return kind.extract
    tab = spec.tabular or TabularSpec()
    if fmt == "txt":
        raise DropError(f"{drop.file}: tabular input reads rows (csv, parquet, jsonl, json), not txt lines")
    if fmt == "parquet":
        return TabularExtractor(tab, drop.file)
    items = (
        r.value
        for r in read_drop(source, fmt, max_line_bytes=spec.input.max_line_bytes, acct=Accounting())
        if isinstance(r, RawItem)
    )
    if fmt == "csv":
        overrides = {**({tab.group_by: "string"} if tab.group_by else {}), **tab.column_types}
        return TabularExtractor(tab, drop.file, csv_types=infer_column_types(items, tab.null_values, overrides))
    columns: dict[str, None] = {}
    for value in items:
        if isinstance(value, dict):
            columns.update(dict.fromkeys(k for k in value if k))  # a row with an unnamed column is its reject
    return TabularExtractor(tab, drop.file, columns=list(columns) or None)


# What the Parquet writer raises for a value it cannot store (a lone surrogate): that record's reject, not the drop's
_UNSTORABLE = (UnicodeEncodeError, pa.ArrowException, OverflowError)


def record_domain(value: Any, key: str) -> tuple[str | None, str | None]:
    """The record's domain under `key` (None: the record names none), or why it cannot be one."""
    domain = value.get(key) if isinstance(value, dict) else None
    if domain == DEFAULT_DOMAIN:
        return None, (
            f"{key!r} is {DEFAULT_DOMAIN!r}, the name kept for records that name no domain: the two would be "
            "counted and written as one; rename the domain"
        )
    if domain is None or isinstance(domain, str) and domain:
        return domain, None
    return None, f"{key!r} must be a non-empty string to name a domain, not {json.dumps(domain)[:60]}"


def record_category(value: Any, spec: InputSpec) -> tuple[int | None, str | None, str | None]:
    """gdp's category of a record (`input.category_key` of the line, of each pair of a dialogue): its id (the
    position in `input.categories`; None when the record names none), or a reject's reason and detail."""
    assert spec.categories is not None
    key, names = spec.category_key, spec.categories
    items = value if isinstance(value, list) else [value]
    named = [item[key] for item in items if isinstance(item, dict) and item.get(key) is not None]
    unnamed = [v for v in named if isinstance(v, (list, dict))]
    if unnamed:
        return (
            None,
            "unknown_category",
            f"{key!r} is {json.dumps(unnamed[0])[:60]}: a list or object names no category of input.categories "
            f"{names}",
        )
    found = set(named)
    if len(found) > 1:
        return (
            None,
            "mixed_categories",
            f"the pairs of the line name {len(found)} categories {sorted(map(str, found))}",
        )
    if not found:
        return None, None, None
    (name,) = found
    if name not in names:
        return None, "unknown_category", f"{key!r} is {json.dumps(name)[:60]}, not one of input.categories {names}"
    return names.index(name), None, None


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
                return "invalid_unicode", (
                    f"{name}: lone surrogate \\u{ord(value[exc.start]):04x} at character "
                    f"{exc.start}: UTF-8 cannot encode it"
                )
    return None


class _BronzeRecords(ColumnBuffer):
    """Bronze's records; a row the Parquet writer refuses becomes a reject through `reject` rather than the
    drop's failure (the readers reject such values first: this is only the last line)."""

    def __init__(
        self,
        sink: ParquetSink,
        batch: int,
        constant: dict[str, Any],
        reject: Callable[[dict[str, Any], str, str], None],
        progress: Progress,
        size: int,
    ) -> None:
        super().__init__(sink, batch, constant)
        self.reject, self.progress, self.size = reject, progress, size
        self.offset = self.names.index("byte_offset")

    def flush(self) -> None:
        n = len(self.columns[0])
        if n:  # the share done: the last row's byte offset in the file (gzip: of the text, so no share)
            at = self.columns[self.offset][-1] / self.size if self.size else None
            self.progress.advance(n, at if at is not None and at <= 1 else None)
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


@dataclass(frozen=True, kw_only=True)
class BronzeStats(LayerStats):
    """A drop's bronze (`accounting.json`): where its lines went."""

    drop: str = figure()
    file: str = figure("source_file")
    sha256: str = figure("source_sha256")
    format: str = figure("format")
    unit: str = figure()  # what a record is: a line, or an element of a JSON array
    lines_in: int = figure("lines_in")
    blank_lines: int = figure("blank_lines")
    records: int = figure("dagster/row_count")
    rejects: int = figure("num_rejects")
    rejects_by_reason: dict[str, int] = figure("rejects_by_reason", table="counts")
    spec_version: str = figure()
    gzip_limit: int | None = figure(optional=True)  # the accounting gate's recount stops where the reader had to


def build(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH) -> BronzeStats:
    """A registered drop's bronze, in the lake."""
    drop, source = resolve_drop(paths, partition)
    return build_raw_records(spec, drop, source, paths.partition_dir("bronze", partition), batch_size=batch_size)


def build_raw_records(
    spec: DatasetSpec, drop: Drop, source: Path, out_dir: Path, *, batch_size: int = DEFAULT_BATCH
) -> BronzeStats:
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
            rejects = RowBuffer(rej_sink, batch_size)

            def reject(line: int, offset: int, reason: str, detail: str, excerpt: str) -> None:
                reasons[reason] += 1
                rejects.add(
                    {
                        **where,
                        "source_line": line,
                        "byte_offset": offset,
                        "reason": reason,
                        "detail": _shown(detail),
                        "excerpt": _shown(excerpt[:160]),
                    }
                )

            records = _BronzeRecords(
                rec_sink,
                batch_size,
                where,
                lambda row, reason, detail: reject(
                    row["source_line"], row["byte_offset"], reason, detail, row["record"]
                ),
                Progress(f"bronze {drop.partition}: reading"),
                0 if fmt == "jsonl.gz" else source.stat().st_size,
            )
            with gc_paused():
                for item in read_drop(
                    source,
                    fmt,
                    max_line_bytes=spec.input.max_line_bytes,
                    acct=acct,
                    max_gzip_ratio=spec.input.max_gzip_ratio,
                    typed_columns=spec.tabular.column_types if spec.tabular is not None else (),
                    keep_line_ends=spec.input.keep_line_ends,
                ):
                    if isinstance(item, RawReject):
                        reject(item.line, item.byte_offset, item.reason, item.detail, item.excerpt)
                        continue
                    content = extract(item.value, spec.input)
                    if isinstance(content, Invalid):
                        reject(item.line, item.byte_offset, content.reason, content.detail, item.text)
                        continue
                    if spec.input.categories is not None:  # gdp's category travels in the content to gold
                        category, reason, detail = record_category(item.value, spec.input)
                        if reason is not None:
                            reject(item.line, item.byte_offset, reason, detail or "", item.text)
                            continue
                        if category is not None:
                            content = {**content, CATEGORY: category}
                    try:
                        canonical = canonical_json(content)
                    except (ValueError, RecursionError) as exc:
                        reject(
                            item.line, item.byte_offset, "unstorable_value", f"{type(exc).__name__}: {exc}", item.text
                        )
                        continue
                    domain = None
                    if spec.input.domain_key is not None:
                        domain, problem = record_domain(item.value, spec.input.domain_key)
                        if problem is not None:
                            reject(item.line, item.byte_offset, "invalid_domain", problem, item.text)
                            continue
                    record_id = f"{drop.partition}:{item.line}"
                    if acct.unit == "element":  # several array elements may share a line
                        record_id += f"#{element_no[item.line]}"
                        element_no[item.line] += 1
                    records.add(record_id, item.line, item.byte_offset, item.sha256, item.text, canonical, domain)
            records.flush()
            rejects.flush()
        stats = BronzeStats(
            drop=drop.partition,
            file=drop.file,
            sha256=drop.sha256,
            format=fmt,
            unit=acct.unit,
            lines_in=acct.lines_in,
            blank_lines=acct.blank_lines,
            records=rec_sink.rows,
            rejects=rej_sink.rows,
            rejects_by_reason=dict(sorted(reasons.items())),
            spec_version=spec.layer_version("bronze"),
            gzip_limit=gzip_limit(source, spec.input.max_gzip_ratio) if fmt == "jsonl.gz" else None,
        )
        write_json_atomic(stage / ACCOUNTING, stats.as_json())
    return stats


# ---------------------------------------------------------------- silver
