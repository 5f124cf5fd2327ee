import os
from pathlib import Path

import pytest

from prep_assets.core import lake
from prep_assets.core.errors import PrepAssetsError
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


def test_stale_staging_of_another_machine_is_kept_unless_the_partition_lock_is_held(tmp_path: Path):
    """On a lake several machines mount, a pid means nothing off its own machine: another host's staging
    directory may belong to a live writer, except where the caller holds the partition's lock."""
    final = tmp_path / "out"
    other_host = tmp_path / ".out.tmp-999999999-0badc0de-cafe0000"
    other_host.mkdir()
    this_host_dead = tmp_path / f".out.tmp-999999999-{lake._HOST}-cafe0001"
    this_host_dead.mkdir()
    assert clean_stale_staging(final) == [this_host_dead]
    assert other_host.exists()
    assert clean_stale_staging(final, locked=True) == [other_host]


def test_lake_base_uri_is_a_path_or_file_uri_and_object_stores_are_refused_with_the_reason(tmp_path: Path):
    assert lake.data_dir_from_uri(str(tmp_path)) == tmp_path.resolve()
    assert lake.data_dir_from_uri(f"file://{tmp_path}/with%20space") == tmp_path.resolve() / "with space"
    assert lake.data_dir_from_uri(f"file://localhost{tmp_path}") == tmp_path.resolve()
    with pytest.raises(PrepAssetsError, match="s3:// is not supported.*flock"):
        lake.data_dir_from_uri("s3://bucket/data")
    with pytest.raises(PrepAssetsError, match="mount the shared filesystem"):
        lake.data_dir_from_uri("file://fileserver/export/data")
