"""Declarative automation evaluated against a real instance: a new drop is carried layer by layer to the
shards, the tokenizer first, and a failed gate stops it (`evaluate_automation_conditions`)."""

from pathlib import Path

from dagster import AssetKey, evaluate_automation_conditions, materialize

from prep_assets.core.drops import register_drops
from prep_assets.core.lake import dataset_paths
from prep_assets.definitions import build_definitions
from prep_assets.defs.resources import LakeResource
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.defs.helpers import dataset_defs

DS = "sample_instruct"


def _key(name: str) -> AssetKey:
    return AssetKey([DS, name])


def test_a_new_drop_is_carried_layer_by_layer_to_the_shards(tmp_path: Path, instance):
    data = copy_sample_data(tmp_path / "data")
    (drop,), _ = register_drops(dataset_paths(data, DS))
    key = drop.partition
    instance.add_dynamic_partitions(f"{DS}_drops", [key])  # what the drop sensor does
    defs = build_definitions(data)
    assets = dataset_defs(data, DS)
    resources = {"lake": LakeResource(data_dir=str(data))}

    def evaluate(cursor):
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        names = (
            "tokenizer",
            "raw_records",
            "clean_records",
            "tokenized_examples",
            "packed_shards",
            "dataset_manifest",
        )
        requested = {n: result.get_requested_partitions(_key(n)) for n in names if result.get_num_requested(_key(n))}
        return result, requested

    def run(name: str, partition: str | None = key) -> None:
        assert materialize(
            assets, selection=[_key(name)], partition_key=partition, instance=instance, resources=resources
        ).success

    first, requested = evaluate(None)
    assert requested == {"tokenizer": {None}}  # bronze comes from the sensor; nothing races the tokenizer
    run("tokenizer", None)
    run("raw_records")
    cursor = first.cursor
    for layer in ("clean_records", "tokenized_examples", "packed_shards"):
        result, requested = evaluate(cursor)  # each layer once the one above it is in with its gates passed
        assert requested == {layer: {key}}
        cursor = result.cursor
        run(layer)
    _, requested = evaluate(cursor)
    assert requested == {}  # nothing requested twice; the manifest is the manifest sensor's (test_sensors.py)


def test_a_failed_bronze_gate_stops_the_drop_there(tmp_path: Path, instance):
    data = copy_sample_data(tmp_path / "data")
    raw = data / "raw" / DS
    (raw / "broken.jsonl").write_text("not json\n" * 5 + '{"prompt": "p", "completion": "c"}\n', encoding="utf-8")
    new, _ = register_drops(dataset_paths(data, DS))
    broken = next(d.partition for d in new if d.file == "broken.jsonl")
    instance.add_dynamic_partitions(f"{DS}_drops", [d.partition for d in new])
    defs = build_definitions(data)
    assets = dataset_defs(data, DS)
    resources = {"lake": LakeResource(data_dir=str(data))}
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    assert materialize(assets, selection=[_key("tokenizer")], instance=instance, resources=resources).success
    result = materialize(
        assets,
        selection=[_key("raw_records")],
        partition_key=broken,
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert [c.check_name for c in result.get_asset_check_evaluations() if not c.passed] == ["raw_records_reject_rate"]
    second = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    assert broken not in second.get_requested_partitions(_key("clean_records"))
