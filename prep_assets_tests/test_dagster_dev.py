"""End to end under `dagster dev` (webserver + daemon) on 127.0.0.1: two files dropped into the raw folder
reach the manifest by the sensors and automation alone; a spec change is rebuilt by a CLI backfill; the time from
a small drop's write to its manifest entry is measured."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from prep_assets_tests.conftest import PROJECT, SAMPLE_DATA
from prep_assets_tests.servers import PREP_ASSETS, dagster_dev

pytestmark = pytest.mark.slow
DS = "sample_instruct"


def _manifest(data: Path) -> dict:
    path = data / "lake" / DS / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def test_drops_reach_the_manifest_unattended_and_a_backfill_rebuilds_a_changed_spec(tmp_path: Path):
    data, home = tmp_path / "data", tmp_path / "home"
    for sub in ("corpus", "templates"):
        shutil.copytree(SAMPLE_DATA / sub, data / sub)
    (data / "datasets").mkdir(parents=True)
    spec_path = data / "datasets" / f"{DS}.yaml"
    shutil.copyfile(SAMPLE_DATA / "datasets" / f"{DS}.yaml", spec_path)
    raw = data / "raw" / DS
    raw.mkdir(parents=True)
    with dagster_dev(home, data, tmp_path / "dagster_dev.log") as server:
        lines = (SAMPLE_DATA / "raw" / DS / "arithmetic_2026-11-01.jsonl").read_text().splitlines(keepends=True)
        (raw / "batch_a.jsonl").write_text("".join(lines[:60]))
        (raw / "batch_b.jsonl").write_text("".join(lines[60:130]))

        def both_in_manifest() -> bool:
            return len(_manifest(data).get("partitions", {})) == 2

        server.wait("both drops in the manifest", both_in_manifest, 480)
        keys = sorted(_manifest(data)["partitions"])
        assert [k.split("-")[0] for k in keys] == ["batch_a_jsonl", "batch_b_jsonl"]
        for k in keys:
            assert list((data / "lake" / DS / "shards" / k / "train").glob("part-*.parquet"))
        before = _manifest(data)
        shard_files = {k: before["partitions"][k] for k in keys}
        assert all(v["sequences"] > 0 for v in shard_files.values())

        # a spec change (the packing seed) makes the shards stale; reload the code location, then backfill
        assert spec_path.read_text().count("seed: 0") == 1
        spec_path.write_text(spec_path.read_text().replace("seed: 0", "seed: 7"))
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port)
        client.reload_repository_location("prep_assets")
        done = subprocess.run(  # the README's backfill: queued through the daemon, followed until the runs end
            [str(PREP_ASSETS), "backfill", DS, "--drops", ",".join(keys), "--data-dir", str(data)],
            cwd=PROJECT,
            env=server.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "2 run(s) of sample_instruct_drops queued" in done.stdout
        assert done.stdout.rstrip().endswith("2 of 2 run(s) succeeded"), done.stdout[-2000:]
        runs = DagsterInstance.from_config(str(home)).get_runs(
            RunsFilter(tags={"dagster/backfill": done.stdout.split()[1][:-1]})
        )
        assert len(runs) == 2 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)  # finished when it returned

        def rebuilt() -> bool:
            m = _manifest(data)
            return m.get("config_hash") != before["config_hash"] and sorted(m.get("partitions", {})) == keys

        server.wait("the backfill and the refreshed manifest", rebuilt, 480)
        after = _manifest(data)
        old = {f["path"]: f["sha256"] for s in before["splits"].values() for f in s["files"]}
        new = {f["path"]: f["sha256"] for s in after["splits"].values() for f in s["files"]}
        assert old.keys() == new.keys() and old != new  # the same shards, rows reshuffled by the new seed


LATENCY_TARGET_S = 30.0


def test_a_small_drop_reaches_the_manifest_in_seconds(tmp_path: Path):
    """Issue 34's latency: the drop sensor requests one run of every layer and gate (the drop job), the manifest
    sensor refreshes after it. Measures the time from writing a small drop to its manifest entry and prints it;
    the 30 s target is reported, the assertion is loose (2 shared cores, other jobs beside)."""
    data, home = tmp_path / "data", tmp_path / "home"
    for sub in ("corpus", "templates"):
        shutil.copytree(SAMPLE_DATA / sub, data / sub)
    (data / "datasets").mkdir(parents=True)
    shutil.copyfile(SAMPLE_DATA / "datasets" / f"{DS}.yaml", data / "datasets" / f"{DS}.yaml")
    raw = data / "raw" / DS
    raw.mkdir(parents=True)
    with dagster_dev(home, data, tmp_path / "dagster_dev.log") as server:
        # the tokenizer first (automation pins it when missing), then a few sensor ticks: a steady state
        server.wait("the tokenizer", lambda: (data / "lake" / DS / "tokenizer").is_dir(), 300)
        time.sleep(10)
        lines = (SAMPLE_DATA / "raw" / DS / "arithmetic_2026-11-01.jsonl").read_text().splitlines(keepends=True)
        started = time.monotonic()
        (raw / "small.jsonl").write_text("".join(lines[:40]))
        deadline = started + 300
        while not _manifest(data).get("partitions") and time.monotonic() < deadline:
            time.sleep(0.25)
        latency = time.monotonic() - started
        assert _manifest(data).get("partitions"), f"no manifest entry after {latency:.0f}s"
        print(f"\ndrop-to-manifest latency: {latency:.1f}s (target {LATENCY_TARGET_S:.0f}s)")
        assert latency < 4 * LATENCY_TARGET_S, f"drop-to-manifest latency {latency:.1f}s"
        (key,) = _manifest(data)["partitions"]
        assert key.startswith("small_jsonl-")
    # started in DAGSTER_HOME (as `prep-assets ui` does): Dagster reads the instance config there, without a warning
    assert "will not be used" not in (tmp_path / "dagster_dev.log").read_text()
