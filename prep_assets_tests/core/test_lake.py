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
    assert (
        sorted(p.name for p in final.iterdir()) == [lake.CHECKSUMS, "a.txt"] and (final / "a.txt").read_text() == "2"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert lake.verify_published(final) == []


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
    dead = tmp_path / f".out.tmp-999999999-{lake._HOST}"  # a pid no process has, on this machine
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


def _json_dumps(value):
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def test_canonical_json_writes_the_json_modules_bytes_for_every_code_point_and_value_kind():
    """orjson writes plain values; the json module everything else: the bytes (and so every digest) are the same."""
    chars = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    for k in range(0, len(chars), 4096):
        value = {"text": chars[k : k + 4096], "b": [chars[k : k + 3], None, True, 7]}
        assert lake.canonical_json(value) == _json_dumps(value)
    edge = [
        {"z": 1, "a": [2**63 - 1, -(2**63)], "\uffff": 0, "\U0001f600": 1, "é": 2, "e": 3},
        {"f": 0.1, "g": 1e16, "h": 1e-07},  # floats: repr's format, not orjson's
        {"big": 2**70, "neg": -(2**64)},  # beyond 64 bits
        {"lone": "\ud800 surrogate"},  # orjson refuses it
        [1, [2, [3, {"x": False}]]],
    ]
    for value in edge:
        assert lake.canonical_json(value) == _json_dumps(value)


def test_loads_json_reads_what_json_loads_reads_floats_huge_ints_and_surrogates_included():
    import json

    texts = [
        '{"prompt": "a", "completion": "b"}',
        "123456789012345678901234567890",
        '{"x": [1, 2.5e-3, 1e16]}',
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        "[1e-400]",
        '{"n": 18446744073709551615, "m": -9223372036854775808}',
        '  [true, false, null, "\\u00e9\\n"]  ',
    ]
    for text in texts:
        got, want = lake.loads_json(text), json.loads(text)
        assert got == want and type(got) is type(want), text
        assert _json_dumps(got) == _json_dumps(want)
    assert type(lake.loads_json("123456789012345678901234567890")) is int  # orjson alone reads a float
    with pytest.raises(json.JSONDecodeError):
        lake.loads_json('{"unterminated": ')  # errors are the json module's, with its message


def test_staging_under_a_lake_lives_outside_it_so_lake_globs_never_see_a_half_written_file(tmp_path: Path):
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    final = tmp_path / "data" / "lake" / "ds" / "gold" / "p1"
    with staged_dir(final) as stage:
        assert stage.parent == tmp_path / "data" / lake.STAGING_DIR and stage.name.startswith("ds.gold.p1.tmp-")
        (stage / "examples.parquet").write_bytes(b"half")
        assert not list((tmp_path / "data" / "lake").rglob("*.parquet"))
    assert (final / "examples.parquet").read_bytes() == b"half"
    assert not list((tmp_path / "data" / lake.STAGING_DIR).iterdir())


def test_verify_published_names_a_truncated_a_changed_a_missing_and_an_extra_file(tmp_path: Path):
    final = tmp_path / "out"
    with staged_dir(final) as stage:
        for name in ("a.bin", "b.bin", "c.bin"):
            (stage / name).write_bytes(name.encode() * 100)
        (stage / "sub").mkdir()
        (stage / "sub" / "d.bin").write_bytes(b"d")
    assert lake.verify_published(final) == []
    (final / "a.bin").write_bytes(b"a.bin" * 50)  # truncated
    (final / "b.bin").write_bytes(b"B.bin" * 100)  # same size, other bytes
    (final / "sub" / "d.bin").unlink()
    problems = lake.verify_published(final)
    assert len(problems) == 3 and "250 bytes, 500 recorded" in problems[0] and "sha256 differs" in problems[1]
    assert problems[2].endswith("d.bin: missing")
    assert "missing" in lake.verify_published(tmp_path / "never")[0]
    with staged_dir(final) as stage:
        (stage / "a.bin").write_bytes(b"x")
    (final / "extra.bin").write_bytes(b"y")
    assert lake.verify_published(final) == [f"{final / 'extra.bin'}: not in the published checksums"]


def test_a_folder_named_lake_that_is_no_data_dirs_lake_and_a_dataset_named_lake_stage_safely(tmp_path: Path):
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    outer = tmp_path / "lake" / "notes" / "out"  # a `lake` folder with no datasets/ beside it: staged beside
    with staged_dir(outer) as stage:
        assert stage.parent == outer.parent
    named = tmp_path / "data" / "lake" / "lake" / "gold" / "p1"  # dataset `lake`: the data dir's staging
    with staged_dir(named) as stage:
        assert stage.parent == tmp_path / "data" / lake.STAGING_DIR and stage.name.startswith("lake.gold.p1.tmp-")


def test_a_dataset_folder_reached_through_a_link_is_staged_beside_its_output(tmp_path: Path):
    (tmp_path / "data" / "datasets").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "data" / "lake").mkdir()
    (tmp_path / "data" / "lake" / "ds").symlink_to(tmp_path / "elsewhere")
    final = tmp_path / "data" / "lake" / "ds" / "gold" / "p1"
    for value in ("1", "2"):  # a first publish and a replacement
        with staged_dir(final) as stage:
            assert stage.parent == final.parent
            (stage / "a.txt").write_text(value)
        assert (final / "a.txt").read_text() == value and lake.verify_published(final) == []


def test_unreadable_checksums_are_a_problem_to_rebuild_not_a_crash(tmp_path: Path):
    final = tmp_path / "out"
    with staged_dir(final) as stage:
        (stage / "a.txt").write_text("x")
    (final / lake.CHECKSUMS).write_text("{not json")
    assert "unreadable" in lake.verify_published(final)[0]
    (final / lake.CHECKSUMS).write_text('{"a.txt": {"size": 1}}')
    assert "unreadable" in lake.verify_published(final)[0]


def test_a_run_of_another_machine_is_never_taken_for_a_dead_one():
    other = "0" * len(lake._HOST) if lake._HOST != "0" * len(lake._HOST) else "1" * len(lake._HOST)
    assert lake.process_alive(f"999999999-{other}")  # its pid cannot be asked here: assumed alive
    assert not lake.process_alive(f"999999999-{lake._HOST}")
    assert lake.process_alive(lake.process_tag())


def test_sweep_removes_every_dead_writers_leftover_of_a_dataset_and_keeps_live_ones(tmp_path: Path):
    root = tmp_path / "data" / "lake" / "ds"
    staging = tmp_path / "data" / lake.STAGING_DIR
    for d in (root / "gold", staging):
        d.mkdir(parents=True)
    gone = f"999999999-{lake._HOST}"  # a pid no process has, on this machine
    dead = [
        staging / f"ds.gold.p1.tmp-{gone}-0",
        root / f".tokenizer.tmp-{gone}-1",
        root / "gold" / f".p2.old-{gone}-2",
    ]
    live = [staging / f"ds.gold.p3.tmp-{os.getppid()}-{lake._HOST}-x", staging / f"other.gold.p1.tmp-{gone}-3"]
    for d in dead + live:
        d.mkdir()
    assert sorted(lake.sweep_stale_staging(root)) == sorted(dead)
    assert all(d.exists() for d in live) and not any(d.exists() for d in dead)


def test_a_scratch_dir_takes_the_partition_locks_of_what_was_staged_in_it_away_with_it(tmp_path: Path):
    """Silver's dedup scratch left `.locks/.dedup_scratch.tmp-<pid>….bronze.lock` behind on every normal run; the
    next run reported it as left by a process that died."""
    root = tmp_path / "ds"
    root.mkdir()
    other = lake.lock_path(root / "bronze" / "p1")  # a real partition's lock beside it stays
    other.parent.mkdir(parents=True)
    other.write_text("")
    with lake.scratch_dir(root / "dedup_scratch") as tmp:
        for layer in ("bronze", "silver"):
            with staged_dir(tmp / layer) as stage:
                (stage / "x").write_text("1")
        assert len(list((root / ".locks").glob(f"{tmp.name}.*.lock"))) == 2
    assert sorted(p.name for p in (root / ".locks").iterdir()) == [other.name]
    assert [p.name for p in root.iterdir() if p.name != ".locks"] == []
