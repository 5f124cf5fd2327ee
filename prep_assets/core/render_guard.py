"""A deadline for code that cannot be interrupted from outside otherwise: a chat template's render.

Jinja templates compile to Python, so a loop in one runs Python bytecode, where an exception injected into the
thread lands; one watchdog thread serves every render."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

RENDER_SECONDS = 2.0  # per render; real templates take well under a millisecond


class RenderTimeout(BaseException):
    """Injected into a render past its deadline; a BaseException so no template or library code swallows it."""


class RenderGuard:
    """Stops a render that runs past its deadline: one watchdog thread polls the running renders and injects
    `RenderTimeout` into an overdue one (`PyThreadState_SetAsyncExc`); arming a render costs a lock and a
    dict write, never a thread. An injection not yet delivered when the render ends is withdrawn."""

    def __init__(self, seconds: float = RENDER_SECONDS) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._running: dict[int, tuple[int, float]] = {}  # thread id -> (render number, deadline)
        self._fired: set[tuple[int, int]] = set()  # (thread id, render number) injected
        self._count = 0
        self._watchdog: threading.Thread | None = None

    def run(self, fn: Callable[[], str]) -> str:
        """fn() under the deadline; raises RenderTimeout when it was stopped."""
        tid = threading.get_ident()
        with self._lock:
            self._count += 1
            number = self._count
            self._running[tid] = (number, time.monotonic() + self.seconds)
            if self._watchdog is None or not self._watchdog.is_alive():
                self._watchdog = threading.Thread(target=self._watch, name="chat-template-watchdog", daemon=True)
                self._watchdog.start()
        try:
            try:
                return fn()
            finally:
                self._disarm(tid, number)  # a late injection may land in here: caught below like any other
        except RenderTimeout:
            self._disarm(tid, number)
            raise

    def _disarm(self, tid: int, number: int) -> None:
        with self._lock:
            if self._running.get(tid, (None,))[0] == number:
                del self._running[tid]
            fired = (tid, number) in self._fired
            self._fired.discard((tid, number))
        if fired:  # withdraw an injection not yet delivered (a no-op when it was), so none outlives the render
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)

    def _watch(self) -> None:
        idle = 0.0
        step = min(0.25, self.seconds / 4)
        while True:  # the thread ends after a minute without renders and restarts with the next one
            time.sleep(step)
            now = time.monotonic()
            with self._lock:
                idle = 0.0 if self._running else idle + step
                for tid, (number, deadline) in self._running.items():
                    if now > deadline and (tid, number) not in self._fired:
                        self._fired.add((tid, number))
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(tid), ctypes.py_object(RenderTimeout)
                        )
            if idle >= 60:
                with self._lock:  # under the lock, so a render arming now sees this thread as gone
                    if not self._running:
                        self._watchdog = None
                        return
                    idle = 0.0
