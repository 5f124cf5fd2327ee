"""Table readers: CSV rows and Parquet rows as records with provenance; a row that cannot be read is a reject.

CSV records start at the line and byte offset of their row (a quoted field may span lines); Parquet records are
rows in schema order, at the byte offset of their row group."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections import Counter
from collections.abc import Collection, Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.readers_common import UTF8_BOM, Accounting, RawItem, RawReject, excerpt_of, shown

# the csv module's states, as far as they decide where a row ends (default dialect: `,`, `"`, doubled quotes)
_START, _FIELD, _QUOTED, _QUOTE_IN_QUOTED = range(4)
_FIELD_END = re.compile(rb"[,\n]")


def _csv_state(chunk: bytes, state: int) -> int:
    """The csv module's state after `chunk` from `state`, jumping field to field at C speed (`find`, a regex), so a
    line of any length is walked in bounded memory. A quote inside an unquoted field is a character like any
    other; a character after a closing quote other than `,` or a line end is the csv module's error: the row ends
    there (the reader rejects it and resumes at the next line)."""
    pos, n = 0, len(chunk)
    while pos < n:
        if state == _START:
            c = chunk[pos]
            state = _QUOTED if c == 0x22 else _START if c in (0x2C, 0x0A) else _FIELD
            pos += 1
        elif state == _FIELD:
            m = _FIELD_END.search(chunk, pos)
            if m is None:
                return _FIELD
            state, pos = _START, m.end()
        elif state == _QUOTED:
            j = chunk.find(b'"', pos)
            if j < 0:
                return _QUOTED
            state, pos = _QUOTE_IN_QUOTED, j + 1
        else:  # just after a quote inside a quoted field: a doubled quote, or the field's end
            c = chunk[pos]
            state = _QUOTED if c == 0x22 else _QUOTE_IN_QUOTED if c == 0x0D else _START
            pos += 1
    return state


def _physical_lines(
    f: IO[bytes],
    max_line_bytes: int,
    starts: list[tuple[int, int]],
    bad: set[int],
    too_long: dict[int, int],
    row_start: list[int],
) -> Iterator[str]:
    """Decoded physical lines (with their ends) for the csv module; records each line's (number, offset).

    A line that is not UTF-8 is passed on with its bytes escaped and its number put in `bad`. A line longer than
    `max_line_bytes` is read to its end in bounded chunks and its size put in `too_long`; the csv module gets a
    short stand-in that leaves it where the line would, inside a quoted field or not (`_csv_state`, from where
    the line starts: a row's first line, `row_start[0]` being the index of that line, starts outside quotes, a
    later one inside them), so the rows after it parse as they would.
    """
    offset, line_no = 0, 0
    while raw := f.readline(max_line_bytes + 1):
        line_no += 1
        starts.append((line_no, offset))
        offset += len(raw)
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            quoted = len(starts) - 1 != row_start[0]  # the csv module asks for a row's next line inside quotes only
            state, size = _csv_state(raw, _QUOTED if quoted else _START), len(raw)
            while raw and not raw.endswith(b"\n"):  # the rest of the line, never held whole
                del raw
                raw = f.readline(max_line_bytes)
                state, size = _csv_state(raw, state), size + len(raw)
            offset = starts[-1][1] + size
            too_long[line_no] = size
            bad.add(line_no)
            yield ('"' if quoted != (state == _QUOTED) else "x") + "\n"
            continue
        if line_no == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
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
            f"the header names {[shown(n) for n in twice]} more than once, so a row "
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
    too_long: dict[int, int] = {}  # line number: its size in bytes
    row_start = [0]  # index in `starts` of the first line of the row being read
    with path.open("rb") as f:
        physical = _physical_lines(f, max_line_bytes, starts, bad, too_long, row_start)
        reader = csv.reader(physical, strict=True)
        header: list[str] | None = None
        header_problem: tuple[str, str] | None = None
        unread_header: RawReject | None = None  # a header that does not parse, until a row after it says why
        consumed = base = 0  # physical lines read; lines read before the current csv reader started
        while True:
            first = row_start[0] = consumed  # index in `starts` of the row's first physical line
            try:
                row = next(reader)
            except StopIteration:
                if unread_header is not None:  # no row followed it: the header itself is the file's one reject
                    acct.lines_in += 1
                    acct.rejected += 1
                    yield unread_header
                return
            except csv.Error as exc:
                # the row that does not parse is a reject; reading resumes at the next physical line
                line, offset = starts[first] if first < len(starts) else (consumed + 1, 0)
                cause = str(exc)
                if "new-line character seen in unquoted field" in cause:  # the csv module's words for a lone \r
                    cause = (
                        "a carriage return (\\r) inside an unquoted field: lines end with \\n or \\r\\n only "
                        "(convert a file with classic Mac \\r line ends), and a \\r inside a value needs quotes"
                    )
                if header is None:  # the header is no row: each data row after it is a reject saying why
                    header, header_problem = [], ("malformed_csv", f"the header (line {line}) cannot be read: {cause}")
                    unread_header = RawReject(line, offset, "malformed_csv", f"the header cannot be read: {cause}", "")
                else:
                    unread_header = None
                    acct.lines_in += 1
                    acct.rejected += 1
                    yield RawReject(
                        line,
                        offset,
                        "malformed_csv",
                        f"{cause}; the row's lines are skipped, reading resumes after them",
                        "",
                    )
                consumed = base = len(starts)
                reader = csv.reader(physical, strict=True)
                continue
            consumed = base + reader.line_num
            line, offset = starts[first]
            lines = range(starts[first][0], starts[consumed - 1][0] + 1)
            if header is None and not row:  # an empty line before the header: a blank line, as after it
                acct.lines_in += 1
                acct.blank_lines += 1
                continue
            if header is None:
                header = row
                header_problem = _header_problem(header, not any(n in bad for n in lines))
                continue
            acct.lines_in += 1
            long_lines = [n for n in lines if n in too_long]
            if long_lines:
                unread_header = None
                acct.rejected += 1
                yield RawReject(
                    line,
                    offset,
                    "line_too_long",
                    f"line {long_lines[0]} of the row: {too_long[long_lines[0]]} bytes > max_line_bytes "
                    f"{max_line_bytes}",
                    "",
                )
                continue
            if not row or (len(row) == 1 and not row[0].strip() and (len(header) > 1 or header_problem is not None)):
                acct.blank_lines += 1
                continue
            unread_header = None  # this row's reject says why
            text = _csv_text(row)
            if header_problem is not None:
                acct.rejected += 1
                yield RawReject(line, offset, *header_problem, excerpt_of(text))
                continue
            if any(n in bad for n in lines):
                acct.rejected += 1
                yield RawReject(
                    line, offset, "invalid_utf8", "a line of this row is not UTF-8 (or too long)", excerpt_of(text)
                )
                continue
            if len(row) != len(header):
                acct.rejected += 1
                yield RawReject(
                    line,
                    offset,
                    "csv_field_count",
                    f"{len(row)} fields, the header has {len(header)}",
                    excerpt_of(text),
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


class NonFinite(ValueError):
    """An infinity in a Parquet value: JSON holds none, and null would say the value is missing."""


def json_safe(value: Any) -> Any:
    """A Parquet value as JSON: numbers, strings, booleans, null, lists and objects stay; the rest becomes text
    (timestamps and dates in ISO form, decimals as written (`_decimal_kinds` makes most of them numbers first), bytes
    decoded as UTF-8 or UnicodeDecodeError);
    NaN (pandas' missing value) becomes null; an infinity raises `NonFinite`."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value in (float("inf"), float("-inf")):
            raise NonFinite(f"{value}")
        return value if value == value else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
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
            record[name] = json_safe(v)
        except NonFinite as exc:
            return RawReject(
                0,
                0,
                "invalid_json_constant",
                f"column {name!r} holds {exc}: no number JSON can hold, and null would say it is missing; "
                "leave the row out or store the value as text",
                "",
            )
        except UnicodeDecodeError as exc:
            return RawReject(
                0,
                0,
                "invalid_utf8",
                f"column {name!r}: byte {exc.start} of a binary value: "
                f"{exc.reason}; binary columns are read as UTF-8 text",
                excerpt_of(exc.object),
            )
    return record


def _with_floats_as(t: pa.DataType, to: pa.DataType) -> pa.DataType:
    """`t` with every float16 and float32 in it, at any depth (lists, structs, maps), replaced by `to`."""
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return to
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_with_floats_as(t.value_type, to)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_with_floats_as(t.value_type, to)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_with_floats_as(t.value_type, to)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_with_floats_as(f.type, to)) for f in (t.field(i) for i in range(t.num_fields))])
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(key.with_type(_with_floats_as(key.type, to)), item.with_type(_with_floats_as(item.type, to)))
    if pa.types.is_dictionary(t) and _with_floats_as(t.value_type, to) != t.value_type:
        return _with_floats_as(t.value_type, to)  # decoded: the records hold values, not dictionary codes
    return t


def _short_floats(batch: pa.RecordBatch) -> pa.RecordBatch:
    """float32 values as the float64 of their shortest text (a float32 19.99 is 19.989999771118164 as a float64:
    trained as `19.99`, as written, not as the float32's binary expansion); float16 ones as Arrow writes them,
    their exact value. At any depth: a list of float32 or a struct holding one too. A column whose type Arrow
    cannot cast so (none known) keeps its values as they are."""
    columns = []
    for c in batch.columns:
        wide = _with_floats_as(c.type, pa.float64())
        if wide != c.type:
            try:
                c = c.cast(_with_floats_as(c.type, pa.string())).cast(wide)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                pass
        columns.append(c)
    if all(a is b for a, b in zip(columns, batch.columns, strict=True)):
        return batch
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _decimal_kinds(schema: pa.Schema) -> dict[str, str]:
    """How each top-level decimal column trains, by its type, as CSV columns do by their cells: `int` where the scale
    is 0 or less (whole numbers, exact at any size), `float` where a float holds every value of the type (at most 15
    significant digits: `1.10` trains 1.1, as the CSV cell does), else `text` (the digits as written, a string:
    `12345678901234567890.12` would train as 1.2345678901234567e+19)."""
    kinds = {}
    for field in schema:
        if pa.types.is_decimal(field.type):
            kinds[field.name] = "int" if field.type.scale <= 0 else "float" if field.type.precision <= 15 else "text"
    return kinds


def _with_decimals(row: dict[str, Any], kinds: dict[str, str]) -> dict[str, Any]:
    """A row's decimal values as `_decimal_kinds` says (a text one stays a Decimal: `json_safe` writes its digits)."""
    out = dict(row)
    for name, kind in kinds.items():
        value = out.get(name)
        if isinstance(value, Decimal) and kind != "text":
            out[name] = int(value) if kind == "int" else float(value)
    return out


def read_parquet(
    path: Path, *, batch_size: int = 4096, acct: Accounting, typed_columns: Collection[str] = ()
) -> Iterator[RawItem | RawReject]:
    """Parquet: each row a record `{column: value}` in schema order, streamed in batches.

    A decimal column trains by its type (`_decimal_kinds`), unless `typed_columns` (the spec's `column_types`)
    names it: then it stays as written for the declared type to read.
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
        names = pf.schema_arrow.names
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: a column name that is not UTF-8
        acct.lines_in += 1
        acct.rejected += 1
        yield RawReject(1, 0, "unreadable_parquet", str(exc), "")
        return
    twice = sorted({n for n in names if names.count(n) > 1})
    decimals = {k: v for k, v in _decimal_kinds(pf.schema_arrow).items() if k not in typed_columns}
    row = 0
    for g, n in enumerate(group_rows):
        try:
            for read in pf.iter_batches(batch_size=batch_size, row_groups=[g]):
                batch = _short_floats(read)
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
                        got = _parquet_record(_with_decimals(got, decimals) if decimals else got)
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
