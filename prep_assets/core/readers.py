"""Readers: a drop's bytes to parsed values with provenance, and rejects for what does not parse.

Every physical line is accounted for: it becomes a parsed item, a reject (with line, byte offset and
reason) or a blank line. Byte offsets count from the start of the (decompressed) stream. Lines are
split on `\\n` only, so U+2028/U+2029/NEL or a lone `\\r` inside a record never split it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import sys
import zlib
from collections.abc import Collection, Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from prep_assets.core.errors import DropError
from prep_assets.core.lake import JSON_MAX_DEPTH, loads_json
from prep_assets.core.readers_common import (
    ENCODING_HEAD,
    EXCERPT_CHARS,
    UTF8_BOM,
    Accounting,
    RawItem,
    RawReject,
    excerpt_of,
    not_utf8_text,
    shown,
)
from prep_assets.core.readers_tabular import read_csv, read_parquet


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


class InexactFloat(float):
    """A JSON number a float does not hold (`12345678901234567.89`, `9007199254740993.0`, `1e-400`): the float
    nearest it, with the number as written (`text`). Rendered, it would train as other digits: a table row holding
    one is a reject (`records.TabularExtractor`); elsewhere it is the float it always was."""

    text: str

    def __new__(cls, text: str, value: float) -> InexactFloat:
        made = super().__new__(cls, value)
        made.text = text
        return made

    def __reduce__(self) -> tuple[type, tuple[str, float]]:  # copies keep the text
        return InexactFloat, (self.text, float(self))


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: as much a non-number as the Infinity literal
        raise ValueError(f"non-standard JSON constant: {text} is out of the float range")
    if repr(value) == text:  # the common case, at the cost of one repr
        return value
    # `1.10` is 1.1, and `0.10000000000000001` is how C's %.17g writes 0.1: the float as written, in other digits
    written = Decimal(text)
    if written != Decimal(repr(value)) and written != Decimal(f"{value:.17g}"):
        return InexactFloat(text, value)
    return value


_STRICT = {"parse_constant": _reject_constant, "parse_float": _finite_float}  # no NaN/Infinity, no overflow to inf
_DECODER = json.JSONDecoder(**_STRICT)


def checked_decoder() -> tuple[json.JSONDecoder, list[str]]:
    """A decoder like `_DECODER` that also lists, in the list it returns with it, every key an object of what it
    reads gives twice (a parser keeps one of the values: the other would be lost without a word)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(items)
        if len(value) < len(items):
            seen: set[str] = set()
            repeated.extend(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return value

    return json.JSONDecoder(**_STRICT, object_pairs_hook=pairs), repeated


def _count_keys(value: Any) -> int:
    """The keys of every object in a parsed value."""
    n, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            n += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return n


# a quote, JSON whitespace, a colon: where every key of a JSON text ends (and maybe text inside a string)
_KEY_END = re.compile(r'"[ \t\r\n]*:')


def repeated_keys(text: str, value: Any) -> list[str]:
    """The keys an object of JSON `text` (read as `value`) gives twice. Every key in the text ends with a quote,
    whitespace and a colon, so the text's `_KEY_END` matches are at least its keys; when they are exactly the
    value's keys no key was given twice and the text is not read again (one C-speed scan)."""
    if len(_KEY_END.findall(text)) == _count_keys(value):
        return []
    decoder, repeated = checked_decoder()
    decoder.decode(text)
    return repeated


def duplicate_key_detail(keys: list[str]) -> str:
    return (
        f"key {shown(keys[0])!r} is given twice in one object: a JSON parser keeps one of its values and the "
        "other would be lost; give each key once"
    )


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


def _lone_surrogate(text: str, where: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f'lone surrogate \\u{ord(text[exc.start]):04x} (UTF-8 cannot encode it) in {where}: "{shown(text[:80])}"'
        )
    return None


def unkeepable(value: Any, text: str, start: int = 0, end: int | None = None) -> tuple[str, str] | None:
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
                stack.append((v, depth + 1, f"{path}.{shown(k)}"))
    return None


def _decode_keepable(text: str) -> Any:
    """The json module's reading of `text` (what orjson does not read alike), refused if it cannot be kept."""
    value = _DECODER.decode(text)
    problem = unkeepable(value, text)
    if problem is not None:
        raise _Unkeepable(*problem)
    return value


_LENIENT = json.JSONDecoder(strict=False)  # NaN and infinities read, control characters in strings allowed


def _lenient_end(text: str, pos: int) -> int | None:
    """Where the value at `pos` ends as a lenient reading (`_LENIENT`) parses it; None if even that fails."""
    try:
        return _LENIENT.raw_decode(text, pos)[1]
    except (ValueError, RecursionError):
        return None


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


# a byte that is not UTF-8, as `surrogateescape` decodes it
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
# a JSON number token
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# what the json module's ValueError says of an integer past Python's digit limit (sys.set_int_max_str_digits)
_TOO_MANY_DIGITS = "integer string conversion"


def _too_many_digits() -> str:
    """The reject's detail for such a number: Python's own limit, not a fault of the JSON, said as what it is."""
    return (
        f"a number with more than {sys.get_int_max_str_digits()} digits: too long to read as an integer; give it as "
        "a string"
    )


def _parse_json(text: str) -> tuple[Any, str | None, str]:
    try:  # orjson's values are kept as they are: it refuses lone surrogates and `loads_json` deep nesting
        value = loads_json(text, _decode_keepable)
        repeated = repeated_keys(text, value)
        if repeated:
            return None, "duplicate_key", duplicate_key_detail(repeated)
        return value, None, ""
    except _Unkeepable as exc:
        return None, exc.reason, str(exc)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is a rejected NaN/Infinity
        if _TOO_MANY_DIGITS in str(exc):
            return None, "malformed_json", _too_many_digits()
        reason = "invalid_json_constant" if "constant" in str(exc) else "malformed_json"
        return None, reason, str(exc)
    except RecursionError:
        return None, "malformed_json", NESTING_TOO_DEEP


def _gzip_magic(path: Path) -> bool:
    """Whether the file starts as every gzip stream does (1f 8b)."""
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _head(path: Path, fmt: str) -> bytes:
    """The first bytes of a text drop as its reader sees them (a .gz drop's decompressed; b"" where the stream is not
    gzip or breaks at once: the reader rejects that itself)."""
    try:
        with _open_stream(path, fmt) as f:
            return f.read(ENCODING_HEAD)
    except (EOFError, OSError, zlib.error):
        return b""


def _open_stream(path: Path, fmt: str) -> IO[bytes]:
    if fmt == "jsonl.gz":
        return gzip.open(path, "rb")
    return path.open("rb")


def read_lines(
    path: Path,
    fmt: str,
    *,
    max_line_bytes: int,
    acct: Accounting,
    max_gzip_ratio: float = 100.0,
    keep_line_ends: bool = False,
) -> Iterator[RawItem | RawReject]:
    """JSONL / JSONL.gz / TXT: one record per line. A .gz drop stops at `gzip_limit` decompressed bytes. With
    `keep_line_ends` a TXT line's value ends with `\n` where the line had an end (`\n` or `\r\n`), as gdp reads
    text; the record's raw text and hash stay the line's."""
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
                if offset == 0 and not _gzip_magic(path):  # no gzip header at all: not a gzip file
                    yield RawReject(1, 0, "not_gzip", f"{exc}: the file is named .gz; rename it or compress it", "")
                else:
                    yield RawReject(line_no + 1, offset, "truncated_gzip", f"stream ends early: {exc}", "")
                return
            if not raw:
                return
            line_no += 1
            acct.lines_in += 1
            start = offset
            offset += len(raw)
            if limit is not None and offset > limit:
                yield bomb(line_no, start, excerpt_of(raw[:EXCERPT_CHARS]))
                return
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                excerpt = excerpt_of(raw[:EXCERPT_CHARS])
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
            if raw.endswith(b"\r\n"):  # a CRLF line end; a lone \r (the file's last byte too) stays in its line
                body = body[:-1]
            if not body.strip():
                acct.blank_lines += 1
                continue
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                acct.rejected += 1
                yield RawReject(
                    line_no, start, "invalid_utf8", f"byte {exc.start} of the line: {exc.reason}", excerpt_of(body)
                )
                continue
            if as_json:
                value, reason, detail = _parse_json(text)
                if reason is not None:
                    acct.rejected += 1
                    yield RawReject(line_no, start, reason, detail, excerpt_of(text))
                    continue
            elif keep_line_ends and raw.endswith(b"\n"):
                value = text + "\n"
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

    # bytes that are not UTF-8 are read as lone surrogates (`surrogateescape`): the elements holding them are
    # rejected one by one, the others read on
    text = data[bom:].decode("utf-8", errors="surrogateescape")
    not_utf8 = _ESCAPED_BYTE.search(text) is not None
    line, byte_pos, char_pos = 1, bom, 0

    def advance(to: int) -> None:
        nonlocal line, byte_pos, char_pos
        chunk = text[char_pos:to]
        line += chunk.count("\n")
        byte_pos += len(chunk.encode("utf-8", errors="surrogateescape"))
        char_pos = to

    def shown_bytes(part: str) -> str:
        return excerpt_of(part.encode("utf-8", errors="surrogateescape"))

    decoder, repeated = checked_decoder()
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
            shown_bytes(text[pos:]),
        )
        return
    pos = _skip_ws(text, pos + 1)
    closed = pos < len(text) and text[pos] == "]"
    while pos < len(text) and not closed:
        advance(pos)
        repeated.clear()
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            # An element holding a number too long to read ends where its brackets close, or the number does. One
            # that a lenient reading parses (a NaN or an infinity, a control character in a string) ends where that
            # reading ends. Either is the element's own reject, and reading goes on after it; an element that is
            # not well formed (a stray quote, a bracket missing) leaves no sure end: the rest is one reject.
            reason = "invalid_json_constant" if "constant" in str(exc) else "malformed_json"
            detail = _too_many_digits() if _TOO_MANY_DIGITS in str(exc) else str(exc)
            if _TOO_MANY_DIGITS in str(exc):
                number = _NUMBER.match(text, pos)
                found = _value_end(text, pos) if text[pos] in "[{" else number.end() if number else None
            else:
                found = _lenient_end(text, pos)
            if found is None:
                yield reject(
                    line, byte_pos, reason, f"{detail}; the rest of the array is unreadable", shown_bytes(text[pos:])
                )
                return
            value, end = None, found
            problem = (reason, detail)
        except RecursionError:
            found = _value_end(text, pos)
            if found is None:
                yield reject(
                    line,
                    byte_pos,
                    "malformed_json",
                    f"{NESTING_TOO_DEEP}; the element never closes: the rest of the array is unreadable",
                    shown_bytes(text[pos:]),
                )
                return
            value, end = None, found
            problem: tuple[str, str] | None = ("malformed_json", NESTING_TOO_DEEP)
        else:
            problem = unkeepable(value, text, pos, end)
            if problem is None and repeated:
                problem = ("duplicate_key", duplicate_key_detail(repeated))
        element = text[pos:end]
        if not_utf8 and (bad := _ESCAPED_BYTE.search(element)) is not None:  # before a surrogate's own reject
            problem = ("invalid_utf8", f"byte 0x{ord(bad.group()) - 0xDC00:02x} of the element is not UTF-8")
        if problem is not None:
            yield reject(line, byte_pos, *problem, shown_bytes(element))
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
                line, byte_pos, "malformed_json", "expected ',' or ']' after an array element", shown_bytes(text[pos:])
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
            line, byte_pos, "trailing_content", "content after the closing ']' of the array", shown_bytes(text[tail:])
        )


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def read_drop(
    path: Path,
    fmt: str,
    *,
    max_line_bytes: int,
    acct: Accounting,
    max_gzip_ratio: float = 100.0,
    typed_columns: Collection[str] = (),
    **lines: bool,
) -> Iterator[RawItem | RawReject]:
    """A drop's items and rejects, by format; `lines` are the line reader's switches (`keep_line_ends`);
    `typed_columns`, the columns `tabular.column_types` types (a Parquet decimal there is left as written). A text drop
    that is not UTF-8 (UTF-16, UTF-32) is refused as a whole (`DropError`): read line by line it would train on
    garbled text (`not_utf8_text`)."""
    if fmt != "parquet":
        found = not_utf8_text(_head(path, fmt))
        if found is not None:
            encoding, problem = found
            suffixes = "".join(path.suffixes[-2:] if fmt == "jsonl.gz" else path.suffixes[-1:])
            converted = f"{path.name.removesuffix(suffixes)}.utf8{suffixes}"
            convert = f"iconv -f {encoding} -t UTF-8 {path.name} > {converted}"
            if fmt == "jsonl.gz":
                convert = f"zcat {path.name} | iconv -f {encoding} -t UTF-8 | gzip > {converted}"
            raise DropError(
                f"{path.name}: {problem}; prep_assets reads UTF-8: convert it (for example `{convert}`), drop the "
                "converted file and move this one out of raw/"
            )
    if fmt == "parquet":
        return read_parquet(path, acct=acct, typed_columns=typed_columns)
    if fmt == "csv":
        return read_csv(path, max_line_bytes=max_line_bytes, acct=acct)
    if fmt in ("jsonl", "jsonl.gz", "txt"):
        return read_lines(path, fmt, max_line_bytes=max_line_bytes, acct=acct, max_gzip_ratio=max_gzip_ratio, **lines)
    if fmt == "json":
        return read_json_array(path, max_bytes=max(max_line_bytes, 1 << 30), acct=acct)
    raise DropError(f"{path}: no reader for format {fmt!r}")
