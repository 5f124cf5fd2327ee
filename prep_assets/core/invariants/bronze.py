"""Bronze invariants: every line of a drop accounted for (recounted independently of the reader), the reject
rate, and the fields every record must carry."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv

from prep_assets.core.invariants.common import _LOCATION, SAMPLE, Outcome, _query, _scalar, _violating_rows
from prep_assets.core.lake import read_json


def count_lines(path: Path, fmt: str, limit: int | None = None) -> int | None:
    """Physical lines of a line-format drop, counted independently of the reader.

    None where the stream itself is broken (a truncated or corrupt gzip) or inflates past `limit` (where the
    reader stopped too): the reader's count then stands.
    """
    opener = gzip.open if fmt == "jsonl.gz" else open
    n, last, size = 0, b"\n", 0
    try:
        with opener(path, "rb") as f:
            while block := f.read(1 << 20):
                n += block.count(b"\n")
                last = block[-1:]
                size += len(block)
                if limit is not None and size > limit:
                    return None
    except (EOFError, OSError, zlib.error):
        return None
    return n + (0 if last == b"\n" else 1)


def count_elements(path: Path) -> int | None:
    """Elements of a JSON-array drop, parsed independently of the reader; None if it is no valid array.

    orjson first: its nesting limit (1024) does not depend on how deep the caller's stack is, as json's does."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:  # also what orjson refuses and json reads: NaN, lone surrogates
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
    return len(value) if isinstance(value, list) else None


def _has_bare_cr(path: Path) -> bool:
    """Whether the file holds a carriage return that does not start a `\r\n`."""
    with path.open("rb") as f:
        carried = False  # the last chunk ended with \r
        while chunk := f.read(1 << 22):
            if carried and not chunk.startswith(b"\n"):
                return True
            if chunk.count(b"\r") - chunk.count(b"\r\n") - chunk.endswith(b"\r") > 0:
                return True
            carried = chunk.endswith(b"\r")
        return carried


def count_csv_rows(path: Path) -> int | None:
    """Data rows of a CSV (header excluded, blank lines skipped), parsed by Arrow rather than the reader, ragged
    rows (more or fewer fields than the header, a quote never closed) counted as rows; None where Arrow cannot
    parse it at all (a row over Arrow's block) or where it splits rows elsewhere than the reader: Arrow ends a
    line at a bare `\r`, the reader at `\n` only. The reader's count then stands."""
    if _has_bare_cr(path):
        return None
    ragged = 0

    def count_ragged(row: Any) -> str:
        nonlocal ragged
        text = row.text.strip()
        # the reader's blank line: one field of whitespace (or an empty quoted one), not a row
        if row.actual_columns != 1 or text.strip('"').strip() or (text.startswith('"') and not text.endswith('"')):
            ragged += 1
        return "skip"

    try:
        with pacsv.open_csv(
            str(path),
            read_options=pacsv.ReadOptions(block_size=1 << 22),
            convert_options=pacsv.ConvertOptions(column_types={}, strings_can_be_null=False),
            parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=count_ragged),
        ) as reader:
            return sum(batch.num_rows for batch in reader) + ragged
    except (pa.ArrowInvalid, OSError):
        return None


def count_parquet_rows(path: Path) -> int | None:
    """Rows of a Parquet file by DuckDB (not the reader); None where DuckDB cannot read it."""
    try:
        return int(_scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(path)}))
    except duckdb.Error:
        return None


def bronze_accounted(bronze_dir: Path, source: Path | None) -> Outcome:
    """Every input line is a record, a reject or a blank line (records + rejects + blank = lines in)."""
    acct = read_json(bronze_dir / "accounting.json")
    records = _scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(bronze_dir / "records.parquet")})
    rejects = _scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(bronze_dir / "rejects.parquet")})
    lines_in = acct["lines_in"]
    recount = None
    if source is not None and source.is_file():
        if acct["unit"] == "line":
            recount = count_lines(source, acct["format"], acct.get("gzip_limit"))
        elif acct["unit"] == "row" and acct["format"] == "parquet":
            recount = count_parquet_rows(source)
        elif acct["unit"] == "row":
            recount = count_csv_rows(source)
            recount = None if recount is None else recount + acct["blank_lines"]
        else:
            recount = count_elements(source)
        lines_in = recount if recount is not None else lines_in
    accounted = records + rejects + acct["blank_lines"]
    facts = {
        "lines_in": lines_in,
        "records": records,
        "rejects": rejects,
        "blank_lines": acct["blank_lines"],
        "unit": acct["unit"],
        "independent_line_count": recount,
    }
    offending = [] if lines_in == accounted else [{"lines_in": lines_in, "accounted": accounted, **facts}]
    return Outcome(abs(lines_in - accounted), offending, facts)


def bronze_reject_rate(bronze_dir: Path, max_rate: float) -> Outcome:
    """The share of rejected lines is within the dataset's threshold."""
    p = {"r": str(bronze_dir / "records.parquet"), "j": str(bronze_dir / "rejects.parquet")}
    records = _scalar("SELECT count(*) FROM read_parquet($r)", {"r": p["r"]})
    rejects = _scalar("SELECT count(*) FROM read_parquet($j)", {"j": p["j"]})
    total = records + rejects
    rate = rejects / total if total else 0.0
    offending = []
    if rate > max_rate:
        offending = _query(
            f"SELECT {_LOCATION}, byte_offset, reason, detail FROM read_parquet($j) ORDER BY source_line LIMIT $n",
            {"j": p["j"], "n": SAMPLE},
        )
    by_reason = {
        r["reason"]: r["n"]
        for r in _query(
            "SELECT reason, count(*) AS n FROM read_parquet($j) GROUP BY reason ORDER BY reason", {"j": p["j"]}
        )
    }
    facts = {"reject_rate": round(rate, 6), "max_reject_rate": max_rate, "rejects_by_reason": by_reason}
    said = ""
    if rate > max_rate:  # the figures, not only the rule: what a failed run prints
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])))
        said = f"{rejects} of {total} records rejected ({rate:.2%}) > max_reject_rate {max_rate:.2%}: {reasons}"
    return Outcome(int(rate > max_rate), offending, facts, said)


def bronze_required_fields(bronze_dir: Path) -> Outcome:
    """Every record has its provenance, a unique id and valid JSON content."""
    # the columns judged, not `*`: the raw `record` text (the drop's size again) is not read
    source = (
        "(SELECT record_id, source_file, source_line, byte_offset, content, "
        "count(*) OVER (PARTITION BY record_id) AS copies FROM read_parquet($r))"
    )
    where = (
        "record_id IS NULL OR source_file IS NULL OR source_line IS NULL OR byte_offset IS NULL "
        "OR content IS NULL OR NOT json_valid(content) OR copies > 1"
    )
    n, bad = _violating_rows(source, where, f"record_id, {_LOCATION}", {"r": str(bronze_dir / "records.parquet")})
    return Outcome(n, bad)
