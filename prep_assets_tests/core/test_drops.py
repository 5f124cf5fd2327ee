import os
from pathlib import Path

import pytest

from prep_assets.core.drops import (
    partition_key,
    register_drops,
    registered_drops,
    resolve_drop,
    scan_raw_dir,
    slugify,
    superseded_drops,
)
from prep_assets.core.errors import DropError
from prep_assets.core.lake import dataset_paths


def test_slug_is_safe_bounded_and_never_empty():
    assert slugify("Web Crawl, 2026|v2.jsonl") == "web_crawl_2026_v2_jsonl"
    assert slugify("../x.jsonl") == "x_jsonl"
    assert slugify("日本語.jsonl") == "jsonl"
    assert slugify("!!!") == "drop"
    assert len(slugify("a" * 300)) <= 48
    key = partition_key("a" * 300 + ".jsonl", "ab" * 32)
    assert len(key) <= 64 and set(key) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-")


def test_scan_ignores_hidden_temp_unknown_and_symlinks(tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("a.jsonl", ".hidden.jsonl", "_x.jsonl", "b.jsonl.tmp", "c.part", "d.csvx", "e.txt"):
        (raw / name).write_text("{}\n")
    outside = tmp_path / "outside.jsonl"
    outside.write_text("{}\n")
    os.symlink(outside, raw / "link.jsonl")
    assert [p.name for p in scan_raw_dir(raw)] == ["a.jsonl", "e.txt"]


def test_register_same_bytes_renamed_is_not_a_new_drop(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "a.jsonl").write_text('{"text": "x"}\n')
    new, _ = register_drops(paths)
    assert len(new) == 1
    (paths.raw_dir / "b.jsonl").write_text('{"text": "x"}\n')
    new, notes = register_drops(paths)
    assert new == [] and "same bytes as drop" in notes[0]


def test_changed_file_is_a_new_drop_and_old_partition_reports_it(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "a.jsonl").write_text('{"text": "x"}\n')
    (old,), _ = register_drops(paths)
    (paths.raw_dir / "a.jsonl").write_text('{"text": "y"}\n')
    with pytest.raises(DropError, match="changed since it was registered"):
        resolve_drop(paths, old.partition)
    (new,), _ = register_drops(paths)
    assert new.partition != old.partition and set(registered_drops(paths)) == {old.partition, new.partition}
    assert resolve_drop(paths, new.partition)[1].name == "a.jsonl"


def test_superseded_version_stays_out_when_the_newer_is_deleted_or_retired_and_back_when_its_bytes_are(
    tmp_path: Path,
):
    """Retiring or deleting a replaced file's newer version brought the replaced one (say, with PII) back."""
    from prep_assets.core.retire import retire_drop

    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    raw = paths.raw_dir / "a.jsonl"
    raw.write_text('{"text": "v1 with PII"}\n')
    (v1,), _ = register_drops(paths)
    raw.write_text('{"text": "v2"}\n')
    assert superseded_drops(paths) == {}  # changed, not yet registered: nothing known to replace it
    (v2,), _ = register_drops(paths)
    assert superseded_drops(paths) == {v1.partition: v2.partition}
    raw.write_text('{"text": "v3, being written"}\n')  # bytes not registered yet: the latest registration stands
    assert superseded_drops(paths) == {v1.partition: v2.partition}
    raw.unlink()
    assert superseded_drops(paths) == {v1.partition: v2.partition}
    raw.write_text('{"text": "v1 with PII"}\n')  # an earlier version put back stands again
    assert superseded_drops(paths) == {v2.partition: v1.partition}
    raw.write_text('{"text": "v2"}\n')
    retire_drop(paths, v2.partition)
    assert not raw.exists() and superseded_drops(paths) == {v1.partition: v2.partition}


def test_unknown_partition_is_a_clear_error(tmp_path: Path):
    with pytest.raises(DropError, match="not a registered drop"):
        resolve_drop(dataset_paths(tmp_path, "ds"), "nope-123")


def test_a_renamed_drop_file_is_followed_by_its_registration(tmp_path: Path):
    """`mv a.jsonl a_2026.jsonl` left the drop failing on its missing file for good."""
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "a.jsonl").write_text('{"text": "x"}\n')
    (drop,), _ = register_drops(paths)
    (paths.raw_dir / "a.jsonl").rename(paths.raw_dir / "a_2026.jsonl")
    new, notes = register_drops(paths)
    assert new == [] and "renamed" in notes[0]
    assert registered_drops(paths)[drop.partition].file == "a_2026.jsonl"
    assert resolve_drop(paths, drop.partition)[1].name == "a_2026.jsonl"
    # a copy beside the file under its old name stays what it was: the same bytes, not a new drop
    (paths.raw_dir / "copy.jsonl").write_text('{"text": "x"}\n')
    new, notes = register_drops(paths)
    assert (
        new == [] and "not a new drop" in notes[0] and registered_drops(paths)[drop.partition].file == "a_2026.jsonl"
    )


def test_a_file_overwritten_with_another_drops_bytes_says_so_and_what_to_do(tmp_path: Path):
    """`cp a.jsonl b.jsonl`: the advice was to run again to register it, which never registers a copy."""
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "a.jsonl").write_text('{"text": "a"}\n')
    (paths.raw_dir / "b.jsonl").write_text('{"text": "b"}\n')
    a, b = sorted(register_drops(paths)[0], key=lambda d: d.file)
    (paths.raw_dir / "b.jsonl").write_text('{"text": "a"}\n')
    new, notes = register_drops(paths)
    assert new == [] and f"it was drop {b.partition}'s file" in notes[0]
    with pytest.raises(DropError, match=f"now holds the bytes of drop {a.partition}.*prep-assets retire ds"):
        resolve_drop(paths, b.partition)


def test_raw_folders_no_spec_reads_are_listed_hidden_and_underscore_names_are_not(tmp_path: Path):
    from prep_assets.core.drops import unclaimed_raw_entries

    for name in ("sample_text", "sample_txt", "_parked", ".cache", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "stray.jsonl").write_text("{}\n")
    assert unclaimed_raw_entries(tmp_path, {"sample_text", "notes"}) == ["sample_txt/", "stray.jsonl"]
    assert unclaimed_raw_entries(tmp_path / "absent", set()) == []
