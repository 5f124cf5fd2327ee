"""What the invariants of every layer share: their `Outcome`, and running our own SQL over Parquet with every
value bound as a parameter, never interpolated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.errors import DropError
from prep_assets.core.sql import connect as sql_connect

SAMPLE = 20
MISSING = "missing"  # `integer_list_problems`' type of a column a file lacks


@dataclass(frozen=True)
class Outcome:
    """What an invariant found: the number of violations (0 passes), up to `SAMPLE` offending rows (ids and
    file:line where the layer has them) and the figures it measured.

    `description` is empty unless the evaluation has something to say beyond the count (a rate and its figures,
    the groups over budget and the remedies); a gate fills it with its own description otherwise, and fills in
    its `name` (`core.gates`: each gate's name and description are declared there, once)."""

    violations: int
    offending: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    name: str = ""

    @property
    def passed(self) -> bool:
        return self.violations == 0


def _query(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run `sql` with the named parameters it uses (`$name`); values are always bound, never interpolated."""
    with sql_connect() as con:
        return _rows_in(con, sql, params)


def _scalar(sql: str, params: dict[str, Any]) -> Any:
    rows = _query(sql, params)
    return next(iter(rows[0].values())) if rows else None


def _files(paths: list[Path]) -> list[str]:
    return [str(p) for p in paths]


def _violating_rows(
    source: str,
    where: str,
    columns: str,
    params: dict[str, Any],
    order: str = "source_line",
    tables: dict[str, pa.Table] | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """(count, first SAMPLE rows) of `source` matching `where`; `source` and `where` are our own SQL text, and
    `tables` Arrow tables the SQL names (registered under those fixed names).

    One pass over the data: the violating rows (normally none) are kept in a temp table, then counted and sampled."""
    with sql_connect() as con:
        for table_name, table in (tables or {}).items():
            con.register(table_name, table)
        return _violations_in(con, source, where, columns, params, order)


def _bound(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters `sql` uses (`$name`): DuckDB refuses unused ones."""
    used = set(re.findall(r"\$([A-Za-z_]\w*)", sql))
    return {k: v for k, v in params.items() if k in used}


def _violations_in(
    con: Any, source: str, where: str, columns: str, params: dict[str, Any], order: str
) -> tuple[int, list[dict[str, Any]]]:
    """`_violating_rows` on an open connection (whose temp tables `source` may name)."""
    sql = f"CREATE TEMP TABLE violations AS SELECT * FROM {source} WHERE {where}"
    con.execute(sql, _bound(sql, params))
    count = con.execute("SELECT count(*) FROM violations").fetchall()[0][0]
    cur = con.execute(f"SELECT {columns} FROM violations ORDER BY {order} LIMIT $n", {"n": SAMPLE})
    cols = [d[0] for d in cur.description]
    return int(count), [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def _rows_in(con: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, _bound(sql, params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


_LOCATION = "source_file || ':' || source_line AS location"


def _one_to_one(
    upstream: Path,
    outputs: tuple[Path, Path],
    kept_where: str = "true",
    kept_ids: str = "record_id",
) -> Outcome:
    """Each upstream record_id is exactly once among the two output tables (kept + rejected); `kept_ids` is the
    SQL naming the kept rows' record ids (our own text, e.g. an unnest of a list column)."""
    p = {"u": str(upstream), "a": str(outputs[0]), "b": str(outputs[1])}
    sql = f"""
        WITH out AS (SELECT {kept_ids} AS record_id FROM read_parquet($a) WHERE {kept_where}
                     UNION ALL SELECT record_id FROM read_parquet($b)),
             cnt AS (SELECT record_id, count(*) AS n FROM out GROUP BY record_id),
             up AS (SELECT record_id, {_LOCATION} FROM read_parquet($u))
        SELECT coalesce(up.record_id, cnt.record_id) AS record_id, up.location, coalesce(cnt.n, 0) AS times_out
        FROM up FULL OUTER JOIN cnt USING (record_id) WHERE coalesce(cnt.n, 0) <> 1 OR up.record_id IS NULL
    """
    n, bad = _violating_rows(f"({sql})", "true", "*", p, order="record_id")
    facts = {
        k: _scalar(f"SELECT count(*) FROM (SELECT {ids} FROM read_parquet($x) WHERE {w})", {"x": v})
        for k, v, w, ids in (
            ("upstream", p["u"], "true", "record_id"),
            ("kept", p["a"], kept_where, kept_ids),
            ("rejected", p["b"], "true", "record_id"),
        )
    }
    return Outcome(n, bad, facts)


def _kind_fits(found: pa.DataType, want: pa.DataType) -> bool:
    """Whether a column of type `found` reads as the schema's `want`: the same kind (an integer of any width for an
    integer, a string or large string for a string, a list or large list of that kind for a list; dictionary-encoded
    values read as their values)."""
    if pa.types.is_dictionary(found):
        found = found.value_type
    if pa.types.is_list(want):
        listed = pa.types.is_list(found) or pa.types.is_large_list(found)
        return listed and _kind_fits(found.value_type, want.value_type)
    if pa.types.is_integer(want):
        return pa.types.is_integer(found)
    if pa.types.is_string(want):
        return pa.types.is_string(found) or pa.types.is_large_string(found)
    return found.equals(want)


def _may_hold_nulls(meta: pq.FileMetaData, names: set[str]) -> set[str]:
    """Of the columns `names`, those whose statistics count a NULL (an empty list counts as one), or a scalar column
    without statistics. A list without them (our token lists: `ParquetSink`) is left to the row rules, which read
    every list and fail a NULL in one (gold's `mask_aligned`, the shards' `fixed_length`)."""
    out = set()
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            path = chunk.path_in_schema
            name, listed = path.split(".")[0], "." in path
            if name not in names:
                continue
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                if not listed:
                    out.add(name)
            elif stats.null_count:
                out.add(name)
    return out


def file_problems(path: Path, schema: pa.Schema, *, nulls: bool = True) -> list[dict[str, Any]]:
    """Each column of `schema` the Parquet file at `path` lacks, holds as another kind (`_kind_fits`), or holds a
    NULL in (a NULL list or value of a list) where the schema allows none. A file written by our own sinks has none:
    another writer's would be misjudged, as a comparison with a NULL is NULL, which a rule reads as passing. Read from
    the footer; a column's values only where its statistics count a NULL or an empty list (`_may_hold_nulls`)."""
    try:
        with pq.ParquetFile(path) as pf:
            return _problems(pf, path, schema, nulls)
    except (OSError, pa.ArrowException) as exc:
        return [{"file": str(path), "column": None, "type": f"not a readable Parquet file: {exc}"}]


def require_input(path: Path, schema: pa.Schema, *, remedy: str) -> None:
    """A build's check of the file of the layer before it reads: a `DropError` naming the file and each problem
    `file_problems` finds (a column missing, of another kind, holding a NULL where the schema allows none, or no
    readable Parquet at all), so another writer's file stops the build with what to do (`remedy`) rather than a
    traceback midway, or ids built from values the gates would have refused."""
    if not path.is_file():
        raise DropError(f"{path} is not there: {remedy}")
    problems = file_problems(path, schema)
    if problems:
        found = "; ".join(
            f"column {p['column']!r}: {p['type']}" if p["column"] is not None else str(p["type"]) for p in problems
        )
        raise DropError(f"{path} is not a file this pipeline writes ({found}): {remedy}")


def _problems(pf: pq.ParquetFile, path: Path, schema: pa.Schema, nulls: bool) -> list[dict[str, Any]]:
    found = pf.schema_arrow
    out: list[dict[str, Any]] = []
    wanted = set()
    for f in schema:
        at = found.get_field_index(f.name)
        kind = found.field(at).type if at >= 0 else None
        if kind is None or not _kind_fits(kind, f.type):
            out.append({"file": str(path), "column": f.name, "type": MISSING if kind is None else str(kind)})
        elif nulls and not f.nullable:
            wanted.add(f.name)
    doubtful = [f.name for f in schema if f.name in _may_hold_nulls(pf.metadata, wanted)]
    if doubtful:
        table = pf.read(columns=doubtful)
        for name in doubtful:
            column = table.column(name)
            count = column.null_count
            if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                count += sum(chunk.flatten().null_count for chunk in column.chunks)
            if count:
                out.append({"file": str(path), "column": name, "type": f"{column.type} holding {count} NULL"})
    return out


def integer_list_problems(files: list[Path], schema: pa.Schema) -> list[dict[str, str]]:
    """Per file, each column that `schema` (a layer's) holds as a list of integers and the file lacks or holds
    otherwise (`_kind_fits`), or the file when it is no readable Parquet. The gates read those lists as integers:
    DuckDB reads several files with the first one's types, and a cast to an integer rounds a float (0.4 is 0) or
    reads a string ('01' is 1)."""
    wanted = pa.schema([f for f in schema if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)])
    return [p for path in files for p in file_problems(path, wanted, nulls=False)]
