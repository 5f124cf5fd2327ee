"""`dagster dev` (webserver + daemons) started for a test on 127.0.0.1, and always stopped with its children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from prep_assets_tests.conftest import PROJECT

DAGSTER = Path(sys.executable).parent / "dagster"
PREP_ASSETS = Path(sys.executable).parent / "prep-assets"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class DagsterDev:
    port: int
    env: dict[str, str]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        """Poll `ready` every 2 s; fail with the server log's tail once `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(2)
        pytest.fail(
            f"timed out after {timeout:.0f}s waiting for {what}; dagster dev log tail:\n"
            + self.log.read_text(errors="replace")[-3000:]
        )

    def up(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/server_info", timeout=2).status == 200
        except OSError:
            return False


@contextmanager
def dagster_dev(home: Path, data: Path, log: Path) -> Iterator[DagsterDev]:
    """The README's UI command, `prep-assets ui` (dagster dev on 127.0.0.1, started in DAGSTER_HOME=home with the
    project's dagster.yaml copied there when it has none), on the data dir `data`; yields once the webserver
    answers; stops the whole process group."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PREP_ASSETS_DATA_DIR": str(data)}
    server = DagsterDev(free_port(), env, log)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(PREP_ASSETS), "ui", "--data-dir", str(data), "--port", str(server.port)],
            cwd=PROJECT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        server.wait("the webserver", server.up, 120)
        yield server
    finally:
        stop_group(proc, signal.SIGINT)  # SIGINT lets dagster dev stop its children


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, grace: float = 30) -> None:
    """Stop a process started in its own session: `first` to the group, then SIGKILL to whatever is left."""
    try:
        os.killpg(proc.pid, first)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
