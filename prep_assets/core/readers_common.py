"""What every reader returns: parsed items and rejects with their provenance, and the accounting of a drop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


# Byte order marks of the encodings a text drop may be saved in that are not UTF-8 (UTF-32 first: its LE mark
# starts with UTF-16 LE's)
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 LE"),
    (b"\x00\x00\xfe\xff", "UTF-32 BE"),
    (b"\xff\xfe", "UTF-16 LE"),
    (b"\xfe\xff", "UTF-16 BE"),
)
# how much of a text drop's start `not_utf8_text` looks at
ENCODING_HEAD = 4096


def not_utf8_text(head: bytes) -> str | None:
    """Why a text drop starting with `head` is not UTF-8 text, or None. A UTF-16 or UTF-32 file read as UTF-8 splits
    into lines at its 0x0A bytes and its characters into bytes of other characters; lines would decode, and train on
    the garbled text. Told apart by its byte order mark, or, without one, by a 0 byte in at least a quarter of the
    even or the odd places of its start but not of both (ASCII in UTF-16 has one in every other byte; no UTF-8 text
    has many)."""
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            return f"the file is {name} text (it starts with the byte order mark {bom.hex(' ').upper()})"
    if len(head) >= 4:
        halves = {"even": head[0::2], "odd": head[1::2]}
        many = {parity: half.count(0) * 4 >= len(half) for parity, half in halves.items()}
        for parity, half in halves.items():
            if many[parity] and not all(many.values()):  # not both: a file of 0 bytes is read as lines, as before
                return (
                    f"the file is not UTF-8 text: {half.count(0)} of the {len(half)} bytes at {parity} places of its "
                    "start are 0, as in UTF-16 text without a byte order mark"
                )
    return None


def shown(text: str) -> str:
    """`text` with lone surrogates written as escapes, so a detail that quotes it can be stored."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def excerpt_of(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    return text[:EXCERPT_CHARS]
