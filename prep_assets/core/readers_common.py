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
# (UTF-32 first: its LE mark starts with UTF-16 LE's)
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 LE", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32 BE", "UTF-32"),
    (b"\xff\xfe", "UTF-16 LE", "UTF-16"),
    (b"\xfe\xff", "UTF-16 BE", "UTF-16"),
)
# Without a mark: the places (mod 4) where ASCII text in each encoding has its 0 bytes
_ZERO_PLACES = {(1, 3): "UTF-16LE", (0, 2): "UTF-16BE", (1, 2, 3): "UTF-32LE", (0, 1, 2): "UTF-32BE"}
# how much of a text drop's start `not_utf8_text` looks at, and how many 0 bytes it needs to judge by them
ENCODING_HEAD = 4096
_MIN_ZEROS = 8


def not_utf8_text(head: bytes) -> tuple[str, str] | None:
    """(iconv's name of the encoding, why) where a text drop starting with `head` is not UTF-8 text, else None. A
    UTF-16 or UTF-32 file read as UTF-8 splits into lines at its 0x0A bytes and its characters into bytes of other
    characters; lines would decode, and train on garbled text. Told apart by its byte order mark, or, without one,
    by its 0 bytes: at least 8, and at least half the bytes at some places mod 4 but not at all of them (ASCII in
    UTF-16 has one in every other byte, in UTF-32 three in four; a file of 0 bytes only, or UTF-8 text with a stray
    one, is read line by line as before)."""
    for bom, name, iconv in _OTHER_BOMS:
        if head.startswith(bom):
            return iconv, f"the file is {name} text (it starts with the byte order mark {bom.hex(' ').upper()})"
    if head.count(0) < _MIN_ZEROS:
        return None
    places = [head[p::4] for p in range(4)]
    zero = tuple(p for p, part in enumerate(places) if part and part.count(0) * 2 >= len(part))
    if not zero or len(zero) == 4:
        return None
    name = _ZERO_PLACES.get(zero)
    said = f"{name} text without a byte order mark" if name else "not text in any encoding prep_assets reads"
    return name or "UTF-16", (
        f"the file is not UTF-8: {head.count(0)} of the first {len(head)} bytes are 0, at places as in {said}"
    )


def shown(text: str) -> str:
    """`text` with lone surrogates written as escapes, so a detail that quotes it can be stored."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def excerpt_of(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    return text[:EXCERPT_CHARS]
