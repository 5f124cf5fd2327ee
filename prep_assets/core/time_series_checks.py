"""Safe Synthesizer's time-series validation (`tabular.validate_time_series`; docs/spec.md, "Safe Synthesizer
recipe"): the checks its preprocessing makes before it accepts a table as a time series, on one drop's rows.

In SS's order: the reserved pseudo-group column, no missing timestamp, the timestamp read as elapsed seconds (an
integer column, or `timestamp_format: elapsed_seconds`) or as date-times in a format guessed from the first value
(or given, and then checked against the first value) that every value must parse as; per group in sorted order,
every interval between consecutive timestamps a positive whole number of seconds (within 0.1 s); every group the
same number of records, the same first and the same last timestamp; the intervals one value within each group
and across groups, and equal to `timestamp_interval_seconds` when it is given with a timestamp column.

A table that fails one is refused: `TimeSeriesRefused` names the check, the group(s) and the values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prep_assets.core.errors import DropError

SS_PSEUDO_GROUP_COLUMN = "__nss_sequence_id"  # SS's reserved column of an ungrouped series' one group
ELAPSED_FORMAT = "elapsed_seconds"
INTERVAL_TOLERANCE = 0.1  # seconds

# SS's date guess: a value's components (split at these characters) against orders of year, month, day, time and
# zone, each in its formats. SS tries them in set order, which Python's string hashing varies per process (so a
# value that reads both M/D and D/M, such as 1/7/2011, gets either); here month-first is tried before day-first.
_SEPARATORS = frozenset("/.- ,TZ+")
_YEAR, _MONTH, _DAY = ("%Y", "%y"), ("%m", "%b", "%B"), ("%d", "%a", "%A")
_TIME, _ZONE = ("%X", "%X %f"), ("%z", "%Z")
_ORDERS: tuple[Callable[..., str], ...] = (
    lambda y, m, d, t, z: f"{m} {d} {y}",
    lambda y, m, d, t, z: f"{d} {m} {y}",
    lambda y, m, d, t, z: f"{y} {m} {d}",
    lambda y, m, d, t, z: f"{y} {m} {d} {t}",
    lambda y, m, d, t, z: f"{y} {m} {d} {t} {z}",
)


def _candidate_formats() -> list[str]:
    seen: dict[str, None] = {}
    for order in _ORDERS:
        for parts in itertools.product(_YEAR, _MONTH, _DAY, _TIME, _ZONE):
            seen.setdefault(order(*parts))
    return list(seen)


_CANDIDATES = _candidate_formats()


class TimeSeriesRefused(DropError):
    """A drop that Safe Synthesizer's time-series validation refuses; `check` names the failed check."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"time-series check {check} (Safe Synthesizer's validation): {message}")


@dataclass(frozen=True)
class TimeSeriesFacts:
    """What the validation settles about an accepted series (SS writes these back into its config)."""

    timestamp_format: str  # `elapsed_seconds` or a strftime format
    interval_seconds: int | None  # None: every group holds one record
    start: str
    stop: str
    groups: int


def _split_components(text: str) -> tuple[list[str], list[str]]:
    """A date value's components and the separator runs between them, as SS tokenizes it: each separator
    character ends a component (so a run of them leaves empty ones), a trailing run ends none, and a last
    separator `Z`, or a sign before a fifth component, belongs to the zone."""
    comps: list[str] = []
    seps: list[str] = []
    start, prev_sep = 0, False
    for i, ch in enumerate(text):
        is_sep = ch in _SEPARATORS
        if is_sep:
            if prev_sep:
                seps[-1] += ch
            else:
                seps.append(ch)
        prev_sep = is_sep
        if is_sep or i == len(text) - 1:
            stop = i + 1 if (i == len(text) - 1 and not is_sep) else i
            comps.append(text[start:stop])
            start = i + 1
    if len(comps) == 5 and seps and seps[-1] in ("-", "+"):
        comps[-1] = seps.pop() + comps[-1]
    elif len(comps) == 4 and seps and seps[-1] == "Z":
        comps.append(seps.pop())
    return comps, seps


def guess_timestamp_format(value: str) -> str | None:
    """The strftime format of one date value, guessed as Safe Synthesizer guesses it (its separators kept), or
    None when no candidate reads it.

    >>> guess_timestamp_format("2011-01-14 10:00:00"), guess_timestamp_format("1/14/2011 10:00:00")
    ('%Y-%m-%d %X', None)
    """
    if "#" in value:  # SS's tokenizer refuses its mask character
        return None
    comps, seps = _split_components(value)
    joined = " ".join(comps)
    for fmt in _CANDIDATES:
        try:
            datetime.strptime(joined, fmt)
        except ValueError:
            continue
        pieces = fmt.split(" ")
        out = [p for pair in itertools.zip_longest(pieces, seps) for p in pair if p is not None]
        return "".join(out)
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v: Any) -> str:
    return repr(v[:60]) if isinstance(v, str) else str(v)


def _timestamps(values: list[Any], column: str, timestamp_format: str | None) -> tuple[list[Any], str]:
    """Each value as a number of seconds or a datetime, and the format it was read in."""
    missing = sum(v is None for v in values)
    if missing:
        raise TimeSeriesRefused("timestamp_missing", f"timestamp column {column!r} has {missing} missing value(s)")
    integers = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if timestamp_format == ELAPSED_FORMAT or (timestamp_format is None and integers):
        if any(isinstance(v, bool) for v in values):
            raise TimeSeriesRefused("elapsed_seconds", f"elapsed seconds in {column!r} must be numbers, not booleans")
        if not all(_is_number(v) for v in values):
            bad = next(v for v in values if not _is_number(v))
            raise TimeSeriesRefused(
                "elapsed_seconds",
                f"timestamp_format elapsed_seconds needs a numeric column; {column!r} holds {_show(bad)}",
            )
        if not all(math.isfinite(v) for v in values):
            raise TimeSeriesRefused("elapsed_seconds", f"elapsed seconds in {column!r} must be finite")
        return values, ELAPSED_FORMAT
    first = str(values[0])
    fmt = timestamp_format
    if fmt is None:
        fmt = guess_timestamp_format(first)
        if fmt is None:
            raise TimeSeriesRefused(
                "timestamp_format",
                f"no date format reads the first value of {column!r} ({first[:60]!r}); numbers of seconds need "
                "timestamp_format: elapsed_seconds, other dates an explicit timestamp_format",
            )
    else:
        try:
            datetime.strptime(first, fmt)
        except ValueError:
            guess = guess_timestamp_format(first)
            hint = f" (it reads as {guess!r})" if guess is not None else ""
            raise TimeSeriesRefused(
                "timestamp_format",
                f"timestamp_format {fmt!r} does not read the first value of {column!r}, {first[:60]!r}{hint}",
            ) from None
    parsed: list[Any] = []
    failed: list[str] = []
    for v in values:
        try:
            parsed.append(datetime.strptime(str(v), fmt))
        except ValueError:
            failed.append(str(v))
    if failed:
        source = "given" if timestamp_format is not None else "guessed"
        raise TimeSeriesRefused(
            "timestamp_parse",
            f"{len(failed)} value(s) of {column!r} do not read in the {source} format {fmt!r} "
            f"(first: {failed[0][:60]!r})",
        )
    return parsed, fmt


def _seconds(a: Any, b: Any) -> float:
    delta = b - a
    return float(delta) if _is_number(delta) else delta.total_seconds()


def _whole_interval(seconds: float, group: str) -> int:
    rounded = round(seconds)
    if rounded <= 0 or abs(seconds - rounded) > INTERVAL_TOLERANCE:
        raise TimeSeriesRefused(
            "interval_whole_seconds",
            f"an interval in group {group!r} is {seconds:g} s: intervals must be positive whole seconds",
        )
    return rounded


def validate_time_series(
    columns: list[str],
    values: list[list[Any]],
    groups: list[tuple[Any, str]] | None,
    timestamp: str,
    timestamp_format: str | None = None,
    interval_seconds: int | None = None,
) -> TimeSeriesFacts:
    """Check one drop's rows as Safe Synthesizer validates a time series; raise `TimeSeriesRefused` on the first
    check that fails, in SS's order.

    `groups`: per record its (sort key, label), groups visited in sort-key order (pandas' order of group values);
    None for an ungrouped series (one group). `timestamp`: the column ordering each group (a generated elapsed
    column included). `interval_seconds`: the interval given with a timestamp column, checked against the data.
    """
    if not values:
        raise TimeSeriesRefused("empty", "a time series needs at least one record")
    if groups is None and SS_PSEUDO_GROUP_COLUMN in columns:
        raise TimeSeriesRefused(
            "pseudo_group_column", f"column {SS_PSEUDO_GROUP_COLUMN!r} is reserved for an ungrouped series"
        )
    ti = columns.index(timestamp)
    stamps, fmt = _timestamps([v[ti] for v in values], timestamp, timestamp_format)
    members: dict[str, list[int]] = {}
    sort_of: dict[str, Any] = {}
    for i, (key, label) in enumerate(groups if groups is not None else [((0, 0), "0")] * len(values)):
        members.setdefault(label, []).append(i)
        sort_of.setdefault(label, key)
    stats = []  # (label, count, start, stop, interval or None)
    for label in sorted(members, key=lambda g: sort_of[g]):
        ordered = sorted(stamps[i] for i in members[label])
        intervals = {_whole_interval(_seconds(a, b), label) for a, b in itertools.pairwise(ordered)}
        one = intervals.pop() if len(intervals) == 1 else None
        stats.append((label, len(ordered), ordered[0], ordered[-1], one))
    if len({s[1] for s in stats}) > 1:
        shown = ", ".join(f"{s[0]}={s[1]}" for s in stats[:5]) + ("..." if len(stats) > 5 else "")
        raise TimeSeriesRefused("group_sizes", f"groups must hold the same number of records; sizes: {shown}")
    for check, pos in (("start_timestamps", 2), ("stop_timestamps", 3)):
        first_group: dict[Any, str] = {}
        for s in stats:
            first_group.setdefault(s[pos], s[0])
        distinct = sorted((str(t), g) for t, g in first_group.items())
        if len(distinct) > 1:
            shown = ", ".join(f"{g}: {t}" for t, g in distinct[:5])
            raise TimeSeriesRefused(
                check,
                f"groups must share their {'first' if pos == 2 else 'last'} timestamp; {len(distinct)} differ "
                f"({shown}{'...' if len(distinct) > 5 else ''})",
            )
    several = [s for s in stats if s[1] > 1]
    if interval_seconds is not None:
        for s in several:
            if s[4] is None or abs(s[4] - interval_seconds) > INTERVAL_TOLERANCE:
                found = "uneven" if s[4] is None else f"{s[4]} s"
                raise TimeSeriesRefused(
                    "interval_given",
                    f"timestamp_interval_seconds {interval_seconds} does not match group {s[0]!r} (its intervals: "
                    f"{found})",
                )
        interval: int | None = interval_seconds
    else:
        uneven = [s[0] for s in several if s[4] is None]
        if uneven:
            raise TimeSeriesRefused("interval_within_group", f"the intervals of group {uneven[0]!r} differ")
        found_intervals = sorted({s[4] for s in several if s[4] is not None})
        if len(found_intervals) > 1:
            raise TimeSeriesRefused("interval_across_groups", f"groups have different intervals: {found_intervals}")
        interval = found_intervals[0] if found_intervals else None
    return TimeSeriesFacts(fmt, interval, str(stats[0][2]), str(stats[0][3]), len(stats))
