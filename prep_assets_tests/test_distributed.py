"""The production profile on one machine, for real: PostgreSQL instance storage (a local server in a temporary
data directory), the Celery executor on a Redis broker with two worker processes, and the Dagster daemon
dequeuing a backfill of 6 drops. Outputs must be byte-identical to the embedded default's single-process run,
runs and events must be in PostgreSQL, more than one worker must have built partitions, and every process
started must be gone afterwards. Select with `-m distributed`."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from prep_assets.core.drops import register_drops
from prep_assets.core.lake import dataset_paths
from prep_assets_tests.conftest import PROJECT, SAMPLE_DATA
from prep_assets_tests.services import (
    BIN,
    postgres,
    processes_with_env,
    redis_server,
    require_services,
    session_pids,
    started,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

DATASET = "sample_instruct"
DROPS = 6
WORKERS = 2


def _make_data(data: Path) -> list[str]:
    """The shipped sample_instruct spec and tokenizer corpus, its drop cut into 6 drops (one per day); a sixth of
    the drop fills fewer rows, so the utilization gate is set to what 37 records reach (0.79-0.95)."""
    (data / "datasets").mkdir(parents=True)
    spec = (SAMPLE_DATA / "datasets" / f"{DATASET}.yaml").read_text(encoding="utf-8")
    assert "min_sequence_utilization: 0.8" in spec
    spec = spec.replace("min_sequence_utilization: 0.8", "min_sequence_utilization: 0.7")
    (data / "datasets" / f"{DATASET}.yaml").write_text(spec, encoding="utf-8")
    shutil.copytree(SAMPLE_DATA / "corpus", data / "corpus")
    lines = (SAMPLE_DATA / "raw" / DATASET / "arithmetic_2026-11-01.jsonl").read_bytes().splitlines(keepends=True)
    raw = data / "raw" / DATASET
    raw.mkdir(parents=True)
    size = -(-len(lines) // DROPS)
    for i in range(DROPS):
        (raw / f"arithmetic_2026-12-0{i + 1}.jsonl").write_bytes(b"".join(lines[i * size : (i + 1) * size]))
    return sorted(p.name for p in raw.iterdir())


def _lake_digests(data: Path) -> dict[str, str]:
    lake = data / "lake"
    return {
        str(p.relative_to(lake)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(lake.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(lake).parts)
    }


def _dagster(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(BIN / "dagster"), *args, "-w", "workspace.yaml"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _wait(what: str, ready, timeout: float, procs: dict[Path, subprocess.Popen]) -> None:
    """Poll `ready` every 2 s; fail with the logs' tails on timeout or as soon as a service has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [log.name for log, proc in procs.items() if proc.poll() is not None]
        if dead or ready():
            break
        time.sleep(2)
    else:
        dead = []
    if not dead and ready():
        return
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in procs if p.exists())
    pytest.fail(
        f"{'exited: ' + ', '.join(dead) if dead else f'timed out after {timeout:.0f}s'} waiting for {what}\n{tails}"
    )


def test_backfill_of_6_drops_on_postgres_and_2_celery_workers_matches_the_single_process_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pg_bin = require_services()
    import psycopg2
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

    from prep_assets.defs.sensors import UNFINISHED, latest_event_id, manifest_covers

    # the reference: the embedded default (SQLite, in-process runs) on the same 6 drops
    ref, dist = tmp_path / "ref", tmp_path / "dist"
    files = _make_data(ref)
    shutil.copytree(ref, dist)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "PREP_ASSETS_"))}
    done = subprocess.run(
        [str(BIN / "prep-assets"), "run", "--data-dir", str(ref), "--dataset", DATASET],
        cwd=PROJECT,
        env={**base, "DAGSTER_HOME": str(tmp_path / "ref_home")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reference = _lake_digests(ref)

    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(PROJECT / "production" / "dagster.yaml", home / "dagster.yaml")
    logs = tmp_path / "logs"
    logs.mkdir()
    # redis carries the same DAGSTER_HOME as every other process started here: the leak check below sees it too
    with postgres(pg_bin) as pg, redis_server(logs / "redis.log", {**base, "DAGSTER_HOME": str(home)}) as broker:
        env = {
            **base,
            **pg.env(),
            "DAGSTER_HOME": str(home),
            "PREP_ASSETS_DATA_DIR": dist.as_uri(),
            "PREP_ASSETS_EXECUTOR": "celery",
            "PREP_ASSETS_CELERY_BROKER": broker,
            "PREP_ASSETS_CELERY_BACKEND": broker,
            "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        instance = DagsterInstance.get()
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"

        # what the drop sensor does for new files: register the drops and add their partitions
        new, _ = register_drops(dataset_paths(dist, DATASET))
        keys = sorted(d.partition for d in new)
        assert len(keys) == DROPS == len(files)
        instance.add_dynamic_partitions(f"{DATASET}_drops", keys)
        # queued before the daemon starts, so automation sees the tokenizer in progress and does not request it
        _dagster(["job", "launch", "-j", f"{DATASET}_tokenizer"], env)

        worker_cmd = [
            str(BIN / "dagster-celery"),
            "worker",
            "start",
            "-A",
            "dagster_celery.app",
            "-y",
            str(PROJECT / "production" / "celery.yaml"),
            "--loglevel",
            "INFO",
        ]
        with (
            started([*worker_cmd, "-n", "w1", "--", "--concurrency", "1"], env, logs / "w1.log") as w1,
            started([*worker_cmd, "-n", "w2", "--", "--concurrency", "1"], env, logs / "w2.log") as w2,
            started(
                [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
                env,
                logs / "daemon.log",
                first=signal.SIGINT,
            ) as daemon,
        ):
            all_logs = {logs / "daemon.log": daemon, logs / "w1.log": w1, logs / "w2.log": w2}
            seen: dict[int, set[int]] = {w1.pid: set(), w2.pid: set()}

            def runs(**tags: str) -> list:
                return [r.dagster_run for r in instance.get_run_records(RunsFilter(tags=tags or None))]

            def finished(run_list: list) -> bool:
                for leader in seen:  # workers' processes, sampled while they work
                    seen[leader].update(session_pids(leader))
                failed = [r.run_id for r in run_list if r.status == DagsterRunStatus.FAILURE]
                assert not failed, f"runs failed: {failed}"
                return bool(run_list) and all(r.status == DagsterRunStatus.SUCCESS for r in run_list)

            _wait(
                "the tokenizer run",
                lambda: finished([r for r in runs() if r.job_name == f"{DATASET}_tokenizer"]),
                300,
                all_logs,
            )
            out = _dagster(
                ["job", "backfill", "-j", f"{DATASET}_drops", "--partitions", ",".join(keys), "--noprompt"], env
            )
            backfill = re.search(r"Launched backfill job `([^`]+)`", out)
            assert backfill, out
            _wait(
                "the backfill's 6 runs",
                lambda: finished(b := runs(**{"dagster/backfill": backfill.group(1)})) and len(b) == DROPS,
                900,
                all_logs,
            )
            shards, manifest = AssetKey([DATASET, "packed_shards"]), AssetKey([DATASET, "dataset_manifest"])
            _wait(
                "the manifest sensor's refresh",
                lambda: (
                    manifest_covers(instance, manifest) >= (latest_event_id(instance, shards) or 0)
                    and not instance.get_run_records(RunsFilter(statuses=UNFINISHED))
                ),
                300,
                all_logs,
            )

            # every layer of every drop materialized, each by a worker process (host:pid metadata)
            pids_by_layer = {}
            for layer in ("raw_records", "clean_records", "tokenized_examples", "packed_shards"):
                key = AssetKey([DATASET, layer])
                assert instance.get_materialized_partitions(key) == set(keys), layer
                pids_by_layer[layer] = {
                    int(r.asset_materialization.metadata["worker"].value.rsplit(":", 1)[1])
                    for r in instance.fetch_materializations(key, limit=100).records
                }
            step_pids = set().union(*pids_by_layer.values())
            worker_pids = seen[w1.pid] | seen[w2.pid]
            assert step_pids <= worker_pids, f"steps ran outside the workers: {step_pids - worker_pids}"
            assert step_pids & seen[w1.pid] and step_pids & seen[w2.pid], f"one worker did everything: {seen}"
            assert daemon.poll() is None

        # runs and events are in PostgreSQL
        with (
            psycopg2.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname=pg.db) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT status, count(*) FROM runs GROUP BY status")
            statuses = dict(cur.fetchall())
            cur.execute("SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
            (materializations,) = cur.fetchone()
            cur.execute("SELECT count(*) FROM event_logs WHERE dagster_event_type = 'STEP_SUCCESS'")
            (steps,) = cur.fetchone()
        conn.close()
        instance.dispose()
        assert statuses.get("SUCCESS", 0) >= DROPS + 2 and set(statuses) == {"SUCCESS"}, statuses
        assert materializations >= 4 * DROPS + 2, materializations

        # the same bytes as the single-process run, every file of every layer, the tokenizer and the manifest
        distributed = _lake_digests(dist)
        differing = sorted(k for k in reference.keys() | distributed.keys() if reference.get(k) != distributed.get(k))
        assert not differing, differing[:10]
        assert (
            any(k.startswith(f"{DATASET}/shards/") for k in distributed) and f"{DATASET}/manifest.json" in distributed
        )
        print(
            f"distributed: {DROPS} drops, {statuses['SUCCESS']} runs and {steps} steps in PostgreSQL, "
            f"{materializations} materializations, step pids {sorted(step_pids)} in {WORKERS} workers, "
            f"{len(distributed)} files identical to the single-process run"
        )

    left = processes_with_env("DAGSTER_HOME", str(home))
    assert not left, f"processes left running: {left}"
    assert not subprocess.run(["pgrep", "-f", str(pg.datadir)], capture_output=True).stdout, "postgres left running"
