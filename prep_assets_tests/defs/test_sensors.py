"""The drop sensor with `build_sensor_context` and a real (SQLite) instance: complete files only, twins,
modified files, hostile names, restarts and failed ticks."""

import os
import re
from pathlib import Path

from dagster import AssetKey, AssetMaterialization, DagsterInstance, SensorResult, build_sensor_context

from prep_assets.core.drops import registered_drops
from prep_assets.core.lake import dataset_paths
from prep_assets.core.spec import load_spec
from prep_assets.defs.resources import LakeResource
from prep_assets.defs.sensors import build_drop_sensor
from prep_assets_tests.conftest import SAMPLE_DATA, write_dataset

SPEC = {"input": {"type": "text"}, "tokenizer": {"path": "."}}  # never built here; specs need a path that exists
SAMPLE_DATASETS = SAMPLE_DATA / "datasets"
KEY = re.compile(r"^[a-z0-9_-]{1,64}$")


class Ticks:
    """Evaluates the sensor as the daemon would: the stored cursor carried over, add-requests applied."""

    def __init__(self, data: Path, instance: DagsterInstance, pinned: bool = True) -> None:
        self.data, self.instance, self.cursor = data, instance, None
        self.sensor = build_drop_sensor(load_spec(data / "datasets" / "notes.yaml"))
        if pinned:  # drop runs wait for the tokenizer: record one materialization of it
            pin_tokenizer(instance)

    def tick(self, apply: bool = True) -> SensorResult:
        ctx = build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"lake": LakeResource(data_dir=str(self.data))}
        )
        result = self.sensor(ctx)
        assert isinstance(result, SensorResult)
        if apply:  # what the daemon does with the result (build_sensor_context does not apply it)
            self.cursor = result.cursor
            for req in result.dynamic_partitions_requests or []:
                self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        return result


def pin_tokenizer(instance: DagsterInstance) -> None:
    instance.report_runless_asset_event(AssetMaterialization(AssetKey(["notes", "tokenizer"])))


def _keys(result: SensorResult) -> list[str]:
    return [r.partition_key for r in result.run_requests or []]


def _setup(tmp_path: Path, instance, files: dict[str, bytes]) -> tuple[Path, Ticks]:
    data = write_dataset(tmp_path / "data", "notes", SPEC, files)
    return data, Ticks(data, instance)


def test_a_new_file_becomes_a_drop_once_unchanged_across_two_ticks(tmp_path: Path, instance):
    data, t = _setup(tmp_path, instance, {"a.jsonl": b'{"text": "one"}\n'})
    first = t.tick()
    assert _keys(first) == [] and "still changing" in first.skip_reason.skip_message
    second = t.tick()
    (key,) = _keys(second)
    request = second.run_requests[0]
    assert request.run_key == key and KEY.match(key) and key.startswith("a_jsonl-")
    # the whole drop job (every layer and its gates in one run), not bronze alone
    assert t.sensor.job_name == "notes_drops" and request.asset_selection is None and request.job_name is None
    assert [list(r.partition_keys) for r in second.dynamic_partitions_requests] == [[key]]
    assert instance.get_dynamic_partitions("notes_drops") == [key]
    assert _keys(t.tick()) == []  # nothing new: no request, the file is not hashed again


def test_new_drops_wait_for_the_tokenizer_then_are_added_and_requested(tmp_path: Path, instance):
    data = write_dataset(tmp_path / "data", "notes", SPEC, {"a.jsonl": b'{"text": "one"}\n'})
    t = Ticks(data, instance, pinned=False)
    t.tick()
    waiting = t.tick()
    assert _keys(waiting) == [] and instance.get_dynamic_partitions("notes_drops") == []
    (key,) = registered_drops(dataset_paths(data, "notes"))  # registered in the lake all the same
    pin_tokenizer(instance)
    assert _keys(t.tick()) == [key] and instance.get_dynamic_partitions("notes_drops") == [key]


def test_a_growing_file_waits_until_it_stops_changing(tmp_path: Path, instance):
    data, t = _setup(tmp_path, instance, {"b.jsonl": b'{"text": "one"}\n'})
    t.tick()
    path = data / "raw" / "notes" / "b.jsonl"
    with path.open("ab") as f:
        f.write(b'{"text": "two"}\n')
    assert _keys(t.tick()) == []  # changed since the last tick: still being written
    (key,) = _keys(t.tick())
    assert registered_drops(dataset_paths(data, "notes"))[key].size == path.stat().st_size


def test_same_bytes_under_another_name_is_reported_not_a_new_drop(tmp_path: Path, instance):
    data, t = _setup(tmp_path, instance, {"c.jsonl": b'{"text": "one"}\n'})
    t.tick()
    (key,) = _keys(t.tick())
    (data / "raw" / "notes" / "c_copy.jsonl").write_bytes(b'{"text": "one"}\n')
    t.tick()
    result = t.tick()
    assert _keys(result) == [] and f"'c_copy.jsonl': same bytes as drop {key}" in result.skip_reason.skip_message


def test_a_modified_file_is_a_new_drop_and_the_old_partition_stays(tmp_path: Path, instance):
    data, t = _setup(tmp_path, instance, {"d.jsonl": b'{"text": "one"}\n'})
    t.tick()
    (old,) = _keys(t.tick())
    path = data / "raw" / "notes" / "d.jsonl"
    path.write_bytes(b'{"text": "one, corrected"}\n')
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    t.tick()
    (new,) = _keys(t.tick())
    assert new != old and new.startswith("d_jsonl-")
    assert set(instance.get_dynamic_partitions("notes_drops")) == {old, new}
    assert set(registered_drops(dataset_paths(data, "notes"))) == {old, new}


def test_hostile_names_give_safe_keys_and_symlinks_or_outside_paths_are_refused(tmp_path: Path, instance):
    # A 300-character file name cannot exist (Linux NAME_MAX is 255 bytes): the longest possible is here, and
    # slugify itself is tested with 300 characters (core/test_drops.py).
    names = ["a,b.jsonl", "x|y.jsonl", "Ünïcødé ✓.jsonl", "n" * 249 + ".jsonl", "-.jsonl"]
    data, t = _setup(tmp_path, instance, {n: f'{{"text": "{i}"}}\n'.encode() for i, n in enumerate(names)})
    raw = data / "raw" / "notes"
    (raw.parent / "x.jsonl").write_bytes(b'{"text": "outside"}\n')  # ../x.jsonl relative to the raw folder
    (raw / "link.jsonl").symlink_to(raw.parent / "x.jsonl")
    (raw / ".hidden.jsonl").write_bytes(b'{"text": "h"}\n')
    (raw / "upload.jsonl.part").write_bytes(b'{"text": "p"}\n')
    t.tick()
    result = t.tick()
    keys = _keys(result)
    assert len(keys) == len(names) == len(set(keys)) and all(KEY.match(k) for k in keys)
    files = {d.file for d in registered_drops(dataset_paths(data, "notes")).values()}
    assert files == set(names)  # the original names are kept as metadata
    notes = t.sensor(
        build_sensor_context(instance=instance, cursor=t.cursor, resources={"lake": LakeResource(data_dir=str(data))})
    ).skip_reason.skip_message
    assert "'link.jsonl': refused, a symlink" in notes


def test_restart_with_the_stored_cursor_and_a_failed_tick_lose_nothing(tmp_path: Path, instance):
    data, t = _setup(tmp_path, instance, {"e.jsonl": b'{"text": "one"}\n'})
    t.tick()
    stored = t.cursor
    restarted = Ticks(data, instance)  # a new process: only the stored cursor survives
    restarted.cursor = stored
    failed = restarted.tick(apply=False)  # registers the drop, then the tick "fails": nothing applied
    (key,) = _keys(failed)
    assert instance.get_dynamic_partitions("notes_drops") == []
    retry = restarted.tick()  # the next tick (old cursor) still adds it, with the same run key
    assert _keys(retry) == [key] and retry.run_requests[0].run_key == key
    assert instance.get_dynamic_partitions("notes_drops") == [key]
    assert _keys(restarted.tick()) == []


def test_dataset_scope_a_replaced_file_requests_silver_again_for_later_drops(tmp_path: Path, instance):
    from prep_assets.core.build import BUILDS
    from prep_assets.core.invariants import duplicates_resolve_to_kept

    spec = {**SPEC, "clean": {"dedup": "exact", "dedup_scope": "dataset"}}
    data = write_dataset(
        tmp_path / "data",
        "notes",
        spec,
        {"a.jsonl": b'{"text": "X"}\n{"text": "Y"}\n', "b.jsonl": b'{"text": "X"}\n{"text": "Z"}\n'},
    )
    t = Ticks(data, instance)
    t.tick()
    a, b = _keys(t.tick())
    paths = dataset_paths(data, "notes")
    loaded = load_spec(data / "datasets" / "notes.yaml")

    def silver(key: str) -> None:
        BUILDS["bronze"](loaded, paths, key)
        BUILDS["silver"](loaded, paths, key)

    silver(a), silver(b)
    assert t.tick().run_requests == []  # nothing stale
    (data / "raw" / "notes" / "a.jsonl").write_bytes(b'{"text": "X"}\n{"text": "W"}\n')  # corrected in place
    t.tick()
    result = t.tick()
    requests = {(r.partition_key, tuple(k.path[-1] for k in r.asset_selection or ())) for r in result.run_requests}
    (a2,) = {k for k, _ in requests} - {b}
    # a2: its whole drop job; b: silver again (its only earlier drop was replaced)
    requests = {(k, names or None) for k, names in requests}
    assert requests == {(a2, None), (b, ("clean_records",))}
    silver(a2)
    dirs = [paths.partition_dir("silver", k) for k in (a2, b)]
    assert not duplicates_resolve_to_kept(dirs).passed  # before the rebuild, X is lost
    silver(b)  # what the requested run does
    assert duplicates_resolve_to_kept(dirs).passed
    assert [r.partition_key for r in t.tick().run_requests] == []


def _two_drops(tmp_path: Path, instance):
    """sample_instruct cut into drops a and b, registered; (partitions, manifest sensor tick, build)."""
    from dagster import AssetSelection, materialize

    from prep_assets.core.drops import register_drops
    from prep_assets.defs.sensors import build_manifest_sensor
    from prep_assets_tests.conftest import copy_sample_data
    from prep_assets_tests.defs.helpers import dataset_defs, split_sample_instruct

    ds = "sample_instruct"
    data = copy_sample_data(tmp_path / "data")
    split_sample_instruct(data, ds)
    new, _ = register_drops(dataset_paths(data, ds))
    a, b = (d.partition for d in sorted(new, key=lambda d: d.file))
    instance.add_dynamic_partitions(f"{ds}_drops", [a, b])
    assets = dataset_defs(data, ds)
    resources = {"lake": LakeResource(data_dir=str(data))}
    sensor = build_manifest_sensor(load_spec(data / "datasets" / f"{ds}.yaml"))

    def tick():
        return sensor(build_sensor_context(instance=instance))

    def build(names: list[str], partition: str | None, checks: bool = True) -> None:
        selection = AssetSelection.assets(*(AssetKey([ds, n]) for n in names))
        assert materialize(
            assets,
            selection=selection if checks else selection.without_checks(),
            partition_key=partition,
            instance=instance,
            resources=resources,
        ).success

    return ds, a, b, tick, build


def build_manifest_sensor_job(ds: str) -> str | None:
    from prep_assets.defs.sensors import build_manifest_sensor

    return build_manifest_sensor(load_spec(SAMPLE_DATASETS / f"{ds}.yaml")).job_name


LAYERS = ["raw_records", "clean_records", "tokenized_examples", "packed_shards"]


def test_manifest_sensor_refreshes_after_every_shards_update_even_one_landing_with_a_refresh(tmp_path: Path, instance):
    """Under `dagster dev`, automation's tick flags once lost drop b: the manifest refresh and b's shards landed
    in one tick. The manifest sensor compares event ids: a manifest built before b's shards is always behind."""
    from dagster import DagsterRun, DagsterRunStatus, SkipReason

    ds, a, b, tick, build = _two_drops(tmp_path, instance)
    assert isinstance(tick(), SkipReason)  # no shards yet
    build(["tokenizer"], None)
    build(LAYERS, a)
    first = tick()
    assert [r.asset_selection for r in first.run_requests] == [None]  # the manifest job
    assert build_manifest_sensor_job(ds) == f"{ds}_manifest"
    build(["dataset_manifest"], None)
    assert isinstance(tick(), SkipReason)  # up to date: nothing requested twice
    # b's shards land right after a refresh (the lost case): the manifest is behind, a new run key
    build(LAYERS, b)
    second = tick()
    assert len(second.run_requests) == 1 and second.run_requests[0].run_key != first.run_requests[0].run_key
    # ... but not while a run that builds shards is queued or running (its gates are not in yet)
    instance.add_run(
        DagsterRun(
            job_name="__ASSET_JOB",
            run_id="0" * 8 + "-0000-0000-0000-" + "0" * 12,
            status=DagsterRunStatus.STARTED,
            asset_selection=frozenset({AssetKey([ds, "packed_shards"])}),
        )
    )
    waiting = tick()
    assert isinstance(waiting, SkipReason) and "waiting for 1 run" in waiting.skip_message


def test_a_manifest_built_while_a_drops_gates_are_still_to_run_counts_as_behind_its_shards(tmp_path: Path, instance):
    """With runs side by side (the production profile), a refresh can read drop b after its shards landed and
    before its gates ran: b is left out, and the manifest must not count b's shards as handled."""
    from dagster import SkipReason

    from prep_assets.defs.sensors import latest_event_id, manifest_covers

    ds, a, b, tick, build = _two_drops(tmp_path, instance)
    build(["tokenizer"], None)
    build(LAYERS, a)
    build(LAYERS, b, checks=False)  # b's shards are in, its gates not yet
    build(["dataset_manifest"], None)
    shards_b = latest_event_id(instance, AssetKey([ds, "packed_shards"]), b)
    assert manifest_covers(instance, AssetKey([ds, "dataset_manifest"])) < shards_b
    assert len(tick().run_requests) == 1  # asks again; once b's gates pass, the refresh includes b
    build(LAYERS, b)
    build(["dataset_manifest"], None)
    assert isinstance(tick(), SkipReason)
