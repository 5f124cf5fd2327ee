"""The production profile's services started for a test on 127.0.0.1, each always stopped: a PostgreSQL server
in a temporary data directory, a Redis broker, Celery workers and the Dagster daemon."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from prep_assets_tests.conftest import PROJECT
from prep_assets_tests.servers import free_port, stop_group

BIN = Path(sys.executable).parent


def postgres_bin() -> Path | None:
    """Debian's PostgreSQL server binaries (the newest installed), or those on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


def require_services() -> Path:
    """The PostgreSQL bin dir; skips (with what to install) where PostgreSQL or Redis is absent."""
    pg = postgres_bin()
    missing = [
        name for name, ok in (("postgresql", pg is not None), ("redis-server", shutil.which("redis-server"))) if not ok
    ]
    if missing:
        pytest.skip(f"needs Debian's {' and '.join(missing)} (apt-get install {' '.join(missing)}; .ci/run does)")
    assert pg is not None
    return pg


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run the command as the `postgres` system user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass(frozen=True)
class Postgres:
    port: int
    user: str
    db: str
    datadir: Path

    def env(self) -> dict[str, str]:
        """The variables production/dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": self.db,
        }


@contextmanager
def postgres(bindir: Path, db: str = "dagster") -> Iterator[Postgres]:
    """A throwaway server on 127.0.0.1 (trust auth, no fsync) in a fresh data directory, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="prep_assets_pg_"))
    datadir, port, user = root / "data", free_port(), "prep"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    run = lambda *cmd: subprocess.run(
        _as_postgres([str(bindir / cmd[0]), *cmd[1:]]),
        check=True,  # noqa: E731
        capture_output=True,
        text=True,
        cwd=root,
    )
    try:
        run("initdb", "-D", str(datadir), "-U", user, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
        try:  # stopped even when the start timed out with the server half up
            run("pg_ctl", "-D", str(datadir), "-l", str(root / "server.log"), "-w", "-t", "60", "-o", opts, "start")
            subprocess.run(
                [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, db],
                check=True,
                capture_output=True,
                text=True,
            )
            yield Postgres(port, user, db, datadir)
        finally:
            subprocess.run(
                _as_postgres([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "fast", "-w", "-t", "60", "stop"]),
                capture_output=True,
                cwd=root,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def started(
    cmd: list[str], env: dict[str, str], log: Path, *, first: int = signal.SIGTERM
) -> Iterator[subprocess.Popen]:
    """A process (and everything it starts) in its own session, output to `log`; the group is stopped on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        stop_group(proc, first)


@contextmanager
def redis_server(log: Path, env: dict[str, str]) -> Iterator[str]:
    """A Redis server on 127.0.0.1 without persistence (environment `env`); yields its URL."""
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with started(cmd, env, log) as proc:
        deadline = time.monotonic() + 30
        while b"Ready to accept connections" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{port}/0"


def session_pids(leader: int) -> list[int]:
    """Every live process in the session `leader` started (a worker and the pool processes it forked)."""
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader:  # fields after the name: state ppid pgrp session ...
            pids.append(int(stat.split("/")[2]))
    return sorted(pids)


def processes_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment has name=value (what a test started and may have left behind)."""
    needle = f"{name}={value}".encode()
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            if needle in Path(environ).read_bytes().split(b"\0"):
                found.append(int(environ.split("/")[2]))
        except OSError:
            continue
    return sorted(found)
