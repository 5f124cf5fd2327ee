"""Progress lines for long layer work: rows done, rows/s and the time left, at most every `every_s` seconds.

Core stays silent unless a caller asks: `Progress` writes to its `emit`, by default the one `reporting` set for
the current context (none: a no-op). The Dagster assets set `context.log.info` (the run's log in the UI), the CLI
`print`, or on a terminal a `Bar` (every `advance` reaches it: the CLI draws it with tqdm). Loops call `advance`
once per batch, never per row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Emit = Callable[[str], None]
# label, rows done, total rows (None: unknown), share done (None: unknown), on every `advance`
Bar = Callable[[str, int, "int | None", "float | None"], None]


def _silent(line: str) -> None:
    pass


EVERY_S = 5.0
_EMIT: ContextVar[tuple[Emit, float]] = ContextVar("prep_assets_progress_emit", default=(_silent, EVERY_S))
_BAR: ContextVar[Bar | None] = ContextVar("prep_assets_progress_bar", default=None)


def bar_shown() -> bool:
    """Whether a `Bar` draws the progress in this context (then plain progress lines on the same terminal would
    only interleave with it)."""
    return _BAR.get() is not None


@contextmanager
def drawing(bar: Bar) -> Iterator[None]:
    """Within this block, every `Progress` created also reports each `advance` to `bar`."""
    token = _BAR.set(bar)
    try:
        yield
    finally:
        _BAR.reset(token)


@contextmanager
def reporting(emit: Emit, every_s: float | None = None) -> Iterator[None]:
    """Within this block, `Progress` objects created without an `emit` write their lines to `emit` too (the one
    set outside this block still gets them), every `every_s` seconds (None: as outside, by default 5)."""
    outer, outer_every = _EMIT.get()

    def both(line: str) -> None:
        emit(line)
        if outer is not _silent:
            outer(line)

    token = _EMIT.set((both, outer_every if every_s is None else every_s))
    try:
        yield
    finally:
        _EMIT.reset(token)


def note(line: str) -> None:
    """One line to what `reporting` set for the current context (none: a no-op)."""
    _EMIT.get()[0](line)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Counts rows of one piece of work (`label`) towards `total` (None: unknown; `advance(at=)` then gives the
    share done, e.g. bytes read of a file) and emits a line once `every_s` seconds have passed since the last
    (`emit`, `every_s` None: those `reporting` set, by default silent and 5 s)."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        emit: Emit | None = None,
        *,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        default_emit, default_every = _EMIT.get()
        self.label, self.total, self.clock = label, total, clock
        self.emit = emit if emit is not None else default_emit
        self.every_s = every_s if every_s is not None else default_every
        self.bar = _BAR.get()
        self.done = 0
        self.start = self.last = clock()

    def advance(self, n: int, at: float | None = None) -> None:
        """`n` more rows done; `at`: the share of the work done (0..1), where the total of rows is unknown."""
        self.done += n
        if self.bar is not None:
            self.bar(self.label, self.done, self.total, at)
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        share = self.done / self.total if self.total else at
        line = f"{self.label}: {self.done:,} rows"
        if self.total:
            line += f" of {self.total:,}"
        line += f", {self.done / elapsed:,.0f} rows/s"
        if share is not None and share > 0:
            line += f", {min(share, 1.0):.0%} done, ~{_duration(elapsed * max(1 - share, 0.0) / share)} left"
        self.emit(line)
