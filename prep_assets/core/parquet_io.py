"""Parquet in and out, with row groups of a fixed size so file bytes never depend on batch sizes."""

from __future__ import annotations

import gc
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.faults import write_point

DEFAULT_ROW_GROUP = 16_384

# Arrow's mimalloc pool keeps freed memory per thread, so one process running every layer would keep what each
# layer freed. `prep_assets/__init__.py` makes the system allocator Arrow's C++ default before pyarrow loads;
# where pyarrow was loaded first (by the caller), at least the pool pyarrow's own functions use is switched here.
# A user's ARROW_DEFAULT_MEMORY_POOL still wins.
if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") in (None, "", "system"):
    pa.set_memory_pool(pa.system_memory_pool())


def token_columns(schema: pa.Schema) -> set[str]:
    """Columns of integer lists (token ids, masks, positions): written without a dictionary or statistics.

    A dictionary of 50k token ids only grows until Parquet gives up on it, and min/max of list elements serve no
    reader: skipping both writes token columns faster for a slightly larger file."""
    return {f.name for f in schema if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)}


class ClosedOnExit:
    """`with` closes it (its `close`), whatever ends the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ParquetSink(ClosedOnExit):
    """Append record batches; rows are written in row groups of exactly `row_group_size` (last one shorter).

    An empty output still gets a file with the schema, so readers and checks never special-case absence.
    Row groups are encoded and compressed by one background thread (Arrow releases the GIL), in order, so the
    caller's Python goes on with the next batch meanwhile; at most two row groups wait. A failed row group stops
    the writing: its error is raised at the next write or at close (and at every one after), and close removes the
    file rather than leave one that reads as complete without the failed rows.
    """

    def __init__(
        self, path: Path, schema: pa.Schema, *, compression: str = "zstd", row_group_size: int = DEFAULT_ROW_GROUP
    ) -> None:
        self.path = path
        self.schema = schema
        self.row_group_size = row_group_size
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        plain = token_columns(schema)
        # Parquet names a list's values by their leaf path: `example_ids.list.element`
        rest = [
            f"{f.name}.list.element" if pa.types.is_list(f.type) else f.name for f in schema if f.name not in plain
        ]
        self._writer = pq.ParquetWriter(
            str(path),
            schema,
            compression=None if compression == "none" else compression,
            write_page_index=False,
            use_dictionary=rest,
            write_statistics=rest,
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-sink")
        self._inflight: deque[Future[None]] = deque()
        self._failed: BaseException | None = None

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if table.num_rows == 0:
            return
        self._pending.append(table.cast(self.schema) if table.schema != self.schema else table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        while self._pending_rows >= self.row_group_size:
            self._flush(self.row_group_size)

    def write_rows(self, columns: dict[str, pa.Array]) -> None:
        self.write(pa.Table.from_pydict(columns, schema=self.schema))

    def _flush(self, n: int) -> None:
        write_point()
        self._collect(wait_below=2)
        merged = pa.concat_tables(self._pending)
        self._inflight.append(self._pool.submit(self._write_group, merged.slice(0, n)))
        rest = merged.slice(n)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _collect(self, wait_below: int) -> None:
        """Raise the first failed row group's error (again, at every later call); wait until fewer than
        `wait_below` row groups are in flight."""
        if self._failed is not None:
            raise self._failed
        while self._inflight and (len(self._inflight) >= wait_below or self._inflight[0].done()):
            try:
                self._inflight.popleft().result()
            except BaseException as exc:
                self._failed = exc
                raise

    def _write_group(self, group: pa.Table) -> None:
        if self._failed is not None:  # a row group failed before this one: write nothing after it
            return
        # One contiguous chunk per row group: page boundaries then never depend on how batches arrived.
        try:
            self._writer.write_table(group.combine_chunks(), row_group_size=group.num_rows)
        except BaseException as exc:
            self._failed = exc
            raise

    def close(self) -> None:
        try:
            if self._pending_rows and self._failed is None:
                self._flush(self._pending_rows)
            self._collect(wait_below=1)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)  # nothing is written after the file is closed
            self._writer.close()
            if self._failed is not None:  # a file missing row groups must not look complete
                self.path.unlink(missing_ok=True)


def iter_batches(path: Path, *, batch_size: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches, the next one decoded on a background thread while the caller works on this one."""
    # pre_buffer (Arrow's default) reads ahead the column chunks of many row groups at once: memory, no speed
    pf = pq.ParquetFile(str(path), pre_buffer=False)
    batches = pf.iter_batches(batch_size=batch_size, columns=columns)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-read") as pool:
        ahead = pool.submit(next, batches, None)
        while (batch := ahead.result()) is not None:
            ahead = pool.submit(next, batches, None)
            yield batch


def num_rows(path: Path) -> int:
    return pq.ParquetFile(str(path)).metadata.num_rows


DEFAULT_BATCH = 4096


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a layer's records (bronze's and gold's record loops, silver's whole pass).
    They make millions of short-lived objects (parsed JSON, token id lists) that nothing cycles through; with the
    collector on, each full collection walks the whole process' heap (the Dagster process': large). Refcounting
    still frees everything; the collector is on again afterwards, error or not."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _columns(rows: list[dict[str, Any]], schema: pa.Schema) -> dict[str, list[Any]]:
    return {name: [r[name] for r in rows] for name in schema.names}


class ColumnBuffer:
    """Collects rows as one list per column (no dict per row) and hands them to a sink in batches; `constant`
    columns hold one value for every row. Positional `add` follows the sink schema's other columns, in order."""

    def __init__(self, sink: ParquetSink, batch: int, constant: dict[str, Any]) -> None:
        self.sink, self.batch, self.constant = sink, batch, constant
        self.names = [n for n in sink.schema.names if n not in constant]
        self.columns: list[list[Any]] = [[] for _ in self.names]

    def add(self, *values: Any) -> None:
        columns = self.columns
        if len(values) != len(columns):
            raise ValueError(f"{len(values)} values for the {len(columns)} columns {self.names}")
        for column, value in zip(columns, values):
            column.append(value)
        if len(columns[0]) >= self.batch:
            self.flush()

    def flush(self) -> None:
        n = len(self.columns[0])
        if n:
            columns = dict(zip(self.names, self.columns, strict=True))
            self.sink.write_rows(
                {
                    name: columns[name] if name in columns else [self.constant[name]] * n
                    for name in self.sink.schema.names
                }
            )
            self.columns = [[] for _ in self.names]


class RowBuffer:
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
