"""The progress reporter: rows, rate and time left at most every `every_s` seconds, silent unless asked."""

from __future__ import annotations

from prep_assets.core.progress import Progress, bar_shown, drawing, reporting


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_emits_rows_rate_and_time_left_once_every_interval():
    clock, lines = FakeClock(), []
    p = Progress("silver d1: cleaning", 1000, lines.append, every_s=5, clock=clock)
    clock.now += 2
    p.advance(100)  # 2 s in: too soon
    assert lines == []
    clock.now += 3
    p.advance(150)  # 5 s, 250 rows: 50 rows/s, 750 left -> 15 s
    assert lines == ["silver d1: cleaning: 250 rows of 1,000, 50 rows/s, 25% done, ~0m15s left"]
    clock.now += 1
    p.advance(250)
    assert len(lines) == 1  # 1 s after the last line


def test_an_unknown_total_takes_the_share_done_from_the_caller():
    clock, lines = FakeClock(), []
    p = Progress("bronze d1: reading", None, lines.append, every_s=5, clock=clock)
    clock.now += 3600
    p.advance(7200, at=0.5)
    assert lines == ["bronze d1: reading: 7,200 rows, 2 rows/s, 50% done, ~1h00m left"]
    clock.now += 10
    p.advance(10)
    assert lines[-1] == "bronze d1: reading: 7,210 rows, 2 rows/s"


def test_silent_by_default_and_reporting_nests():
    clock = FakeClock()
    Progress("quiet", 10, every_s=0, clock=clock).advance(5)  # no emit set: nothing to see, nothing raised
    outer, inner = [], []
    with reporting(outer.append, every_s=0), reporting(inner.append):
        p = Progress("x", 10, clock=clock)
    clock.now += 1
    p.advance(5)
    assert inner == outer == ["x: 5 rows of 10, 5 rows/s, 50% done, ~0m01s left"]


def test_a_bar_gets_every_advance_and_says_it_is_shown_only_within_its_block():
    seen, lines, clock = [], [], FakeClock()
    assert not bar_shown()
    with reporting(lines.append, every_s=5), drawing(lambda *a: seen.append(a)):
        assert bar_shown()
        p = Progress("gold d1: tokenizing", 10, clock=clock)
        p.advance(4)
        p.advance(6)
        Progress("bronze d1: reading", clock=clock).advance(7, at=0.5)
    assert not bar_shown()
    assert seen == [("gold d1: tokenizing", 4, 10, None), ("gold d1: tokenizing", 10, 10, None)] + [
        ("bronze d1: reading", 7, None, 0.5)
    ]
    assert lines == []  # the lines keep their own interval
