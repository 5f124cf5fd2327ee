import os
from pathlib import Path

import pytest

from prep_assets.core.lake import clean_stale_staging, staged_dir


def test_staged_dir_replaces_previous_output_whole(tmp_path: Path):
    final = tmp_path / "out"
    with staged_dir(final) as stage:
        (stage / "a.txt").write_text("1")
        (stage / "old_only.txt").write_text("x")
    with staged_dir(final) as stage:
        (stage / "a.txt").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["a.txt"] and (final / "a.txt").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failure_keeps_previous_output_and_removes_staging(tmp_path: Path):
    final = tmp_path / "out"
    with staged_dir(final) as stage:
        (stage / "a.txt").write_text("good")
    with pytest.raises(RuntimeError), staged_dir(final) as stage:
        (stage / "a.txt").write_text("half")
        raise RuntimeError("crash mid-write")
    assert (final / "a.txt").read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_stale_staging_of_dead_process_is_cleaned(tmp_path: Path):
    final = tmp_path / "out"
    dead = tmp_path / ".out.tmp-999999999-deadbeef"
    dead.mkdir()
    live = tmp_path / f".out.tmp-{os.getppid()}-cafe0000"
    live.mkdir()
    assert clean_stale_staging(final) == [dead]
    assert live.exists()
