"""Tabular records as training examples (DESIGN §6, Safe Synthesizer semantics): typing, rendering, assembly.

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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def render_values(columns: list[str], values: list[Any]) -> str:
    """`render_record` of a record stored as parallel column/value lists (the tabular content shape)."""
    return json.dumps({c: json_value(v) for c, v in zip(columns, values, strict=True)}, ensure_ascii=False,
                      separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------- CSV cell types

_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def infer_column_types(rows: Iterable[dict[str, str]], null_values: Iterable[str],
                       overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Per column: `int`, `float` or `string`, from every row of a drop (overrides win)."""
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
                could_float[col] = _FLOAT.fullmatch(cell) is not None and math.isfinite(float(cell))
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
        return float(cell)
    return cell


# ---------------------------------------------------------------- groups


def _order_key(value: Any) -> tuple[Any, ...]:
    """Sort key of an order_by value: numbers, then strings (ISO dates sort as text), then the rest; nulls last."""
    if value is None:
        return (3, 0)
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, json.dumps(value, sort_keys=True))


def group_label(value: Any) -> str:
    """A group's key: a string as it is, anything else as compact JSON. It groups records, keys the split and
    names the group, so 7 and "7" are one group (an id read as a number in one drop and as text in another
    stays one group, in one split). Bronze rejects empty group cells, so the text "null" is only its own group."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def is_empty_group_value(value: Any) -> bool:
    """A group cell that names no group: missing (null, a null_values cell, NaN) or blank text."""
    return value is None or (isinstance(value, str) and not value.strip())


def group_records(keys: list[str], order_values: list[Any] | None) -> list[list[int]]:
    """Record indices grouped by key, groups in first-appearance order, each ordered by its order_by value
    (stable: ties keep input order)."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = list(groups.values())
    if order_values is not None:
        out = [sorted(g, key=lambda i: _order_key(order_values[i])) for g in out]
    return out


def schema_prompt(columns: list[str]) -> str:
    """The masked prompt every example starts with: the column names, in schema order."""
    return ", ".join(columns) + "\n"


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


def plan_grouped(groups: list[list[int]], record_tokens: list[int], budget: int, max_per: int, seed: Seed
                 ) -> list[Example]:
    """Groups (each a unit with its own BOS/EOS) shuffled, then packed greedily, at most max_per per example."""
    order = np.random.default_rng(_seed(seed)).permutation(len(groups)).tolist()
    examples: list[Example] = []
    units: list[list[int]] = []
    used = 0
    for g in order:
        need = 2 + sum(record_tokens[i] for i in groups[g])
        if units and (len(units) == max_per or used + need > budget):
            examples.append(Example(units, budget))
            units, used = [], 0
        units.append(list(groups[g]))
        used += need
    if units:
        examples.append(Example(units, budget))
    return examples


def plan_sequential(groups: list[list[int]], record_tokens: list[int], budget: int, max_per: int,
                    rng: np.random.Generator | None) -> list[Example]:
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


def initial_prefill(groups: dict[str, list[str]], order_by: str | None = None) -> dict[str, list[str]]:
    """The first 3 rendered training records of each group (sequential mode), kept with the manifest.

    With `order_by`, each group's records (JSON lines, possibly gathered from several drops in drop order) are
    first ordered by that column (stable), so the prefill is the group's earliest records.
    """
    def ordered(rows: list[str]) -> list[str]:
        if order_by is None:
            return rows
        return sorted(rows, key=lambda r: _order_key(json.loads(r).get(order_by)))

    return {g: ordered(rows)[:INITIAL_PREFILL_RECORDS] for g, rows in sorted(groups.items())}
