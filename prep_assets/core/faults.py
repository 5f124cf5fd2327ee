"""Fault injection for the crash tests: with `PREP_ASSETS_CRASH_AT=k` set, a process kills itself with SIGKILL
at its k-th write point (a Parquet row group, a JSON file, a directory publish), the way a power cut or the
OOM killer would. Unset (always, outside tests), a write point costs one environment lookup."""

from __future__ import annotations

import os
import signal

CRASH_ENV = "PREP_ASSETS_CRASH_AT"
_seen = 0


def write_point() -> None:
    global _seen
    target = os.environ.get(CRASH_ENV)
    if not target:
        return
    _seen += 1
    if _seen == int(target):
        os.kill(os.getpid(), signal.SIGKILL)


def write_points_seen() -> int:
    """How many write points this process passed (for tests choosing where to crash)."""
    return _seen
