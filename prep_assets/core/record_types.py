"""Record types (`input.type`), registered by name: what each one reads from a record and how the layers treat it.

A type declares its extractor (a parsed input value to the record's canonical content, or an `Invalid`), the mask
keys a spec may set with their defaults, and the few properties the layers and gates ask about (does it carry
chat roles, may one text line hold a record, does a record make a pair of examples, are records table rows).
Specs are validated against the registry, and the layers ask the registry instead of testing type names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prep_assets.core.records import (
    Extractor,
    extract_chat,
    extract_instruction,
    extract_preference,
    extract_text,
)
from prep_assets.core.spec_sections import MaskAction

if TYPE_CHECKING:
    from prep_assets.core.spec import DatasetSpec

# The canonical content a record type's extractor produces (core/records.py), which decides how gold builds its
# examples: a document, prompt/completion turns, a conversation rendered with a chat template, a pair of
# conversations, or table rows assembled into examples.
SHAPES = ("text", "turns", "messages", "pair", "rows")


@dataclass(frozen=True)
class RecordType:
    name: str
    shape: str  # one of SHAPES
    extract: Extractor | None  # None: built per drop from the drop itself (tables type their columns)
    mask_keys: Mapping[str, MaskAction | None] = field(default_factory=dict)  # None: `mask_default`
    roles: bool = False  # its mask keys include every chat role `input.role_map` names
    one_per_line: bool = False  # `input.format: txt` (a record per text line) can carry it
    paired: bool = False  # a record becomes two examples packed into one row (preference pairs)
    table_rows: bool = False  # records are table rows assembled into examples (`tabular` section)


TYPES: dict[str, RecordType] = {}


def register(record_type: RecordType) -> RecordType:
    if record_type.shape not in SHAPES:
        raise ValueError(f"record type {record_type.name!r}: shape {record_type.shape!r} is none of {SHAPES}")
    if record_type.name in TYPES:
        raise ValueError(f"record type {record_type.name!r} is registered already")
    TYPES[record_type.name] = record_type
    return record_type


def record_type(name: str) -> RecordType:
    return TYPES[name]


def shape_of(spec: DatasetSpec) -> str:
    """The content shape of a spec's record type: what gold builds its examples from."""
    return TYPES[spec.input.type].shape


CHAT_MASKS: Mapping[str, MaskAction | None] = {"system": "mask", "user": "mask", "assistant": "train", "tool": "mask"}

register(RecordType("text", "text", extract_text, {"text": "train"}, one_per_line=True))
register(RecordType("instruction", "turns", extract_instruction, {"prompt": "mask", "completion": "train"}))
register(RecordType("chat", "messages", extract_chat, CHAT_MASKS, roles=True))
# preference: the masks of the chosen/rejected branches' roles; the shared prompt is always masked
register(RecordType("preference", "pair", extract_preference, CHAT_MASKS, roles=True, paired=True))
# tabular: the schema prompt is always masked, records and their BOS/EOS always trained
register(RecordType("tabular", "rows", None, {}, table_rows=True))
