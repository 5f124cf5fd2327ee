"""DuckDB connections for the gates and dedup: bounded memory, spilling to a temp folder beyond it.

A gate over tens of millions of tokens (token-by-token joins of shards and gold) would otherwise let DuckDB take
up to 80% of the machine; `PREP_ASSETS_DUCKDB_MEMORY` (default 1GB) is its budget per connection."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import duckdb

MEMORY_ENV = "PREP_ASSETS_DUCKDB_MEMORY"
DEFAULT_MEMORY = "1GB"

_SHARED: ContextVar[duckdb.DuckDBPyConnection | None] = ContextVar("prep_assets_shared_duckdb", default=None)


def _database() -> duckdb.DuckDBPyConnection:
    spill = Path(tempfile.gettempdir()) / "prep_assets_duckdb"
    spill.mkdir(exist_ok=True)
    return duckdb.connect(
        config={"memory_limit": os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY, "temp_directory": str(spill)}
    )


def connect() -> duckdb.DuckDBPyConnection:
    """A connection of its own: to a new in-memory database, or, inside `shared_database`, a cursor of that one
    (its own temp tables and registered tables, the database's memory)."""
    shared = _SHARED.get()
    return _database() if shared is None else shared.cursor()


@contextmanager
def shared_database() -> Iterator[None]:
    """Within this block `connect` gives cursors of one database rather than a database each. The gates of one
    asset run this way: a database per gate pays its start and faults in again the memory the last one gave back."""
    db = _database()
    token = _SHARED.set(db)
    try:
        yield
    finally:
        _SHARED.reset(token)
        db.close()


# the joins of a query run as written, its right side the hash table: DuckDB estimates an unnest at the rows it
# reads, not the ones it makes, so it built the table on a long example's tokens rather than on its segments
AS_WRITTEN = "build_side_probe_side,join_order"


@contextmanager
def joins_as_written(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Within this block, queries on `con` join in the order and with the build sides they are written in. The
    setting is the database's, not the cursor's: it is put back on the way out."""
    before = con.execute("SELECT current_setting('disabled_optimizers')").fetchall()[0][0]
    con.execute("SET disabled_optimizers = $v", {"v": AS_WRITTEN})
    try:
        yield
    finally:
        con.execute("SET disabled_optimizers = $v", {"v": before or ""})
