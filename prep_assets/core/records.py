"""Record types: how an input value becomes a record's training content, and the layers' Arrow schemas.

A record's *content* is the dict of its training-relevant fields in a canonical shape per type:
    text         {"text": str}
    instruction  {"turns": [{"prompt": str, "completion": str}, ...]}   (one turn, or a dialogue)
Content is stored as canonical JSON (see `lake.canonical_json`), which is also what exact dedup hashes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from prep_assets.core.spec import InputSpec


@dataclass(frozen=True)
class Invalid:
    reason: str
    detail: str


Extractor = Callable[[Any, InputSpec], "dict[str, Any] | Invalid"]


def _field(obj: Any, key: str, *, required: bool = True) -> str | Invalid:
    if not isinstance(obj, dict):
        return Invalid("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        if not required:
            return ""
        keys = sorted(obj)[:20]
        return Invalid("missing_key", f"no key {key!r}; is the spec's key correct? available keys: {keys}")
    value = obj[key]
    if value is None:
        return Invalid("null_value", f"{key!r} is null")
    if not isinstance(value, str):
        return Invalid("wrong_type", f"{key!r} is {type(value).__name__}, expected a string")
    return value


def extract_text(value: Any, spec: InputSpec) -> dict[str, Any] | Invalid:
    if isinstance(value, str):  # a txt line, or a JSONL line holding a bare string
        return {"text": value}
    text = _field(value, spec.text_key)
    return text if isinstance(text, Invalid) else {"text": text}


def _turn(obj: Any, spec: InputSpec) -> dict[str, str] | Invalid:
    parts: list[str] = []
    for i, key in enumerate(spec.prompt_keys):
        part = _field(obj, key, required=(i == 0))
        if isinstance(part, Invalid):
            return part
        if part:
            parts.append(part)
    completion = _field(obj, spec.completion_key)
    if isinstance(completion, Invalid):
        return completion
    return {"prompt": spec.prompt_separator.join(parts), "completion": completion}


def extract_instruction(value: Any, spec: InputSpec) -> dict[str, Any] | Invalid:
    items = value if isinstance(value, list) else [value]
    if not items:
        return Invalid("empty_dialogue", "the line holds an empty list of turns")
    turns: list[dict[str, str]] = []
    for i, item in enumerate(items):
        turn = _turn(item, spec)
        if isinstance(turn, Invalid):
            prefix = f"turn {i + 1}: " if isinstance(value, list) else ""
            return Invalid(turn.reason, prefix + turn.detail)
        turns.append(turn)
    return {"turns": turns}


EXTRACTORS: dict[str, Extractor] = {
    "text": extract_text,
    "instruction": extract_instruction,
}


def content_texts(content: dict[str, Any]) -> list[str]:
    """The text fields of a content dict, in order (used for lengths and normalization)."""
    if "text" in content:
        return [content["text"]]
    return [s for t in content.get("turns", []) for s in (t["prompt"], t["completion"])]


def map_content_texts(content: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    if "text" in content:
        return {**content, "text": fn(content["text"])}
    return {**content, "turns": [{k: fn(v) for k, v in t.items()} for t in content["turns"]]}


PROVENANCE_FIELDS = [
    pa.field("record_id", pa.string(), nullable=False),
    pa.field("drop", pa.string(), nullable=False),
    pa.field("source_file", pa.string(), nullable=False),
    pa.field("source_line", pa.int64(), nullable=False),
    pa.field("byte_offset", pa.int64(), nullable=False),
]

BRONZE_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("record_sha256", pa.string(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
        pa.field("content", pa.string(), nullable=False),
    ]
)

BRONZE_REJECT_SCHEMA = pa.schema(
    [
        pa.field("drop", pa.string(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("byte_offset", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("excerpt", pa.string(), nullable=False),
    ]
)

SILVER_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("content", pa.string(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),
        pa.field("num_chars", pa.int64(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)

SILVER_REJECT_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("duplicate_of", pa.string(), nullable=True),
    ]
)

GOLD_SCHEMA = pa.schema(
    [
        pa.field("example_id", pa.string(), nullable=False),
        *PROVENANCE_FIELDS,
        pa.field("split", pa.string(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("token_type_ids", pa.list_(pa.uint8()), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("num_loss_tokens", pa.int32(), nullable=False),
        pa.field("num_prompt_tokens", pa.int32(), nullable=False),
    ]
)

GOLD_REJECT_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("split", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
    ]
)

SHARD_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("position_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("segment_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("token_type_ids", pa.list_(pa.uint8()), nullable=False),
        pa.field("seq_lengths", pa.list_(pa.int32()), nullable=False),
        pa.field("example_ids", pa.list_(pa.string()), nullable=False),
        pa.field("num_loss_tokens", pa.int32(), nullable=False),
    ]
)

# token_type_ids values (SambaNova-compatible)
TYPE_PROMPT, TYPE_COMPLETION, TYPE_PADDING, TYPE_EOS = 0, 1, 2, 3
SPLITS = ("train", "validation", "test")
