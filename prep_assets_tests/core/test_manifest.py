"""The manifest's inclusion policy, a pure function of what the lake and the instance say about each drop."""

from pathlib import Path

from prep_assets.core import shards
from prep_assets.core.lake import dataset_paths, partition_lock, read_json, withdraw_manifest, write_json_atomic
from prep_assets.core.manifest import build_manifest, manifest_file_problems, manifest_partitions
from prep_assets.core.progress import reporting
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.core.helpers import run_core, sample_spec


def test_a_manifest_holds_registered_drops_whose_gates_passed_and_says_why_it_left_out_the_others():
    registered = ["a", "b", "c", "d"]
    unpassed = {"a": [], "b": ["raw_records_accounted: failed"], "c": [f"g{i}: never run" for i in range(5)], "d": []}
    included, excluded = manifest_partitions(registered, {"d": "d2", "old": "a"}, unpassed)
    assert included == ["a"]
    assert excluded == {
        "b": "raw_records_accounted: failed",
        "c": "g0: never run; g1: never run; g2: never run ...",
        "d": "superseded by d2",
        "old": "superseded by a",
    }


def test_a_drop_without_gate_results_is_included_only_when_nothing_is_said_against_it():
    included, excluded = manifest_partitions(["x"], {}, {})
    assert included == ["x"] and excluded == {}


def test_shards_replacing_files_the_manifest_names_withdraw_it_identical_bytes_keep_it(tmp_path: Path):
    """A rebuild killed before the manifest job (or one whose manifest then failed its gates) left a manifest
    naming the old shards' paths over new bytes: HF `datasets` read the new rows as the listed ones."""
    copy_sample_data(tmp_path)
    spec = sample_spec(tmp_path, "sample_text")
    results = run_core(tmp_path, spec)
    paths = dataset_paths(tmp_path, spec.name)
    manifest = read_json(paths.manifest_path)
    first = sorted(results)[0]
    shards.build(spec, paths, first)  # a rerun: the same bytes
    assert read_json(paths.manifest_path) == manifest and manifest_file_problems(paths.root, manifest) == []
    smaller = sample_spec(tmp_path, "sample_text", output={"max_tokens_per_shard": spec.sequence.max_seq_len * 2})
    lines: list[str] = []
    with reporting(lines.append):
        shards.build(smaller, paths, first)  # other files: what the manifest names would change under it
    assert not paths.manifest_path.exists() and "withdrawn" in lines[-1]
    build_manifest(smaller, paths, sorted(results))
    assert manifest_file_problems(paths.root, read_json(paths.manifest_path)) == []
    # a manifest job holding its lock (checking the files it lists) is waited for: it cannot publish the old
    # files' sha256 after the new bytes landed
    import threading
    import time

    held, released = threading.Event(), []

    def manifest_job() -> None:
        with partition_lock(paths.manifest_path):
            held.set()
            time.sleep(0.5)
            released.append(time.monotonic())

    job = threading.Thread(target=manifest_job)
    job.start()
    held.wait()
    shards.build(spec, paths, first)  # back to the first files: the manifest names others
    done = time.monotonic()
    job.join()
    assert released and released[0] <= done and not paths.manifest_path.exists()


def test_withdraw_manifest_only_for_files_of_that_folder_whose_bytes_change(tmp_path: Path):
    entry = {"path": "shards/a-1/train/part-00000.parquet", "sha256": "aa"}
    manifest = {"splits": {"train": {"files": [entry], "exports": []}}}
    path = tmp_path / "manifest.json"
    for folder, sums, withdrawn in [
        ("shards/b-2", None, False),  # another drop leaves
        ("shards/a-1", {"train/part-00000.parquet": {"sha256": "aa"}}, False),  # the same bytes again
        ("shards/a-1", {"train/part-00000.parquet": {"sha256": "bb"}}, True),
        ("shards/a-1", {"train/part-00001.parquet": {"sha256": "aa"}}, True),  # the named file is gone
        ("shards/a-1", None, True),  # the drop leaves (retired)
    ]:
        write_json_atomic(path, manifest)
        assert withdraw_manifest(path, folder, sums) is withdrawn and path.exists() is not withdrawn
    assert withdraw_manifest(tmp_path / "none.json", "shards/a-1") is False


def test_retiring_a_drop_the_manifest_names_withdraws_the_manifest_before_its_files_move(tmp_path: Path):
    from prep_assets.core.retire import retire_drop

    copy_sample_data(tmp_path)
    spec = sample_spec(tmp_path, "sample_text")
    results = run_core(tmp_path, spec)
    paths = dataset_paths(tmp_path, spec.name)
    named = read_json(paths.manifest_path)["partitions"]
    record = retire_drop(paths, sorted(named)[0])
    assert record["manifest_withdrawn"] is True and not paths.manifest_path.exists()
    assert len(results) > 1
