"""Turning layer stats into Dagster metadata a user can read in the UI."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import Failure, MetadataValue, TableColumn, TableRecord, TableSchema

from prep_assets.core.columns import describe, shown_columns
from prep_assets.core.decode import decode_examples, decode_row, render_examples, render_text
from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.stats import LayerStats


def worker() -> str:
    """`host:pid` of the process that ran the step: on the Celery executor a worker's, so the UI (and the
    distributed test) shows which machine built each partition."""
    return f"{socket.gethostname()}:{os.getpid()}"


@contextmanager
def user_errors() -> Iterator[None]:
    """Report a user-facing error as a Dagster failure with its message, not as a code traceback."""
    try:
        yield
    except PrepAssetsError as exc:
        raise Failure(description=str(exc)) from None


def column_schema(
    schema: pa.Schema, layer: str | None = None, input_type: str | None = None, domains: bool = False
) -> TableSchema:
    """The UI's column schema: each column's type and description (`core.columns`), without the columns a
    dataset of `input_type` (and without `domains`: the domain column) never fills."""
    names = shown_columns(schema.names, input_type, domains) if input_type else schema.names
    return TableSchema(
        columns=[
            TableColumn(name=n, type=str(schema.field(n).type), description=describe(n, layer) or None) for n in names
        ]
    )


def counts_table(counts: dict[str, int], key: str = "reason") -> MetadataValue:
    schema = TableSchema(columns=[TableColumn(key, "string"), TableColumn("count", "int")])
    records = [TableRecord({key: k, "count": int(v)}) for k, v in sorted(counts.items())]
    return MetadataValue.table(records=records, schema=schema)


def stats_metadata(stats: LayerStats) -> dict[str, Any]:
    """A layer's stats as the UI shows them: each figure under its label, a mapping as a table."""
    shown: dict[str, Any] = {}
    for f in stats.figures():
        if f.table == "counts":
            shown[f.label] = counts_table(f.value, key=f.key)
        elif f.table == "percentiles":
            shown[f.label] = md_table([f.value])
        elif f.table == "domain_counts":  # {domain: {figure: n}}: a row per domain
            shown[f.label] = md_table([{"domain": d, **figures} for d, figures in f.value.items()])
        else:
            shown[f.label] = f.value
    return shown


def md_table(rows: list[dict[str, Any]]) -> MetadataValue:
    if not rows:
        return MetadataValue.md("_none_")
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    return MetadataValue.md("\n".join(lines))


CELL = 120  # the most characters a table cell shows


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", "⏎")
    return text if len(text) <= CELL else text[: CELL - 3] + "..."


def preview(path: Path, columns: list[str], n: int = 3) -> MetadataValue:
    """A markdown table of the first rows of a Parquet file. Text is cut in Arrow to one character more than a
    cell shows before it reaches Python (a 12 MB record's text would otherwise be copied whole, several times)."""
    pf = pq.ParquetFile(str(path))
    if pf.metadata.num_rows == 0:
        return MetadataValue.md("_no rows_")
    batch = next(pf.iter_batches(batch_size=n, columns=columns)).slice(0, n)
    cut = [
        pc.utf8_slice_codeunits(c, 0, CELL + 1)
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)
        else c
        for c in batch.columns
    ]
    return md_table(pa.RecordBatch.from_arrays(cut, names=batch.schema.names).to_pylist())


MD_LINE = 50  # the widest line a metadata value's cell shows without cutting it off (1600 px window, navigation open)


def code_block(text: str, width: int = MD_LINE) -> MetadataValue:
    """`text` as a markdown code block whose lines are wrapped (not cut) at `width`: the UI cuts long lines off."""
    lines = []
    for line in text.split("\n"):
        lines.extend([line[i : i + width] for i in range(0, len(line), width)] or [""])
    return MetadataValue.md("```\n" + "\n".join(lines).replace("```", "`\u200b``") + "\n```")


def decoded_row(shard: Path, tokenizer_dir: Path, max_chars: int = 6000) -> MetadataValue:
    """Row 0 of a shard as `prep-assets decode` prints it: masked text in «…», one header per segment."""
    text = render_text(decode_row(shard, 0, tokenizer_dir))
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n… ({len(text) - max_chars} more characters: prep-assets decode {shard})"
    return code_block(text)


def decoded_examples(examples: Path, tokenizer_dir: Path, n: int = 3) -> MetadataValue:
    """The first gold examples decoded with the pinned tokenizer, masked text in «…»."""
    decoded = decode_examples(examples, tokenizer_dir, n)
    return code_block(render_examples(decoded)) if decoded else MetadataValue.md("_no examples_")
