"""The `<dataset>_retire` job (the UI's way to retire a drop) against a real instance: the drop leaves the
partition set and the manifest, its outputs go under retired/, and neither a sensor tick nor a registration
brings its bytes back."""

import json
from pathlib import Path

from dagster import AssetKey, build_sensor_context

from prep_assets.core.drops import register_drops, registered_drops
from prep_assets.core.lake import dataset_paths
from prep_assets.core.spec import load_spec
from prep_assets.definitions import build_definitions
from prep_assets.defs.resources import LakeResource
from prep_assets.defs.sensors import build_drop_sensor
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.defs.helpers import materialize_drops, materialize_manifest, split_sample_instruct

DS = "sample_instruct"


def test_the_retire_job_takes_a_drop_out_of_the_partitions_and_the_manifest(tmp_path: Path, instance):
    data = copy_sample_data(tmp_path / "data")
    raw = data / "raw" / DS
    split_sample_instruct(data, DS)
    results = materialize_drops(data, DS, instance)
    assert all(r.success for r in results.values())
    assert materialize_manifest(data, DS, instance).success
    paths = dataset_paths(data, DS)
    b = next(d.partition for d in registered_drops(paths).values() if d.file == "b.jsonl")
    assert len(json.loads(paths.manifest_path.read_text())["partitions"]) == 2

    defs = build_definitions(data, DS)
    job = defs.resolve_job_def(f"{DS}_retire")
    config = {"ops": {f"{DS}__retire_drop": {"config": {"drop": b, "reason": "wrong answers"}}}}
    result = job.execute_in_process(instance=instance, run_config=config, resources={})
    assert result.success
    assert list(json.loads(paths.manifest_path.read_text())["partitions"]) == [a for a in results if a != b]
    assert b not in instance.get_dynamic_partitions(f"{DS}_drops")
    (mat,) = result.asset_materializations_for_node(f"{DS}__retire_drop")
    assert mat.asset_key == AssetKey([DS, "dataset_manifest"]) and mat.metadata["num_partitions"].value == 1
    record = json.loads((paths.retired_dir / b / "retired.json").read_text())
    assert record["reason"] == "wrong answers" and record["via"] == f"run {result.run_id}"
    assert (paths.retired_dir / b / "raw" / "b.jsonl").is_file() and not (raw / "b.jsonl").exists()

    # the same bytes back in raw/: neither a registration nor the drop sensor takes them again
    (raw / "b.jsonl").write_bytes((paths.retired_dir / b / "raw" / "b.jsonl").read_bytes())
    new, notes = register_drops(paths)
    assert new == [] and any(f"same bytes as retired drop {b}" in n for n in notes)
    sensor = build_drop_sensor(load_spec(data / "datasets" / f"{DS}.yaml"))
    lake = {"lake": LakeResource(data_dir=str(data))}
    cursor = None
    for _ in range(2):
        tick = sensor(build_sensor_context(instance=instance, cursor=cursor, resources=lake))
        cursor = tick.cursor
        assert not tick.run_requests and not tick.dynamic_partitions_requests
