"""Tabular records as training examples (Safe Synthesizer semantics; docs/spec.md): typing, rendering, assembly.

Pure functions over values and token counts; the gold layer (`tabular_gold`) tokenizes and writes.

Every example is: schema prompt (masked) + one or more BOS ... EOS units of records (trained), each record a
compact JSON line. `budget` below is what the records and their BOS/EOS pairs may use: max_seq_len minus the
schema prompt's tokens.
- flat: records shuffled with the seed, greedily packed under one BOS/EOS pair until `max_per` records or
  the next record would not fit.
- grouped: each group (records in `order_by` order) is one unit with its own BOS/EOS; groups shuffled with
  the seed and packed greedily, at most `max_per` groups per example.
- sequential: one group per example, records in order, never shuffled; a group longer than an example
  continues in the next. Each training example's record budget is drawn uniformly in [0.7, 1.0] x the full
  record budget with the seeded RNG (validation/test use the full budget); a first record larger than the
  draw expands it; flush on group change, budget, or `max_per` records.

CSV cells are text; a column's type is inferred over the whole drop (int if every present cell is an integer
without leading zeros, float if every present cell is a decimal number, else string) unless the spec sets it,
and cells in `null_values` (the empty string by default) are missing (null).

`order_by` sorts by its own type, inferred over the drop (`order_keys`): numbers numerically, epoch seconds and
milliseconds and ISO 8601 / M/D/YYYY (D/M/YYYY when the values demand it) date-times chronologically, else text;
ties keep input order. An empty value or one outside that type has no place in its group: gold rejects it
(`unorderable_value`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any, Literal

import numpy as np

INITIAL_PREFILL_RECORDS = 3
MIN_BUDGET_FRACTION = 0.7


def json_value(value: Any) -> Any:
    """A value as JSON can hold it: non-finite floats are missing (null); numpy scalars become Python's."""
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN / inf are not JSON: a missing value
    if isinstance(value, np.generic):
        return json_value(value.item())
    return value


def render_record(row: dict[str, Any], columns: list[str]) -> str:
    """One record as a compact JSON object, columns in schema order, missing values as null.

    Numbers stay numbers; newlines and carriage returns inside values are escaped by JSON, so a record is
    always one line.
    """
    return render_values(columns, [row.get(c) for c in columns])


def render_values(columns: list[str], values: list[Any], float_digits: int | None = None) -> str:
    """`render_record` of a record stored as parallel column/value lists (the tabular content shape).

    With `float_digits` (Safe Synthesizer: 10, its pandas `to_json` precision), floats are rounded to that many
    decimals and `/` is written `\\/`, as pandas writes them."""
    if float_digits is None:
        return json.dumps(
            {c: json_value(v) for c, v in zip(columns, values, strict=True)},
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
        )
    row = {c: _rounded(json_value(v), float_digits) for c, v in zip(columns, values, strict=True)}
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("/", "\\/")


def pandas_float_columns(values: list[list[Any]]) -> list[int]:
    """The columns pandas reads as floats though they hold integers: every present value an integer (not a bool)
    and at least one missing. Safe Synthesizer renders their integers as floats (`49.0`).

    >>> pandas_float_columns([[1, "a", 2], [None, "b", 3]])
    [0]
    """
    width = len(values[0]) if values else 0
    out = []
    for c in range(width):
        column = [v[c] for v in values]
        present = [x for x in column if x is not None]
        if len(present) < len(column) and all(isinstance(x, int) and not isinstance(x, bool) for x in present):
            out.append(c)
    return out


def _rounded(value: Any, digits: int) -> Any:
    return round(value, digits) if isinstance(value, float) else value


SS_INSTRUCTION = "Generate a JSONL dataset with the following columns: "


def safe_synthesizer_prompt(columns: list[str]) -> str:
    """Safe Synthesizer's schema prompt for its TinyLlama/Mistral metadata (the model's BOS/EOS go around it)."""
    schema = ",".join(f"{json.dumps(c, ensure_ascii=False)}:<unk>" for c in columns)
    return f"[INST] {SS_INSTRUCTION} {schema} [/INST]"


def key_columns_first(columns: list[str], group_by: str | None, order_by: str | None) -> list[str]:
    """Safe Synthesizer's sequential column order: group_by, then order_by, then the rest in schema order."""
    first = [c for c in (group_by, order_by) if c is not None and c in columns]
    return first + [c for c in columns if c not in first]


# ---------------------------------------------------------------- time series without groups or timestamps

ELAPSED_COLUMN = "elapsed_seconds"
PSEUDO_GROUP = 0  # SS's one group of an ungrouped time series (its `__nss_sequence_id`, never rendered)


def elapsed_column_name(columns: list[str]) -> str:
    """The generated timestamp column's name: `elapsed_seconds`, else `_elapsed_seconds`, else the first free
    `_elapsed_seconds_<n>` (n from 1), as Safe Synthesizer names it."""
    taken = set(columns)
    for name in (ELAPSED_COLUMN, f"_{ELAPSED_COLUMN}"):
        if name not in taken:
            return name
    n = 1
    while f"_{ELAPSED_COLUMN}_{n}" in taken:
        n += 1
    return f"_{ELAPSED_COLUMN}_{n}"


def elapsed_seconds(keys: list[str], interval: int) -> list[int]:
    """Each record's generated timestamp: its position among its group's records (input order) x `interval`.

    >>> elapsed_seconds(["a", "b", "a", "a"], 60)
    [0, 0, 60, 120]
    """
    seen: Counter[str] = Counter()
    out = []
    for k in keys:
        out.append(seen[k] * interval)
        seen[k] += 1
    return out


# ---------------------------------------------------------------- CSV cell types

_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def exact_float(cell: str) -> bool:
    """Whether a CSV number cell is a finite float that renders back to the same number (`1.10` and `1e-5` do;
    `12345678901234567.89` would train as `1.2345678901234568e+16`: digits lost)."""
    if _FLOAT.fullmatch(cell) is None:
        return False
    value = float(cell)
    return math.isfinite(value) and Decimal(repr(value)) == Decimal(cell)


def infer_column_types(
    rows: Iterable[dict[str, str]], null_values: Iterable[str], overrides: dict[str, str] | None = None
) -> dict[str, str]:
    """Per column: `int`, `float` or `string`, from every row of a drop (overrides win); a column is `float` only
    where every cell renders back to its number (`exact_float`), else it keeps its text."""
    nulls = set(null_values)
    could_int: dict[str, bool] = {}
    could_float: dict[str, bool] = {}
    for row in rows:
        for col, cell in row.items():
            if cell in nulls:
                could_int.setdefault(col, True)
                could_float.setdefault(col, True)
                continue
            if could_int.get(col, True):
                could_int[col] = _INT.fullmatch(cell) is not None
            if could_float.get(col, True):
                could_float[col] = exact_float(cell)
    types = {c: "int" if could_int[c] else "float" if could_float[c] else "string" for c in could_int}
    return {**types, **(overrides or {})}


def parse_cell(cell: str, kind: str, null_values: Iterable[str]) -> Any:
    """A CSV cell as its column's type; ValueError names what it is not."""
    if cell in null_values:
        return None
    if kind == "int":
        if _INT.fullmatch(cell) is None:
            raise ValueError(f"{cell[:40]!r} is not an integer")
        return int(cell)
    if kind == "float":
        if _FLOAT.fullmatch(cell) is None or not math.isfinite(float(cell)):
            raise ValueError(f"{cell[:40]!r} is not a finite number")
        if not exact_float(cell):
            raise ValueError(
                f"{cell[:40]!r} has more digits than a float holds (it would train as {float(cell)!r}); "
                "type the column string to keep its text"
            )
        return float(cell)
    return cell


# ---------------------------------------------------------------- order_by values

OrderType = Literal["int", "float", "epoch_s", "epoch_ms", "epoch_s_ms", "datetime", "datetime_tz", "string"]
UNORDERABLE_VALUE = "unorderable_value"

_ORDER_INT = re.compile(r"[+-]?[0-9]+")  # leading zeros order as numbers here ("007" < "10")
_TZ = r"(?P<tz>Z|[+-][0-9]{2}(?::?[0-9]{2})?)?"
_FRACTION = r"(?:[.,](?P<frac>[0-9]{1,9}))?"
_ISO = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})"
    r"(?:[T ](?P<h>[0-9]{2}):(?P<mi>[0-9]{2})(?::(?P<s>[0-9]{2})" + _FRACTION + r")?\s*" + _TZ + ")?"
)
_MDY = re.compile(
    r"(?P<mo>[0-9]{1,2})/(?P<d>[0-9]{1,2})/(?P<y>[0-9]{4})"
    r"(?:[T ](?P<h>[0-9]{1,2}):(?P<mi>[0-9]{2})(?::(?P<s>[0-9]{2})" + _FRACTION + r")?"
    r"(?:\s*(?P<ampm>[AaPp][Mm]))?)?"
)
_EPOCH_S = (10**9, 10**10)  # 2001-09-09 .. 2286-11-20 in seconds
_EPOCH_MS = (10**12, 10**13)  # the same span in milliseconds
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _datetime_key(m: re.Match[str], day_first: bool = False) -> tuple[str, int] | None:
    """(family, nanoseconds since 1970 on the value's clock) of a matched date-time; None if no real date."""
    g = m.groupdict()
    month, day_of_month = (g["d"], g["mo"]) if day_first else (g["mo"], g["d"])
    try:
        day = date(int(g["y"]), int(month), int(day_of_month)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None  # 2/30/2024, month 13
    hour, minute, second = int(g["h"] or 0), int(g["mi"] or 0), int(g["s"] or 0)
    if g.get("ampm"):
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if g["ampm"].lower() == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    ns = ((day * 24 + hour) * 60 + minute) * 60 + second
    ns = ns * 10**9 + int((g["frac"] or "0").ljust(9, "0"))
    tz = g.get("tz")
    if not tz:
        return "datetime", ns
    if tz == "Z":
        return "datetime_tz", ns
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    offset = int(digits[:2]) * 60 + int(digits[2:4] or 0)
    return "datetime_tz", ns - sign * offset * 60 * 10**9  # the instant in UTC


def order_kind(value: Any, day_first: bool = False) -> tuple[str, Any]:
    """(family, sort key) of one order_by value: `empty`, `number`, `datetime` (no time zone), `datetime_tz`
    (an instant) or `text`. Numbers may come typed or as text; dates are ISO 8601 or M/D/YYYY [H:MM[:SS]]
    (D/M/YYYY with `day_first`)."""
    if value is None:
        return "empty", None
    if isinstance(value, bool):
        return "text", _text_key(value)
    if isinstance(value, (int, float)):
        return "number", value
    if not isinstance(value, str):
        return "text", _text_key(value)
    cell = value.strip()
    if not cell:
        return "empty", None
    if _ORDER_INT.fullmatch(cell):
        return "number", int(cell)
    if _FLOAT.fullmatch(cell) and math.isfinite(float(cell)):
        return "number", float(cell)
    for pattern in (_ISO, _MDY):
        m = pattern.fullmatch(cell)
        if m is not None:
            found = _datetime_key(m, day_first and pattern is _MDY)
            if found is not None:
                return found
    return "text", value


@dataclass(frozen=True)
class OrderKeys:
    """An order_by column typed over a drop: its type, a sort key per record (None: unorderable) and why not."""

    type: OrderType
    keys: list[Any]
    problems: dict[int, str]  # record index -> the reject detail
    kinds: dict[str, int]  # non-empty values per family (the evidence the type was inferred from)
    day_first: bool = False  # slash dates read D/M/YYYY


def _slash_day_first(values: list[Any]) -> bool:
    """Slash dates are D/M/YYYY when some first field cannot be a month (> 12) and no second field is over 12."""
    fields = [
        (int(m["mo"]), int(m["d"]))
        for v in values
        if isinstance(v, str)
        if (m := _MDY.fullmatch(v.strip())) is not None
    ]
    return any(a > 12 for a, _ in fields) and not any(b > 12 for _, b in fields)


def _number_type(numbers: list[int | float]) -> OrderType:
    """int or float, or an epoch clock when every value lies in the seconds or milliseconds span."""
    in_s = [_EPOCH_S[0] <= v < _EPOCH_S[1] for v in numbers]
    in_ms = [_EPOCH_MS[0] <= v < _EPOCH_MS[1] for v in numbers]
    if numbers and all(a or b for a, b in zip(in_s, in_ms)):
        return "epoch_s" if all(in_s) else "epoch_ms" if all(in_ms) else "epoch_s_ms"
    return "int" if all(isinstance(v, int) for v in numbers) else "float"


def order_keys(values: list[Any], column: str) -> OrderKeys:
    """Type an order_by column from all its values and give each record its sort key.

    The type is the family (number, date-time without time zone, date-time with one) that more than half of
    the non-empty values parse as, narrowed: numbers are int if all are integers, else float, and an epoch
    clock if all lie in the epoch seconds or milliseconds span (read per value by its magnitude); with no such
    majority the column orders as text (by code point). Slash dates are M/D/YYYY unless the column's own values
    rule that out and allow D/M/YYYY (`_slash_day_first`). Empty values and values outside the type get no key.
    """
    day_first = _slash_day_first(values)
    kinds = [order_kind(v, day_first) for v in values]
    counts = Counter(k for k, _ in kinds if k != "empty")
    present = sum(counts.values())
    family = next((f for f, n in counts.items() if f != "text" and 2 * n > present), "text")
    if family == "number":
        kind: OrderType = _number_type([k for f, k in kinds if f == "number"])
    else:
        kind = {"datetime": "datetime", "datetime_tz": "datetime_tz"}.get(family, "string")
    keys: list[Any] = []
    problems: dict[int, str] = {}
    for i, (f, k) in enumerate(kinds):
        if f == "empty":
            problems[i] = (
                f"order_by column {column!r} is empty ({_show(values[i])}): the record has no place in "
                f"its group's order ({kind})"
            )
            keys.append(None)
        elif kind == "string":
            keys.append(_text_key(values[i]))
        elif f != family:
            problems[i] = (
                f"order_by column {column!r}: {_show(values[i])} does not read as {kind}, the column's "
                f"type ({counts[family]} of its {present} non-empty values do)"
            )
            keys.append(None)
        elif kind == "epoch_s_ms":
            keys.append(k * 1000 if k < _EPOCH_S[1] else k)  # one clock: milliseconds
        else:
            keys.append(k)
    return OrderKeys(kind, keys, problems, dict(sorted(counts.items())), day_first and family == "datetime")


def _text_key(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    )


def _show(value: Any) -> str:
    return repr(value[:60]) if isinstance(value, str) else json.dumps(value)


# ---------------------------------------------------------------- groups


def group_label(value: Any) -> str:
    """A group's key: a string as it is, anything else as compact JSON. It groups records, keys the split and
    names the group, so 7 and "7" are one group (an id read as a number in one drop and as text in another
    stays one group, in one split). Bronze rejects empty group cells, so the text "null" is only its own group."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def pandas_group_key(value: Any) -> tuple[int, Any]:
    """pandas' order of group values (groupby, sort_values): numbers numerically, then text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, group_label(value))


def is_empty_group_value(value: Any) -> bool:
    """A group cell that names no group: missing (null, a null_values cell, NaN) or blank text."""
    return value is None or (isinstance(value, str) and not value.strip())


def group_records(keys: list[str], sort_keys: list[Any] | None) -> list[list[int]]:
    """Record indices grouped by key, groups in first-appearance order, each ordered by its sort key (see
    `order_keys`; stable: ties keep input order)."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = list(groups.values())
    if sort_keys is not None:
        out = [sorted(g, key=lambda i: sort_keys[i]) for g in out]
    return out


_NAME_NEEDS_QUOTES = re.compile(r'[,"\r\n]|^\s|\s$')


def schema_prompt(columns: list[str]) -> str:
    """The masked prompt every example starts with: the column names, in schema order, `, ` between them. A name
    holding a comma, a quote or a line break, or space at either end, is written as a JSON string (`"a, b"`), so
    the list reads back one way (with such a name written bare, `a, b, c` could be two columns or three)."""
    return ", ".join(json.dumps(c, ensure_ascii=False) if _NAME_NEEDS_QUOTES.search(c) else c for c in columns) + "\n"


@dataclass(frozen=True)
class Example:
    """One training example: units of record indices, each unit wrapped in its own BOS/EOS pair."""

    units: list[list[int]]
    budget: int  # flat/grouped: the budget; sequential: the record tokens it was filled against (the draw)


Seed = int | tuple[int, ...]


def _seed(seed: Seed) -> int | list[int]:
    return list(seed) if isinstance(seed, tuple) else seed


def plan_flat(record_tokens: list[int], budget: int, max_per: int, seed: Seed) -> list[Example]:
    """Shuffle, then fill each example until max_per records or the next record would not fit."""
    order = np.random.default_rng(_seed(seed)).permutation(len(record_tokens)).tolist()
    return fill_flat(order, record_tokens, budget, max_per)


def fill_flat(order: list[int], record_tokens: list[int], budget: int, max_per: int) -> list[Example]:
    """Records in `order` (indices may repeat) packed greedily under one BOS/EOS pair per example."""
    examples: list[Example] = []
    unit: list[int] = []
    used = 2  # BOS + EOS
    for i in order:
        need = record_tokens[i]
        if unit and (len(unit) == max_per or used + need > budget):
            examples.append(Example([unit], budget))
            unit, used = [], 2
        unit.append(i)
        used += need
    if unit:
        examples.append(Example([unit], budget))
    return examples


def plan_grouped(
    groups: list[list[int]], record_tokens: list[int], budget: int, max_per: int, seed: Seed
) -> list[Example]:
    """Groups (each a unit with its own BOS/EOS) shuffled, then packed greedily, at most max_per per example."""
    order = np.random.default_rng(_seed(seed)).permutation(len(groups)).tolist()
    return fill_grouped([groups[g] for g in order], record_tokens, budget, max_per)


def fill_grouped(groups: list[list[int]], record_tokens: list[int], budget: int, max_per: int) -> list[Example]:
    """Groups in the given order packed greedily, each its own BOS/EOS unit: prompt + every unit with its
    BOS/EOS stays within max_seq_len (budget = max_seq_len - prompt)."""
    examples: list[Example] = []
    units: list[list[int]] = []
    used = 0
    for group in groups:
        need = 2 + sum(record_tokens[i] for i in group)
        if units and (len(units) == max_per or used + need > budget):
            examples.append(Example(units, budget))
            units, used = [], 0
        units.append(list(group))
        used += need
    if units:
        examples.append(Example(units, budget))
    return examples


def plan_sequential(
    groups: list[list[int]], record_tokens: list[int], budget: int, max_per: int, rng: np.random.Generator | None
) -> list[Example]:
    """One group per example, in order, continuing across examples; `rng` None = full budget (validation/test)."""
    examples: list[Example] = []
    record_budget = budget - 2  # BOS + EOS
    for records in groups:
        k = 0
        while k < len(records):
            draw = record_budget if rng is None else int(rng.uniform(MIN_BUDGET_FRACTION, 1.0) * record_budget)
            limit = max(draw, record_tokens[records[k]])  # a first record larger than the draw expands it
            unit, used = [records[k]], record_tokens[records[k]]
            k += 1
            while k < len(records) and len(unit) < max_per and used + record_tokens[records[k]] <= limit:
                used += record_tokens[records[k]]
                unit.append(records[k])
                k += 1
            examples.append(Example([unit], limit))
    return examples


# ---------------------------------------------------------------- Safe Synthesizer's sampling


def sample_passes(n: int, num_to_sample: int | None, rng: np.random.Generator) -> list[list[int]]:
    """Safe Synthesizer's `num_input_records_to_sample` over n items: int(k) passes, each a fresh permutation,
    then the first ceil(frac(k) x n) of one more, where k = num_to_sample / n (None: one pass)."""
    fraction = 1.0 if num_to_sample is None else num_to_sample / n
    whole, part = int(fraction), fraction - int(fraction)
    passes = [rng.permutation(n).tolist() for _ in range(whole)]
    if part > 0:
        passes.append(rng.permutation(n).tolist()[: math.ceil(part * n)])
    return passes


def group_passes(sizes: list[int], num_to_sample: int | None, rng: np.random.Generator) -> list[list[int]]:
    """The grouped form: whole passes over the groups; the last part takes shuffled groups until their records
    reach ceil(frac(k) x records)."""
    total = sum(sizes)
    fraction = 1.0 if num_to_sample is None else num_to_sample / total
    whole, part = int(fraction), fraction - int(fraction)
    passes = [rng.permutation(len(sizes)).tolist() for _ in range(whole)]
    if part > 0:
        order = rng.permutation(len(sizes)).tolist()
        need, seen = math.ceil(part * total), 0
        for k, g in enumerate(order):
            seen += sizes[g]
            if seen >= need:
                passes.append(order[: k + 1])
                break
    return passes


def sequence_passes(n: int, num_to_sample: int | None) -> list[range]:
    """The sequential form: passes over the ordered records, never shuffled; the last part is their first
    ceil(frac(k) x n). A new pass flushes the example being filled (SS's dataset-restart flush)."""
    fraction = 1.0 if num_to_sample is None else num_to_sample / n
    whole, part = int(fraction), fraction - int(fraction)
    return [range(n)] * whole + ([range(math.ceil(part * n))] if part > 0 else [])


def safe_synthesizer_prefill(lines: list[str]) -> str:
    """The single string Safe Synthesizer stores per group: a space, then the first 3 lines, each newline-ended."""
    return " " + "".join(line + "\n" for line in lines[:INITIAL_PREFILL_RECORDS])


def initial_prefill(groups: dict[str, list[str]], order_by: str | None = None) -> dict[str, list[str]]:
    """The first 3 rendered training records of each group (sequential mode), kept with the manifest.

    With `order_by`, each group's records (JSON lines, possibly gathered from several drops in drop order) are
    first ordered by that column (stable), so the prefill is the group's earliest records.
    """
    if order_by is None:
        return {g: rows[:INITIAL_PREFILL_RECORDS] for g, rows in sorted(groups.items())}
    flat = [(g, r) for g, rows in groups.items() for r in rows]
    typed = order_keys([json.loads(r).get(order_by) for _, r in flat], order_by)  # typed over every group at once
    keyed: dict[str, list[tuple[Any, str]]] = {}
    for (g, r), k in zip(flat, typed.keys, strict=True):
        keyed.setdefault(g, []).append((k, r))
    out = {}
    for g, rows in sorted(keyed.items()):
        known = sorted((x for x in rows if x[0] is not None), key=lambda x: x[0])
        out[g] = [r for _, r in known + [x for x in rows if x[0] is None]][:INITIAL_PREFILL_RECORDS]
    return out  # a value the merged type cannot read goes last, in drop order
