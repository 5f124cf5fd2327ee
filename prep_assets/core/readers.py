"""Readers: a drop's bytes to parsed values with provenance, and rejects for what does not parse.

Every physical line is accounted for: it becomes a parsed item, a reject (with line, byte offset and
reason) or a blank line. Byte offsets count from the start of the (decompressed) stream. Lines are
split on `\\n` only, so U+2028/U+2029/NEL or a lone `\\r` inside a record never split it.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.errors import DropError
from prep_assets.core.lake import JSON_MAX_DEPTH, loads_json

UTF8_BOM = b"\xef\xbb\xbf"
EXCERPT_CHARS = 160


@dataclass(frozen=True)
class RawItem:
    """One parsed input record: its value and where it came from."""

    line: int  # 1-based line where the record starts
    byte_offset: int
    text: str  # the record as written (decoded, without line terminator)
    value: Any
    sha256: str  # of the record's bytes as written


@dataclass(frozen=True)
class RawReject:
    line: int
    byte_offset: int
    reason: str
    detail: str
    excerpt: str


@dataclass
class Accounting:
    """What a reader saw; `lines_in == parsed + rejected + blank_lines` for line formats."""

    unit: str = "line"  # "line" for line formats, "element" for a JSON array
    lines_in: int = 0
    blank_lines: int = 0
    parsed: int = 0
    rejected: int = 0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: as much a non-number as the Infinity literal
        raise ValueError(f"non-standard JSON constant: {text} is out of the float range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
NESTING_TOO_DEEP = f"nesting too deep: more than {JSON_MAX_DEPTH} levels of arrays and objects"
# A \uD800-\uDFFF escape: the only way a lone surrogate gets into text that decoded as UTF-8
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# A JSON string or one bracket: to find where an element too deep to parse ends
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[][{}]')


class _Unkeepable(ValueError):
    """A JSON value that parses but cannot be kept; `reason` and the message make its reject."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _shown(text: str) -> str:
    """`text` with lone surrogates written as escapes, so a detail that quotes it can be stored."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _lone_surrogate(text: str, where: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f'lone surrogate \\u{ord(text[exc.start]):04x} (UTF-8 cannot encode it) in {where}: "{_shown(text[:80])}"'
        )
    return None


def _unkeepable(value: Any, text: str, start: int = 0, end: int | None = None) -> tuple[str, str] | None:
    """Why a value the json module read from `text[start:end]` cannot be kept, or None: nested deeper than
    `JSON_MAX_DEPTH`, or a key or string holding a lone surrogate. The text is searched first (at C speed); the
    value is walked only where the text could hold either."""
    end = len(text) if end is None else end
    deep = text.count("[", start, end) + text.count("{", start, end) > JSON_MAX_DEPTH
    surrogates = _SURROGATE_ESCAPE.search(text, start, end) is not None
    if not (deep or surrogates):
        return None
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]  # a loop, not recursion: the value may nest deeply
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            problem = _lone_surrogate(item, f"the string at {path}") if surrogates else None
            if problem:
                return "invalid_unicode", problem
        elif isinstance(item, (dict, list)):
            if depth > JSON_MAX_DEPTH:
                return "malformed_json", NESTING_TOO_DEEP
            if isinstance(item, list):
                stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item))
                continue
            for k, v in item.items():
                problem = _lone_surrogate(k, f"a key at {path}") if surrogates else None
                if problem:
                    return "invalid_unicode", problem
                stack.append((v, depth + 1, f"{path}.{_shown(k)}"))
    return None


def _decode_keepable(text: str) -> Any:
    """The json module's reading of `text` (what orjson does not read alike), refused if it cannot be kept."""
    value = _DECODER.decode(text)
    problem = _unkeepable(value, text)
    if problem is not None:
        raise _Unkeepable(*problem)
    return value


def _value_end(text: str, pos: int) -> int | None:
    """Where the array or object that starts at `pos` closes (brackets counted outside strings); None if never."""
    depth = 0
    for m in _STRUCTURE.finditer(text, pos):
        c = m.group()
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return m.end()
    return None


GZIP_MIN_LIMIT = 256 * 1024 * 1024


def gzip_limit(path: Path, ratio: float) -> int:
    """The most a .gz drop may decompress to: `ratio` x its size, at least 256 MiB (a gzip bomb stops there)."""
    return max(GZIP_MIN_LIMIT, int(ratio * path.stat().st_size))


def _excerpt(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    return text[:EXCERPT_CHARS]


def _parse_json(text: str) -> tuple[Any, str | None, str]:
    try:  # orjson's values are kept as they are: it refuses lone surrogates and `loads_json` deep nesting
        return loads_json(text, _decode_keepable), None, ""
    except _Unkeepable as exc:
        return None, exc.reason, str(exc)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is a rejected NaN/Infinity
        reason = "invalid_json_constant" if "constant" in str(exc) else "malformed_json"
        return None, reason, str(exc)
    except RecursionError:
        return None, "malformed_json", NESTING_TOO_DEEP


def _open_stream(path: Path, fmt: str) -> IO[bytes]:
    if fmt == "jsonl.gz":
        return gzip.open(path, "rb")
    return path.open("rb")


def read_lines(
    path: Path, fmt: str, *, max_line_bytes: int, acct: Accounting, max_gzip_ratio: float = 100.0
) -> Iterator[RawItem | RawReject]:
    """JSONL / JSONL.gz / TXT: one record per line. A .gz drop stops at `gzip_limit` decompressed bytes."""
    as_json = fmt != "txt"
    offset = 0
    line_no = 0
    limit = gzip_limit(path, max_gzip_ratio) if fmt == "jsonl.gz" else None

    def bomb(line: int, at: int, excerpt: str) -> RawReject:
        """The rest of the file from `line` as one reject: the stream inflated past the limit."""
        acct.rejected += 1
        return RawReject(
            line,
            at,
            "decompression_limit",
            f"the gzip stream inflates past {limit} bytes ({max_gzip_ratio:g} x its "
            f"{path.stat().st_size} bytes, at least {GZIP_MIN_LIMIT}): a gzip bomb? the rest of the "
            "file is not read; raise input.max_gzip_ratio if the data is real",
            excerpt,
        )

    with _open_stream(path, fmt) as f:
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except (EOFError, OSError, zlib.error) as exc:
                acct.lines_in += 1
                acct.rejected += 1
                yield RawReject(line_no + 1, offset, "truncated_gzip", f"stream ends early: {exc}", "")
                return
            if not raw:
                return
            line_no += 1
            acct.lines_in += 1
            start = offset
            offset += len(raw)
            if limit is not None and offset > limit:
                yield bomb(line_no, start, _excerpt(raw[:EXCERPT_CHARS]))
                return
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                excerpt = _excerpt(raw[:EXCERPT_CHARS])
                size = len(raw)
                while raw and not raw.endswith(b"\n"):  # skip the rest of the line in bounded chunks
                    del raw  # not held while the next chunk is read
                    raw = f.readline(max_line_bytes)
                    size += len(raw)
                    offset += len(raw)
                    if limit is not None and offset > limit:
                        yield bomb(line_no, start, excerpt)
                        return
                acct.rejected += 1
                yield RawReject(
                    line_no, start, "line_too_long", f"{size} bytes > max_line_bytes {max_line_bytes}", excerpt
                )
                continue
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if line_no == 1 and body.startswith(UTF8_BOM):
                body = body[len(UTF8_BOM) :]
            if body.endswith(b"\r"):
                body = body[:-1]
            if not body.strip():
                acct.blank_lines += 1
                continue
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                acct.rejected += 1
                yield RawReject(
                    line_no, start, "invalid_utf8", f"byte {exc.start} of the line: {exc.reason}", _excerpt(body)
                )
                continue
            if as_json:
                value, reason, detail = _parse_json(text)
                if reason is not None:
                    acct.rejected += 1
                    yield RawReject(line_no, start, reason, detail, _excerpt(text))
                    continue
            else:
                value = text
            acct.parsed += 1
            yield RawItem(line_no, start, text, value, hashlib.sha256(body).hexdigest())


def read_json_array(path: Path, *, max_bytes: int, acct: Accounting) -> Iterator[RawItem | RawReject]:
    """A JSON file holding an array of records: each element keeps its own line and byte offset.

    Accounting is per element: every element is a parsed item or a reject, and anything that is not an
    element (a broken tail, content after the closing bracket) is one reject.
    """
    acct.unit = "element"
    size = path.stat().st_size
    if size > max_bytes:
        raise DropError(
            f"{path}: JSON array file of {size} bytes exceeds {max_bytes}; convert it to JSONL to stream it"
        )
    data = path.read_bytes()
    bom = len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0

    def reject(line: int, offset: int, reason: str, detail: str, excerpt: str) -> RawReject:
        acct.lines_in += 1
        acct.rejected += 1
        return RawReject(line, offset, reason, detail, excerpt)

    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        yield reject(
            data[: exc.start + bom].count(b"\n") + 1,
            exc.start + bom,
            "invalid_utf8",
            f"{exc.reason}; the whole array is unreadable",
            "",
        )
        return
    line, byte_pos, char_pos = 1, bom, 0

    def advance(to: int) -> None:
        nonlocal line, byte_pos, char_pos
        chunk = text[char_pos:to]
        line += chunk.count("\n")
        byte_pos += len(chunk.encode("utf-8"))
        char_pos = to

    pos = _skip_ws(text, 0)
    if pos >= len(text):
        return  # an empty file holds no records
    advance(pos)
    if text[pos] != "[":
        yield reject(
            line,
            byte_pos,
            "not_a_json_array",
            "format json expects a top-level array of records",
            _excerpt(text[pos:]),
        )
        return
    pos = _skip_ws(text, pos + 1)
    closed = pos < len(text) and text[pos] == "]"
    while pos < len(text) and not closed:
        advance(pos)
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except ValueError as exc:
            reason = "invalid_json_constant" if "constant" in str(exc) else "malformed_json"
            yield reject(line, byte_pos, reason, f"{exc}; the rest of the array is unreadable", _excerpt(text[pos:]))
            return
        except RecursionError:
            found = _value_end(text, pos)
            if found is None:
                yield reject(
                    line,
                    byte_pos,
                    "malformed_json",
                    f"{NESTING_TOO_DEEP}; the element never closes: the rest of the array is unreadable",
                    _excerpt(text[pos:]),
                )
                return
            value, end = None, found
            problem: tuple[str, str] | None = ("malformed_json", NESTING_TOO_DEEP)
        else:
            problem = _unkeepable(value, text, pos, end)
        element = text[pos:end]
        if problem is not None:
            yield reject(line, byte_pos, *problem, _excerpt(element))
        else:
            acct.lines_in += 1
            acct.parsed += 1
            yield RawItem(line, byte_pos, element, value, hashlib.sha256(element.encode("utf-8")).hexdigest())
        pos = _skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
        elif pos < len(text) and text[pos] == "]":
            closed = True
        else:
            advance(min(pos, len(text)))
            yield reject(
                line, byte_pos, "malformed_json", "expected ',' or ']' after an array element", _excerpt(text[pos:])
            )
            return
    if not closed:
        advance(len(text))
        yield reject(line, byte_pos, "malformed_json", "the array is not closed with ']'", "")
        return
    tail = _skip_ws(text, pos + 1)
    if tail < len(text):
        advance(tail)
        yield reject(
            line, byte_pos, "trailing_content", "content after the closing ']' of the array", _excerpt(text[tail:])
        )


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _physical_lines(f: IO[bytes], max_line_bytes: int, starts: list[tuple[int, int]], bad: set[int]) -> Iterator[str]:
    """Decoded physical lines (with their ends) for the csv module; records each line's (number, offset).

    A line that is not UTF-8 is passed on with its bytes escaped and its number put in `bad`.
    """
    offset, line_no = 0, 0
    while raw := f.readline(max_line_bytes + 1):
        line_no += 1
        starts.append((line_no, offset))
        offset += len(raw)
        if line_no == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            bad.add(line_no)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            bad.add(line_no)
            yield raw.decode("utf-8", errors="backslashreplace")


def _header_problem(header: list[str], readable: bool) -> tuple[str, str] | None:
    """Why no row can be read by column name under this header, or None."""
    if not readable:
        return "invalid_utf8", "the header line is not UTF-8 (or too long): no column has a name to read it by"
    seen: Counter[str] = Counter(header)
    twice = [name for name, n in seen.items() if n > 1 and name]
    if twice:
        return (
            "csv_duplicate_header",
            f"the header names {[_shown(n) for n in twice]} more than once, so a row "
            "cannot map each field to one column; rename the columns",
        )
    unnamed = [i for i, name in enumerate(header, 1) if not name]
    if unnamed:
        return "bad_csv_header", f"header columns {unnamed} have no name; columns must be named and unique"
    return None


def read_csv(path: Path, *, max_line_bytes: int, acct: Accounting) -> Iterator[RawItem | RawReject]:
    """CSV with a header row: each data row a record `{column: text}`, kept at the line and byte offset where it
    starts (a quoted field may span lines). Accounting is per row: rows in = records + rejects + blank rows;
    the header is not a record. Values stay text here; empty fields are empty strings. Under a header that
    cannot name every field (a name twice, an empty name, not UTF-8) every data row is a reject saying so.
    """
    acct.unit = "row"
    csv.field_size_limit(max(csv.field_size_limit(), max_line_bytes))
    starts: list[tuple[int, int]] = []
    bad: set[int] = set()
    with path.open("rb") as f:
        physical = _physical_lines(f, max_line_bytes, starts, bad)
        reader = csv.reader(physical, strict=True)
        header: list[str] | None = None
        header_problem: tuple[str, str] | None = None
        consumed = base = 0  # physical lines read; lines read before the current csv reader started
        while True:
            first = consumed  # index in `starts` of the row's first physical line
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                # the row that does not parse is a reject; reading resumes at the next physical line
                line, offset = starts[first] if first < len(starts) else (consumed + 1, 0)
                acct.lines_in += 1
                acct.rejected += 1
                yield RawReject(
                    line,
                    offset,
                    "malformed_csv",
                    f"{exc}; the row's lines are skipped, reading resumes after them",
                    "",
                )
                if header is None:
                    return
                consumed = base = len(starts)
                reader = csv.reader(physical, strict=True)
                continue
            consumed = base + reader.line_num
            line, offset = starts[first]
            lines = range(starts[first][0], starts[consumed - 1][0] + 1)
            if header is None:
                header = row
                header_problem = _header_problem(header, not any(n in bad for n in lines))
                continue
            acct.lines_in += 1
            if not row or (len(row) == 1 and not row[0].strip() and len(header) > 1):
                acct.blank_lines += 1
                continue
            text = _csv_text(row)
            if header_problem is not None:
                acct.rejected += 1
                yield RawReject(line, offset, *header_problem, _excerpt(text))
                continue
            if any(n in bad for n in lines):
                acct.rejected += 1
                yield RawReject(
                    line, offset, "invalid_utf8", "a line of this row is not UTF-8 (or too long)", _excerpt(text)
                )
                continue
            if len(row) != len(header):
                acct.rejected += 1
                yield RawReject(
                    line, offset, "csv_field_count", f"{len(row)} fields, the header has {len(header)}", _excerpt(text)
                )
                continue
            acct.parsed += 1
            yield RawItem(
                line,
                offset,
                text,
                dict(zip(header, row, strict=True)),
                hashlib.sha256(text.encode("utf-8")).hexdigest(),
            )


def _csv_text(row: list[str]) -> str:
    """The row re-written as one CSV line (the record as written, normalized quoting)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(row)
    return out.getvalue()


def _json_safe(value: Any) -> Any:
    """A Parquet value as JSON: numbers, strings, booleans, null, lists and objects stay; the rest becomes text
    (timestamps and dates in ISO form, decimals as written, bytes decoded as UTF-8 or UnicodeDecodeError);
    NaN and infinities become null."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    iso = getattr(value, "isoformat", None)
    return iso() if callable(iso) else str(value)


def _group_offset(group: Any) -> int:
    """Where a row group's data starts in the file: its first column chunk's first page."""
    if group.num_columns == 0:
        return 0
    chunk = group.column(0)
    return int(chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset)


def _parquet_row(batch: pa.RecordBatch, i: int) -> dict[str, Any] | RawReject:
    """Row `i` of a batch Arrow could not turn into Python values whole: the row, or why it cannot be read
    (a reject with line 0 and offset 0, placed by the caller)."""
    value = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        try:
            value[name] = column[i].as_py()
        except UnicodeDecodeError as exc:
            return RawReject(0, 0, "invalid_utf8", f"column {name!r}: byte {exc.start} of its text: {exc.reason}", "")
        except (OverflowError, ValueError, pa.ArrowException) as exc:  # e.g. a timestamp beyond year 9999
            return RawReject(0, 0, "unreadable_value", f"column {name!r}: {type(exc).__name__}: {exc}", "")
    return value


def _parquet_record(value: dict[str, Any]) -> dict[str, Any] | RawReject:
    """A row's values as JSON; a binary value that is not UTF-8 makes the row a reject, never escaped text."""
    record = {}
    for name, v in value.items():
        try:
            record[name] = _json_safe(v)
        except UnicodeDecodeError as exc:
            return RawReject(
                0,
                0,
                "invalid_utf8",
                f"column {name!r}: byte {exc.start} of a binary value: "
                f"{exc.reason}; binary columns are read as UTF-8 text",
                _excerpt(exc.object),
            )
    return record


def read_parquet(path: Path, *, batch_size: int = 4096, acct: Accounting) -> Iterator[RawItem | RawReject]:
    """Parquet: each row a record `{column: value}` in schema order, streamed in batches.

    Provenance: `line` is the 1-based row number and `byte_offset` the file offset where the row's row group
    starts (its first page).
    Accounting is per row; an unreadable file is one reject. A row with a value Python cannot hold (text that
    is not UTF-8, a timestamp out of range) is that row's reject; so is every row of a file that names a
    column twice (a record would keep one of the two).
    """
    acct.unit = "row"
    try:
        pf = pq.ParquetFile(str(path))
        meta = pf.metadata
        group_offsets = [_group_offset(meta.row_group(g)) for g in range(meta.num_row_groups)]
        group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    except (pa.ArrowException, OSError) as exc:
        acct.lines_in += 1
        acct.rejected += 1
        yield RawReject(1, 0, "unreadable_parquet", str(exc), "")
        return
    names = pf.schema_arrow.names
    twice = sorted({n for n in names if names.count(n) > 1})
    row = 0
    for g, n in enumerate(group_rows):
        try:
            for batch in pf.iter_batches(batch_size=batch_size, row_groups=[g]):
                try:
                    values: list[Any] | None = batch.to_pylist()
                except (UnicodeDecodeError, OverflowError, ValueError, pa.ArrowException):
                    values = None  # row by row, to find the rows that cannot be read
                for i in range(batch.num_rows):
                    row += 1
                    acct.lines_in += 1
                    if twice:
                        got: dict[str, Any] | RawReject = RawReject(
                            0,
                            0,
                            "duplicate_column",
                            f"the file names columns {twice} more than once, so a row "
                            "cannot map each value to one column; rename the columns",
                            "",
                        )
                    else:
                        got = values[i] if values is not None else _parquet_row(batch, i)
                    if isinstance(got, dict):
                        got = _parquet_record(got)
                    if isinstance(got, RawReject):
                        acct.rejected += 1
                        yield RawReject(row, group_offsets[g], got.reason, got.detail, got.excerpt)
                        continue
                    acct.parsed += 1
                    text = json.dumps(got, ensure_ascii=False, separators=(",", ":"))
                    yield RawItem(row, group_offsets[g], text, got, hashlib.sha256(text.encode("utf-8")).hexdigest())
        except (pa.ArrowException, OSError) as exc:
            done = row - sum(group_rows[:g])
            acct.lines_in += n - done
            acct.rejected += n - done
            for k in range(done, n):  # every row of a row group that cannot be read is its own reject
                yield RawReject(
                    sum(group_rows[:g]) + k + 1, group_offsets[g], "unreadable_parquet", f"row group {g}: {exc}", ""
                )
            row = sum(group_rows[: g + 1])


def read_drop(
    path: Path, fmt: str, *, max_line_bytes: int, acct: Accounting, max_gzip_ratio: float = 100.0
) -> Iterator[RawItem | RawReject]:
    if fmt == "parquet":
        return read_parquet(path, acct=acct)
    if fmt == "csv":
        return read_csv(path, max_line_bytes=max_line_bytes, acct=acct)
    if fmt in ("jsonl", "jsonl.gz", "txt"):
        return read_lines(path, fmt, max_line_bytes=max_line_bytes, acct=acct, max_gzip_ratio=max_gzip_ratio)
    if fmt == "json":
        return read_json_array(path, max_bytes=max(max_line_bytes, 1 << 30), acct=acct)
    raise DropError(f"{path}: no reader for format {fmt!r}")
