"""Record types: how an input value becomes a record's training content, and the layers' Arrow schemas.

A record's *content* is the dict of its training-relevant fields in a canonical shape per type:
    text         {"text": str}
    instruction  {"turns": [{"prompt": str, "completion": str}, ...]}   (one turn, or a dialogue)
    chat         {"messages": [{"role": str, "content": str}, ...], "tools"?: [...]}
    preference   {"prompt": [messages], "chosen": [messages], "rejected": [messages], "tools"?: [...]}
    tabular      {"columns": [name, ...], "values": [value, ...]}   (schema order; the values as typed)
Content is stored as canonical JSON (see `lake.canonical_json`), which is also what exact dedup hashes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from prep_assets.core.errors import DropError
from prep_assets.core.readers import InexactFloat, checked_decoder, duplicate_key_detail, unkeepable
from prep_assets.core.spec_sections import InputSpec, TabularSpec
from prep_assets.core.tabular import is_empty_group_value, json_value, parse_cell, render_values


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


def _message_text(value: Any, where: str) -> str | Invalid:
    """A message's content: a string, or OpenAI-style text parts joined."""
    if isinstance(value, str):
        return value
    if value is None:
        return Invalid("null_value", f"{where}: content is null")
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "".join(p["text"] for p in value)
    return Invalid("wrong_type", f"{where}: content is {type(value).__name__}; expected a string or text parts")


# A message's OpenAI fine-tuning `weight` of 0 (do not train this turn) travels in its content under this key;
# weight 1 (the default: the spec's mask decides) is left out, so records without weights keep their bytes.
WEIGHT = "weight"


def _weight(item: dict[str, Any]) -> int | None:
    """The message's OpenAI fine-tuning weight, 0 or 1 (None: it gives none or another value)."""
    value = item.get(WEIGHT, 1)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return int(value)
    return None


def _unread_training_fields(item: dict[str, Any]) -> str:
    """What a message says about its training that its role and content do not carry (empty: nothing): an OpenAI
    fine-tuning `weight` other than 0 or 1, or reasoning beside the content."""
    said = []
    if _weight(item) is None:
        said.append(f"weight {json.dumps(item[WEIGHT])[:20]} is not supported (OpenAI's weights are 0 and 1)")
    for key in ("reasoning_content", "reasoning"):
        if item.get(key) not in (None, ""):
            said.append(f"{key!r} is not supported (only the content is rendered)")
    return "; ".join(said)


def _messages(items: Any, spec: InputSpec, what: str) -> list[dict[str, Any]] | Invalid:
    """A list of OpenAI `{role, content}` (with `weight` 0: not trained), ShareGPT `{from, value}` or
    `{prompt, completion}` items."""
    if not isinstance(items, list):
        return Invalid("wrong_type", f"{what} is {type(items).__name__}, expected a list of messages")
    if not items:
        return Invalid("empty_dialogue", f"{what} is an empty list")
    roles = spec.roles
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items, start=1):
        where = f"{what} item {i}"
        if not isinstance(item, dict):
            return Invalid("not_an_object", f"{where}: expected an object, got {type(item).__name__}")
        if spec.role_key is None and "role" not in item and "from" not in item and spec.completion_key in item:
            turn = _turn(item, spec)  # a prompt/completion pair: a user and an assistant message
            if isinstance(turn, Invalid):
                return Invalid(turn.reason, f"{where}: {turn.detail}")
            out += [{"role": "user", "content": turn["prompt"]}, {"role": "assistant", "content": turn["completion"]}]
            continue
        # OpenAI's role/content or ShareGPT's from/value, by the keys the item has (a missing one named in its style)
        openai = "role" in item or ("from" not in item and "value" not in item)
        role_key = spec.role_key or (
            "role" if "role" in item else "from" if "from" in item else "role" if openai else "from"
        )
        content_key = spec.content_key or (
            "content" if "content" in item else "value" if "value" in item else "content" if openai else "value"
        )
        if item.get("tool_calls") or item.get("function_call"):
            return Invalid(
                "unsupported_tool_calls",
                f"{where}: structured {'tool_calls' if item.get('tool_calls') else 'function_call'} are not "
                "supported; give the call as the message content (as ShareGPT function_call turns do)",
            )
        unread = _unread_training_fields(item)
        if unread:
            return Invalid(
                "unsupported_message_field",
                f"{where}: {unread}; the message would be trained as if it were absent: drop it or keep the "
                "record out",
            )
        raw_role = item.get(role_key)
        if not isinstance(raw_role, str):
            return Invalid("missing_key", f"{where}: no string {role_key!r} (the role); keys: {sorted(item)[:20]}")
        role = roles.get(raw_role)
        if role is None:
            return Invalid(
                "unknown_role",
                f"{where}: role {raw_role!r} is not mapped; add it to input.role_map (mapped: {sorted(roles)})",
            )
        if content_key not in item:
            return Invalid("missing_key", f"{where}: no key {content_key!r}; keys: {sorted(item)[:20]}")
        text = _message_text(item[content_key], where)
        if isinstance(text, Invalid):
            return text
        out.append({"role": role, "content": text, **({WEIGHT: 0} if _weight(item) == 0 else {})})
    return out


def _tools(obj: dict[str, Any], spec: InputSpec) -> list[dict[str, Any]] | Invalid | None:
    """The record's tool definitions (a list, or a JSON string of one), as OpenAI `{type, function}` items."""
    value = obj.get(spec.tools_key)
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        decoder, repeated = checked_decoder()  # as the readers read a line: no NaN, no key given twice
        try:
            value = decoder.decode(value)
        except (ValueError, RecursionError) as exc:
            return Invalid("invalid_tools", f"{spec.tools_key!r} is a string but not JSON: {exc}")
        if repeated:
            return Invalid("invalid_tools", f"{spec.tools_key!r} (a JSON string): {duplicate_key_detail(repeated)}")
        if (problem := unkeepable(value, obj[spec.tools_key])) is not None:  # nested too deep, a lone surrogate
            return Invalid("invalid_tools", f"{spec.tools_key!r} (a JSON string): {problem[1]}")
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        return Invalid("invalid_tools", f"{spec.tools_key!r} must be a list of tool objects")
    return [t if "function" in t else {"type": "function", "function": t} for t in value] or None


def _system(obj: dict[str, Any], spec: InputSpec) -> list[dict[str, str]] | Invalid:
    value = obj.get(spec.system_key)
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        return Invalid("wrong_type", f"{spec.system_key!r} is {type(value).__name__}, expected a string")
    return [{"role": "system", "content": value}]


def _conversation(value: Any, spec: InputSpec) -> tuple[Any, dict[str, Any]] | Invalid:
    """(the message list, the enclosing object) of a chat record."""
    if isinstance(value, list):
        return value, {}
    if not isinstance(value, dict):
        return Invalid("not_an_object", f"expected a JSON object or list, got {type(value).__name__}")
    keys = [spec.messages_key] if spec.messages_key else ["messages", "conversations"]
    given = [key for key in keys if value.get(key) is not None]  # a null one is absent (a merged table's column)
    if len(given) > 1:  # which one to train is the author's call: the other would be lost without a word
        return Invalid(
            "conflicting_conversations",
            f"the record gives both {given[0]!r} and {given[1]!r}; keep one, or set input.messages_key to the one "
            "to train",
        )
    for key in given or keys:
        if key in value:
            return value[key], value
    return Invalid(
        "missing_key",
        f"no key {' or '.join(map(repr, keys))}; set input.messages_key (available keys: {sorted(value)[:20]})",
    )


def extract_chat(value: Any, spec: InputSpec) -> dict[str, Any] | Invalid:
    conv = _conversation(value, spec)
    if isinstance(conv, Invalid):
        return conv
    items, obj = conv
    messages = _messages(items, spec, "conversation")
    system = _system(obj, spec)
    tools = _tools(obj, spec)
    for part in (messages, system, tools):
        if isinstance(part, Invalid):
            return part
    assert isinstance(messages, list) and isinstance(system, list)
    clash = _two_systems(system, messages, spec)
    if clash is not None:
        return clash
    if system and messages[0]["role"] != "system":
        messages = system + messages
    return {"messages": messages, **({"tools": tools} if tools else {})}


def _two_systems(system: list[dict[str, str]], messages: list[dict[str, str]], spec: InputSpec) -> Invalid | None:
    """A record naming two different system prompts (`input.system_key` and a first system message): which one
    to train with is the author's call, not ours."""
    if system and messages and messages[0]["role"] == "system" and messages[0]["content"] != system[0]["content"]:
        return Invalid(
            "conflicting_system",
            f"{spec.system_key!r} and the first message both give a system prompt, and they differ; keep one",
        )
    return None


_HH_TURN = re.compile(r"(?:^\s*|\n\n)(Human|Assistant): ?")


def split_transcript(text: str) -> list[dict[str, str]] | Invalid | None:
    """An Anthropic-HH transcript ("\\n\\nHuman: ...\\n\\nAssistant: ...") as messages.

    None when the text is no transcript (it has no Human turn); Invalid when it has Human/Assistant turns
    but text before the first one, which would otherwise be trained as if the assistant said it.
    """
    marks = list(_HH_TURN.finditer(text))
    if not any(m.group(1) == "Human" for m in marks):
        return None
    if marks[0].start() != 0 or text[: marks[0].start()].strip():
        return Invalid("malformed_transcript", f"text before the first Human/Assistant turn: {text[:60]!r}")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [
        {"role": roles[m.group(1)], "content": text[m.end() : nxt.start() if nxt else len(text)]}
        for m, nxt in zip(marks, [*marks[1:], None])
    ]


def _branch(value: Any, spec: InputSpec, what: str, default_role: str) -> list[dict[str, str]] | Invalid:
    if isinstance(value, str):
        turns = split_transcript(value)
        return [{"role": default_role, "content": value}] if turns is None else turns
    if value is None:
        return Invalid("null_value", f"{what!r} is null")
    return _messages(value, spec, what)


def extract_preference(value: Any, spec: InputSpec) -> dict[str, Any] | Invalid:
    """{prompt?, chosen, rejected}: messages or plain text (HH transcripts split into turns).

    Without a prompt, the shared prompt is the longest run of identical leading messages of both branches.
    """
    if not isinstance(value, dict):
        return Invalid("not_an_object", f"expected a JSON object, got {type(value).__name__}")
    for key in (spec.chosen_key, spec.rejected_key):
        if key not in value:
            return Invalid("missing_key", f"no key {key!r}; available keys: {sorted(value)[:20]}")
    chosen = _branch(value[spec.chosen_key], spec, spec.chosen_key, "assistant")
    rejected = _branch(value[spec.rejected_key], spec, spec.rejected_key, "assistant")
    prompt_key = spec.prompt_keys[0]
    prompt: list[dict[str, str]] | Invalid = []
    if value.get(prompt_key) not in (None, ""):
        prompt = _branch(value[prompt_key], spec, prompt_key, "user")
    system = _system(value, spec)
    tools = _tools(value, spec)
    for part in (chosen, rejected, prompt, system, tools):
        if isinstance(part, Invalid):
            return part
    assert isinstance(chosen, list) and isinstance(rejected, list) and isinstance(prompt, list)
    assert isinstance(system, list)
    repeats = [b[: len(prompt)] == prompt for b in (chosen, rejected)] if prompt else [False, False]
    if all(repeats):
        chosen, rejected = chosen[len(prompt) :], rejected[len(prompt) :]  # branches that repeat the prompt
    elif any(repeats):  # trained on different contexts: one branch would see the prompt twice
        which = spec.chosen_key if repeats[0] else spec.rejected_key
        return Invalid(
            "inconsistent_prompt",
            f"only {which!r} repeats the given prompt at its start; repeat it in both branches or in neither",
        )
    if not prompt:
        k = 0
        while k < min(len(chosen), len(rejected)) - 1 and chosen[k] == rejected[k]:
            k += 1
        prompt, chosen, rejected = chosen[:k], chosen[k:], rejected[k:]
    if chosen == rejected:
        return Invalid("identical_branches", "chosen and rejected are the same after the shared prompt")
    k = 0  # the first message where the branches differ (a given prompt's branches may share leading turns)
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    for key, branch in ((spec.chosen_key, chosen), (spec.rejected_key, rejected)):
        if not branch:  # only the prompt it repeats: no answer to prefer or reject
            return Invalid("empty_branch", f"{key!r} holds no message after the shared prompt: no answer to compare")
        if k < len(branch) and branch[k]["role"] != "assistant":  # not a response that differs: the contexts do
            return Invalid(
                "inconsistent_prompt",
                f"the branches differ first at a {branch[k]['role']} message of {key!r}, not at the assistant's "
                "answer: a pair compares two answers to one context; give both branches the same turns before "
                "the answers",
            )
    clash = _two_systems(system, prompt, spec)
    if clash is not None:
        return clash
    if system and (not prompt or prompt[0]["role"] != "system"):
        prompt = system + prompt
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **({"tools": tools} if tools else {})}


def _as_declared(value: Any, kind: str, null_values: Iterable[str]) -> Any:
    """A JSON or Parquet value as the type `tabular.column_types` declares for its column: text is read as a CSV
    cell is (`parse_cell`), an integer is a float where floats are declared; any other value that is not of the
    type raises ValueError naming it."""
    if isinstance(value, str):
        return parse_cell(value, kind, null_values)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "float" and number:
        return float(value)
    if kind == "int" and number and isinstance(value, int):
        return value
    raise ValueError(f"{json.dumps(value)[:40]} is not {'an' if kind == 'int' else 'a'} {kind}")


class TabularExtractor:
    """Table rows (CSV, Parquet or JSON objects) as `{columns, values}` in the drop's schema order.

    The schema is `columns` when given (JSON rows: the union of the drop's keys), else the first record's keys
    (the CSV header, the Parquet schema); a record with a key outside it is rejected (`unexpected_columns`), a
    missing key is a missing value. CSV cells are typed with `csv_types` (see `tabular.infer_column_types`);
    other formats keep their JSON/Parquet types, but in the columns `tabular.column_types` types (`_as_declared`).
    A record whose `group_by` cell is missing (a `null_values` cell, null, NaN, an absent key) or blank text names
    no group: it is rejected (`empty_group_key`) rather than gathered into a group of its own that would share
    the name "null" with the text "null".
    """

    def __init__(
        self, tab: TabularSpec, source: str, csv_types: dict[str, str] | None = None, columns: list[str] | None = None
    ) -> None:
        self.tab, self.source, self.csv_types = tab, source, csv_types
        self.columns: list[str] | None = None
        self.known: set[str] = set()
        if columns:
            self.columns = self._schema(dict.fromkeys(columns))
            self.known = set(self.columns)

    def _schema(self, value: dict[str, Any]) -> list[str]:
        columns = list(value)
        for what, col in (("group_by", self.tab.group_by), ("order_by", self.tab.order_by)):
            if col is not None and col not in value:
                raise DropError(
                    f"{self.source}: tabular.{what} {col!r} is not a column of this drop (columns: {columns[:30]})"
                )
        unknown = sorted(set(self.tab.column_types) - set(columns))
        if unknown:
            raise DropError(
                f"{self.source}: tabular.column_types names {unknown}, not columns of this drop "
                f"(columns: {columns[:30]})"
            )
        return columns

    def __call__(self, value: Any, spec: InputSpec) -> dict[str, Any] | Invalid:
        if not isinstance(value, dict):
            return Invalid("not_an_object", f"expected a row (a JSON object), got {type(value).__name__}")
        if not value:
            return Invalid("empty_record", "the row has no columns")
        if "" in value:  # its cells would render under no name in the schema prompt
            return Invalid("bad_column_name", "a column has an empty name; every column needs a name")
        if self.columns is None:
            self.columns = self._schema(value)
            self.known = set(self.columns)
        extra = [k for k in value if k not in self.known]
        if extra:
            return Invalid(
                "unexpected_columns",
                f"columns {extra[:10]} are not in the drop's schema {self.columns[:30]} (taken from its first record)",
            )
        values = []
        for col in self.columns:
            v = value.get(col)
            if self.csv_types is not None and isinstance(v, str):
                try:
                    v = parse_cell(v, self.csv_types.get(col, "string"), self.tab.null_values)
                except ValueError as exc:
                    return Invalid("wrong_type", f"column {col!r} is {self.csv_types[col]}: {exc}")
            elif self.csv_types is None:
                # JSON rows: a number as written, or a reject (a CSV cell keeps its text); not where the spec rounds
                # floats (`float_digits`, Safe Synthesizer's pandas), which changes their digits by design
                inexact = _inexact(v) if self.tab.float_digits is None else None
                if inexact is not None:
                    return Invalid(
                        "inexact_number",
                        f"column {col!r}: {inexact.text[:40]} has more digits than a float holds (it would train "
                        f"as {float(inexact)!r}); give it as a JSON string to keep its text",
                    )
                if col in self.tab.column_types and v is not None:
                    declared = self.tab.column_types[col]
                    try:
                        v = _as_declared(v, declared, self.tab.null_values)
                    except ValueError as exc:
                        return Invalid("wrong_type", f"column {col!r} is {declared} (tabular.column_types): {exc}")
            values.append(json_value(v))
            if col == self.tab.group_by and is_empty_group_value(values[-1]):
                cell = "absent" if col not in value else repr(value[col])[:40]
                return Invalid(
                    "empty_group_key",
                    f"group_by column {col!r} is empty ({cell}): the record names no "
                    "group; fill the cell or leave the row out",
                )
        return {"columns": self.columns, "values": values}


def _inexact(value: Any) -> InexactFloat | None:
    """The first number in a JSON value (at any depth) that a float does not hold as written, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, InexactFloat):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


_MESSAGE_LISTS = ("messages", "prompt", "chosen", "rejected")


def content_texts(content: dict[str, Any]) -> list[str]:
    """The text fields of a content dict, in order (used for lengths and normalization); a table row's text is
    its rendered JSON line."""
    if "values" in content:
        return [render_values(content["columns"], content["values"])]
    if "text" in content:
        return [content["text"]]
    if "turns" in content:
        return [s for t in content["turns"] for s in (t["prompt"], t["completion"])]
    return [m["content"] for key in _MESSAGE_LISTS for m in content.get(key, [])]


def near_dup_text(content: dict[str, Any]) -> str:
    """What near-dedup compares: the text fields joined by newlines, without system messages (chats sharing a
    long system prompt are not near-duplicates because of it)."""
    if "values" in content or "text" in content or "turns" in content:
        return "\n".join(content_texts(content))
    return "\n".join(m["content"] for key in _MESSAGE_LISTS for m in content.get(key, []) if m.get("role") != "system")


def map_content_texts(content: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """`fn` over every text field; table rows are returned as they are (tabular values keep their bytes)."""
    if "values" in content:
        return content
    if "text" in content:
        return {**content, "text": fn(content["text"])}
    if "turns" in content:
        return {**content, "turns": [{k: fn(v) for k, v in t.items()} for t in content["turns"]]}
    return {
        **content,
        **{
            key: [{**m, "content": fn(m["content"])} for m in content[key]] for key in _MESSAGE_LISTS if key in content
        },
    }


PROVENANCE_FIELDS = [
    pa.field("record_id", pa.string(), nullable=False),
    pa.field("drop", pa.string(), nullable=False),
    pa.field("source_file", pa.string(), nullable=False),
    pa.field("source_line", pa.int64(), nullable=False),
    pa.field("byte_offset", pa.int64(), nullable=False),
]
REASON_FIELDS = [pa.field("reason", pa.string(), nullable=False), pa.field("detail", pa.string(), nullable=False)]

DEFAULT_DOMAIN = "__default__"  # the domain of a record that names none (AstrAI's name for it)

BRONZE_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("record_sha256", pa.string(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
        pa.field("content", pa.string(), nullable=False),
        pa.field("domain", pa.string(), nullable=True),  # the record's `input.domain_key` value (null: none)
    ]
)

BRONZE_REJECT_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS[1:],  # a line that is no record has no record id
        *REASON_FIELDS,
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
        pa.field("domain", pa.string(), nullable=True),
    ]
)

SILVER_REJECT_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        *REASON_FIELDS,
        pa.field("duplicate_of", pa.string(), nullable=True),
        pa.field("content", pa.string(), nullable=False),  # normalized, as the filters and dedup saw it
        pa.field("content_sha256", pa.string(), nullable=True),  # for duplicates (null: failed a filter first)
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
        # preference: both branches of a pair share pair_id (the record id); branch is chosen/rejected
        pa.field("pair_id", pa.string(), nullable=True),
        pa.field("branch", pa.string(), nullable=True),
        pa.field("shared_prefix_tokens", pa.int32(), nullable=True),  # the pair's identical masked prompt
        # tabular: the records of the example in order (its provenance columns are the first record's) and the
        # group of each BOS/EOS unit (null in flat mode)
        pa.field("record_ids", pa.list_(pa.string()), nullable=True),
        pa.field("group_keys", pa.list_(pa.string()), nullable=True),
        pa.field("domain", pa.string(), nullable=True),  # the record's domain (`input.domain_key`)
    ]
)

# gdp's categories (`input.categories`): the id a record's content carries from bronze to gold, gold's column
CATEGORY = "category_id"
NO_CATEGORY = -1  # gdp's id of padding and of a record naming no category
CATEGORY_FIELD = pa.field(CATEGORY, pa.int32(), nullable=False)
# packing.close_row_at_dropped: whether gold dropped an example (too long) of this example's split since the
# split's previous kept example; gdp's greedy closes its open row there
AFTER_DROPPED = "after_dropped"
AFTER_DROPPED_FIELD = pa.field(AFTER_DROPPED, pa.bool_(), nullable=False)


def gold_schema(categories: bool, after_dropped: bool = False) -> pa.Schema:
    """Gold's columns: `GOLD_SCHEMA`, `category_id` for a dataset with `input.categories`, and `after_dropped`
    with `packing.close_row_at_dropped`."""
    schema = GOLD_SCHEMA.append(CATEGORY_FIELD) if categories else GOLD_SCHEMA
    return schema.append(AFTER_DROPPED_FIELD) if after_dropped else schema


GOLD_REJECT_SCHEMA = pa.schema(
    [
        *PROVENANCE_FIELDS,
        pa.field("split", pa.string(), nullable=False),
        *REASON_FIELDS,
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("group_key", pa.string(), nullable=True),  # tabular: the group that cannot fit
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
        # per segment: where its first token is in its gold example (0 unless `full` or a window split it)
        pa.field("example_offsets", pa.list_(pa.int32()), nullable=False),
        pa.field("num_loss_tokens", pa.int32(), nullable=False),
    ]
)

# With `input.domain_key`: each row's domain (rows are domain-pure, a domain's rows contiguous in a file)
SHARD_DOMAIN_FIELD = pa.field("domain", pa.string(), nullable=False)


def shard_schema(domains: bool) -> pa.Schema:
    """The shard columns: `SHARD_SCHEMA`, and the `domain` column for a dataset with `input.domain_key`."""
    return SHARD_SCHEMA.append(SHARD_DOMAIN_FIELD) if domains else SHARD_SCHEMA


# token_type_ids values (SambaNova-compatible)
TYPE_PROMPT, TYPE_COMPLETION, TYPE_PADDING, TYPE_EOS = 0, 1, 2, 3
SPLITS = ("train", "validation", "test")
