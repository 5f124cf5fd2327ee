"""DuckDB connections for the gates and dedup: bounded memory, spilling to a temp folder beyond it.

A gate over tens of millions of tokens (token-by-token joins of shards and gold) would otherwise let DuckDB take
up to 80% of the machine; `PREP_ASSETS_DUCKDB_MEMORY` (default 1GB) is its budget per connection."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb

MEMORY_ENV = "PREP_ASSETS_DUCKDB_MEMORY"
DEFAULT_MEMORY = "1GB"


def connect() -> duckdb.DuckDBPyConnection:
    spill = Path(tempfile.gettempdir()) / "prep_assets_duckdb"
    spill.mkdir(exist_ok=True)
    return duckdb.connect(config={"memory_limit": os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY,
                                  "temp_directory": str(spill)})
