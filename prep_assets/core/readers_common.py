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


# Byte order marks of the encodings a text drop may be saved in that are not UTF-8, with iconv's name for the encoding
# (UTF-32 first: its LE mark starts with UTF-16 LE's); iconv reads the mark
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 LE", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32 BE", "UTF-32"),
    (b"\xff\xfe", "UTF-16 LE", "UTF-16"),
    (b"\xfe\xff", "UTF-16 BE", "UTF-16"),
)
# how much of a text drop's start `not_utf8_text` looks at, and how many 0 bytes it needs to judge by them
ENCODING_HEAD = 4096
_MIN_ZEROS = 8


def _zero_share(data: bytes) -> float:
    return data.count(0) / len(data) if data else 0.0


def not_utf8_text(head: bytes) -> tuple[str, str] | None:
    """(iconv's name of the encoding, why) where a text drop starting with `head` is not UTF-8 text, else None. A
    UTF-16 or UTF-32 file read as UTF-8 splits into lines at its 0x0A bytes and its characters into bytes of other
    characters; lines would decode, and train on garbled text. Told apart by its byte order mark, or, without one,
    by its 0 bytes (at least 8): UTF-32 LE has them in the 3rd and 4th byte of every character of the first plane
    (BE: the 1st and 2nd), UTF-16 LE in the odd places of every ASCII character (BE: the even places): a tenth of
    those places at least, and at most a tenth of that in the others. A file of 0 bytes only, or UTF-8 with a stray
    one, is read line by line as before."""
    for bom, name, iconv in _OTHER_BOMS:
        if head.startswith(bom):
            return iconv, f"the file is {name} text (it starts with the byte order mark {bom.hex(' ').upper()})"
    if head.count(0) < _MIN_ZEROS or head.count(0) == len(head):
        return None
    place = [_zero_share(head[p::4]) for p in range(4)]
    even, odd = _zero_share(head[0::2]), _zero_share(head[1::2])
    found = None
    if place[2] >= 0.5 and place[3] >= 0.5 and place[0] < 0.5:
        found = "UTF-32LE"
    elif place[0] >= 0.5 and place[1] >= 0.5 and place[3] < 0.5:
        found = "UTF-32BE"
    elif odd >= 0.1 and even <= odd / 10:
        found = "UTF-16LE"
    elif even >= 0.1 and odd <= even / 10:
        found = "UTF-16BE"
    if found is None:
        return None
    return found, (
        f"the file is not UTF-8: {head.count(0)} of its first {len(head)} bytes are 0, at the places of {found} "
        "text without a byte order mark"
    )


def shown(text: str) -> str:
    """`text` with lone surrogates written as escapes, so a detail that quotes it can be stored."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def excerpt_of(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    return text[:EXCERPT_CHARS]
