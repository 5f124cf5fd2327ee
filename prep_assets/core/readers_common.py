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


def shown(text: str) -> str:
    """`text` with lone surrogates written as escapes, so a detail that quotes it can be stored."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def excerpt_of(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="backslashreplace") if isinstance(data, bytes) else data
    return text[:EXCERPT_CHARS]
