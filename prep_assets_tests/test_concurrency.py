"""Overlapping `prep-assets run`s on one data dir (same or different DAGSTER_HOME, fresh or used instances, a
`--all` beside a plain run) all exit 0 and leave every manifest equal to the one a single run writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prep_assets_tests.conftest import PROJECT, copy_sample_data

pytestmark = pytest.mark.slow

PAIRS = 20


def _start(data: Path, home: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("PREP_ASSETS_DATA_DIR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "prep_assets.cli", "run", "--data-dir", str(data), *extra],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    return out


def _manifests(data: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted((data / "lake").glob("*/manifest.json"))}


def _pairs(tmp_path: Path) -> list[tuple[str, tuple[Path, tuple[str, ...]], tuple[Path, tuple[str, ...]]]]:
    """What each overlapping pair runs: mostly cheap runs over finished work, and among them every kind that
    rebuilds while the other runs."""
    used, other = tmp_path / "home_used", tmp_path / "home_other"
    pairs = []
    for i in range(PAIRS):
        fresh = tmp_path / f"home_fresh_{i}"
        kind = {
            3: "fresh home, both",
            7: "other home",
            11: "--all beside a plain run",
            15: "other home",
            18: "fresh home, both",
        }.get(i, "same home")
        a, b = {
            "same home": ((used, ()), (used, ())),
            "other home": ((used, ()), (other, ())),
            "--all beside a plain run": ((used, ("--all",)), (used, ())),
            "fresh home, both": ((fresh, ()), (fresh, ())),
        }[kind]
        pairs.append((kind, a, b))
    return pairs


def test_overlapping_runs_end_with_the_manifests_of_a_single_run(tmp_path: Path, capsys: pytest.CaptureFixture):
    data = copy_sample_data(tmp_path / "data")
    _finish(_start(data, tmp_path / "home_used"))
    single = _manifests(data)
    assert len(single) == 5
    kinds = []
    for i, (kind, (home_a, extra_a), (home_b, extra_b)) in enumerate(_pairs(tmp_path)):
        procs = [_start(data, home_a, *extra_a), _start(data, home_b, *extra_b)]
        outs = [_finish(p) for p in procs]
        assert _manifests(data) == single, (i, kind)
        assert all("0 failed, 0 dataset(s) in error" in o for o in outs), (i, kind)
        kinds.append(kind)
    with capsys.disabled():
        print(
            f"\nconcurrency: {len(kinds)} overlapping pairs ({', '.join(sorted(set(kinds)))}), "
            f"{len(kinds)} manifests equal to a single run's"
        )
