"""Crashes, concurrent runs and a full disk: readers see the previous complete output or the new one, never a
part; a rerun after a crash is byte-identical to an uninterrupted run and leaves no temp files behind.

Each layer runs in a child process (the same core functions the Dagster assets call) that kills itself with
SIGKILL at its k-th write point (`PREP_ASSETS_CRASH_AT=k`: a Parquet row group, a JSON file, the publish)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prep_assets.core.drops import register_drops
from prep_assets.core.errors import WriteError
from prep_assets.core.faults import CRASH_ENV
from prep_assets.core.gates import gates_for
from prep_assets.core.gold import build_tokenized_examples, build_tokenizer
from prep_assets.core.lake import STAGING_DIR, dataset_paths, lock_path, sweep_stale_staging
from prep_assets.core.spec import load_spec
from prep_assets_tests.conftest import PROJECT, SAMPLE_DATA

pytestmark = pytest.mark.slow
DS = "sample_instruct"
LAYERS = ("tokenizer", "bronze", "silver", "gold", "shards", "manifest")

_CHILD = """
import sys
from pathlib import Path
import importlib
from prep_assets.core.gold import build_tokenizer
from prep_assets.core.faults import write_points_seen
from prep_assets.core.lake import dataset_paths
from prep_assets.core.manifest import build_manifest
from prep_assets.core.spec import load_spec

layer, data, ds, part = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
spec, paths = load_spec(data / "datasets" / f"{ds}.yaml"), dataset_paths(data, ds)
if layer == "tokenizer":
    build_tokenizer(spec, paths, data)
elif layer in ("bronze", "silver", "gold", "shards"):  # every layer builds a partition the same way
    importlib.import_module(f"prep_assets.core.{layer}").build(spec, paths, part)
else:
    build_manifest(spec, paths, [part])
print(write_points_seen())
"""


def _child(layer: str, data: Path, partition: str, crash_at: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = str(crash_at)
    else:
        env[CRASH_ENV] = "0"  # counts write points, never crashes
    return subprocess.run(
        [sys.executable, "-c", _CHILD, layer, str(data), DS, partition],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _output(data: Path, layer: str, partition: str) -> Path:
    paths = dataset_paths(data, DS)
    if layer == "tokenizer":
        return paths.tokenizer_dir
    return paths.manifest_path if layer == "manifest" else paths.partition_dir(layer, partition)


def _digests(path: Path) -> dict[str, str] | None:
    """sha256 of every visible file of an output (None when it is absent)."""
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _leftovers(data: Path) -> list[str]:
    """Temp and staging files in the lake and in the data dir's staging folder."""
    found = [p for p in (data / "lake").rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    found += list((data / STAGING_DIR).iterdir()) if (data / STAGING_DIR).is_dir() else []
    return sorted(str(p.relative_to(data)) for p in found)


def _sample(dest: Path) -> tuple[Path, str]:
    """sample_instruct alone in a fresh data dir, its drop registered and its tokenizer pinned."""
    for sub in ("corpus", "templates"):
        shutil.copytree(SAMPLE_DATA / sub, dest / sub)
    (dest / "datasets").mkdir(parents=True)
    shutil.copyfile(SAMPLE_DATA / "datasets" / f"{DS}.yaml", dest / "datasets" / f"{DS}.yaml")
    shutil.copytree(SAMPLE_DATA / "raw" / DS, dest / "raw" / DS)
    paths = dataset_paths(dest, DS)
    (drop,), _ = register_drops(paths)
    build_tokenizer(load_spec(dest / "datasets" / f"{DS}.yaml"), paths, dest)
    return dest, drop.partition


def _gates_pass(data: Path, layer: str, partition: str) -> None:
    spec = load_spec(data / "datasets" / f"{DS}.yaml")
    for gate in (g for g in gates_for(spec) if g.layer == layer):
        outcome = gate.probe(spec, dataset_paths(data, DS), partition)
        assert outcome.passed, f"{gate.name} after a crash: {outcome.description}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, dict], dict[str, int]]:
    """Every layer built once without interruption: its files' digests and how many write points it has."""
    data, partition = _sample(tmp_path_factory.mktemp("reference"))
    digests, points = {}, {}
    for layer in LAYERS:
        done = _child(layer, data, partition)
        assert done.returncode == 0, done.stderr[-2000:]
        points[layer] = int(done.stdout.split()[-1])
        digests[layer] = _digests(_output(data, layer, partition))
    return data, partition, digests, points


@pytest.mark.parametrize("layer", LAYERS)
def test_sigkill_at_every_stage_of_a_layer_leaves_old_or_nothing_and_the_rerun_is_identical(
    layer: str, reference, tmp_path: Path
):
    ref_data, partition, digests, points = reference
    n = points[layer]
    assert n >= 2 if layer not in ("manifest", "tokenizer") else n >= 1, f"{layer}: only {n} write point(s)"
    # the first, a middle and the last write point, as rebuilds over a complete output and as first builds
    cases = [(1, True), ((n + 1) // 2, False), (n, True), (n, False)]
    for k, previous in sorted(set(cases)):
        data = tmp_path / f"k{k}-{'rebuild' if previous else 'first'}"
        shutil.copytree(ref_data, data)
        out = _output(data, layer, partition)
        for later in LAYERS[LAYERS.index(layer) + 1 :]:  # downstream outputs are not this test's subject
            target = _output(data, later, partition)
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        if not previous:
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        crashed = _child(layer, data, partition, crash_at=k)
        assert crashed.returncode == -signal.SIGKILL, (layer, k, crashed.stderr[-1500:])
        seen = _digests(out)
        # readers see the previous complete output, or none: never a partial one
        assert seen == (digests[layer] if previous else None), (layer, k, previous)
        if previous:
            _gates_pass(data, layer, partition)
            # what `prep-assets run` does first: leftovers go even when the layer is up to date and never rebuilt
            sweep_stale_staging(dataset_paths(data, DS).root)
            assert _leftovers(data) == [], (layer, k)
        rerun = _child(layer, data, partition)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert _digests(out) == digests[layer], (layer, k, previous)  # byte-identical to an uninterrupted run
        _gates_pass(data, layer, partition)
        assert _leftovers(data) == [], (layer, k)  # the dead process's staging files were cleaned


def test_two_runs_of_one_partition_at_once_take_turns_and_equal_one_run(reference, tmp_path: Path):
    ref_data, partition, digests, _ = reference
    data = tmp_path / "data"
    shutil.copytree(ref_data, data)
    out = _output(data, "gold", partition)
    shutil.rmtree(out)
    lock = lock_path(out)
    lock.parent.mkdir(exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a run of this partition holding it would
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    args = [sys.executable, "-c", _CHILD, "gold", str(data), DS, partition]
    procs = [
        subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)
    ]
    try:
        time.sleep(8)  # long enough for both to tokenize and reach the publish
        assert not out.exists() and all(p.poll() is None for p in procs)  # both wait for the lock
    finally:
        os.close(fd)
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-1500:] for r in results]
    assert _digests(out) == digests["gold"] and _leftovers(data) == []
    _gates_pass(data, "gold", partition)


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_disk_fails_with_the_path_and_keeps_the_previous_output(reference, tmp_path: Path):
    ref_data, partition, digests, _ = reference
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "16m"):
        pytest.skip("needs root and `mount -t tmpfs` to make a small disk that fills up")
    try:
        data = disk / "data"
        shutil.copytree(ref_data, data)
        out = _output(data, "gold", partition)
        spec = load_spec(data / "datasets" / f"{DS}.yaml")
        paths = dataset_paths(data, DS)
        stat = os.statvfs(disk)
        filler = disk / "filler"
        with filler.open("wb") as f:  # leave about 4 KiB free: the new gold cannot be written
            f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - 4096))
        with pytest.raises(WriteError) as err:
            build_tokenized_examples(spec, paths.partition_dir("silver", partition), paths.tokenizer_dir, out)
        message = str(err.value)
        assert (
            str(out) in message and "No space left on device" in message and "previous output is unchanged" in message
        )
        assert _digests(out) == digests["gold"] and _leftovers(data) == []
        filler.unlink()
        build_tokenized_examples(spec, paths.partition_dir("silver", partition), paths.tokenizer_dir, out)
        assert _digests(out) == digests["gold"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
