"""The gates as Dagster asset checks: one step per asset, each gate its own blocking check with its own result."""

from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey, AssetsDefinition, AssetSelection, DagsterInstance, materialize

from prep_assets.core import invariants as inv
from prep_assets.core.drops import register_drops
from prep_assets.core.gates import Gate, gates_for
from prep_assets.core.lake import dataset_paths
from prep_assets.core.spec import load_spec
from prep_assets.definitions import dataset_assets
from prep_assets.defs.checks import _gates_check
from prep_assets.defs.resources import LakeResource
from prep_assets_tests.conftest import write_dataset

RAW = AssetKey(["t", "raw_records"])
BRONZE_GATES = ["raw_records_accounted", "raw_records_reject_rate", "raw_records_required_fields"]


@pytest.fixture
def drop(tmp_path: Path, dagster_home: Path):
    """A text dataset with one drop (two records, one line that does not parse), its partition registered."""
    spec = {"input": {"type": "text"}, "tokenizer": {"path": "."}, "checks": {"max_reject_rate": 0.5}}
    data = write_dataset(
        tmp_path / "data", "t", spec, {"a.jsonl": b'{"text": "hello"}\n{"text": "world"}\nnot json\n'}
    )
    (d,), _ = register_drops(dataset_paths(data, "t"))
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("t_drops", [d.partition])
        yield data, d.partition, instance


def _run(data: Path, partition: str, instance: DagsterInstance, selection: AssetSelection, defs: list | None = None):
    return materialize(
        defs or dataset_assets(load_spec(data / "datasets" / "t.yaml")),
        selection=selection,
        partition_key=partition,
        instance=instance,
        raise_on_error=False,
        resources={"lake": LakeResource(data_dir=str(data))},
    )


def test_an_assets_gates_run_as_one_step_with_one_result_per_gate(drop):
    data, partition, instance = drop
    result = _run(data, partition, instance, AssetSelection.assets(RAW) | AssetSelection.checks_for_assets(RAW))
    assert result.success
    steps = {e.step_key for e in result.all_events if e.is_step_success}
    assert steps == {"t__raw_records", "t__raw_records_gates"}
    evaluations = result.get_asset_check_evaluations()
    assert [(e.check_name, e.passed) for e in evaluations] == [(name, True) for name in BRONZE_GATES]
    infos = instance.event_log_storage.get_asset_check_partition_info(
        [AssetCheckKey(RAW, n) for n in BRONZE_GATES], partition_keys=[partition]
    )
    assert sorted((i.check_key.name, i.partition_key, i.is_current) for i in infos) == [
        (n, partition, True) for n in BRONZE_GATES
    ]


def test_one_gate_can_run_alone(drop):
    data, partition, instance = drop
    assert _run(data, partition, instance, AssetSelection.assets(RAW)).success
    alone = (
        AssetSelection.checks(AssetCheckKey(RAW, "raw_records_reject_rate"))
        | AssetSelection.assets(RAW).without_checks()
    )
    result = _run(data, partition, instance, alone)
    assert [e.check_name for e in result.get_asset_check_evaluations()] == ["raw_records_reject_rate"]


def test_a_gate_that_raises_leaves_the_others_reporting_and_fails_the_step(drop):
    data, partition, instance = drop
    spec = load_spec(data / "datasets" / "t.yaml")

    def broken(*_: object) -> inv.Outcome:
        raise RuntimeError("the gate itself broke")

    first, *_, last = [g for g in gates_for(spec) if g.layer == "bronze"]
    gates = [first, Gate("raw_records", "raw_records_broken", "raises", broken), last]
    raw = next(a for a in dataset_assets(spec) if isinstance(a, AssetsDefinition) and RAW in a.keys)
    result = _run(data, partition, instance, AssetSelection.all(), [raw, _gates_check(spec, "raw_records", gates)])
    assert not result.success
    assert [(e.check_name, e.passed) for e in result.get_asset_check_evaluations()] == [
        (first.name, True),
        (last.name, True),
    ]
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_key == "t__raw_records_gates" and "the gate itself broke" in str(failure.event_specific_data)


def test_gold_reject_rate_is_a_blocking_check_of_tokenized_examples_with_its_rate_and_reasons(tmp_path: Path):
    from prep_assets.defs.checks import gate_checks, outcome_result
    from prep_assets_tests.conftest import make_spec
    from prep_assets_tests.core.lakes import write_silver_and_gold_rejects

    spec = make_spec("t")
    specs = [s for c in gate_checks(spec) for s in c.check_specs]
    gold = next(s for s in specs if s.name == "tokenized_examples_reject_rate")
    assert gold.asset_key == AssetKey(["t", "tokenized_examples"]) and gold.blocking
    s, g = write_silver_and_gold_rejects(tmp_path, 4, [("chat_template_dropped_message", 2), ("too_long", 3)])
    result = outcome_result(inv.gold_reject_rate(g, s, 0.05))
    assert not result.passed and result.metadata["gold_reject_rate"].value == 0.5
    table = result.metadata["rejects_by_reason"].value
    assert [(r.data["reason"], r.data["count"]) for r in table.records] == [
        ("chat_template_dropped_message", 1),
        ("too_long", 1),
    ]
    assert "d:2" in result.metadata["offending"].value and "f.jsonl:3" in result.metadata["offending"].value


@pytest.mark.slow  # every layer of the sample text dataset, then its manifest
def test_the_manifests_gates_run_as_one_step_with_one_result_per_gate(tmp_path: Path, dagster_home: Path):
    from prep_assets.core.gates import manifest_gates_for
    from prep_assets_tests.conftest import copy_sample_data
    from prep_assets_tests.defs.helpers import materialize_drops, materialize_manifest

    data = copy_sample_data(tmp_path / "data")
    spec = load_spec(data / "datasets" / "sample_text.yaml")
    with DagsterInstance.get() as instance:
        materialize_drops(data, "sample_text", instance)
        result = materialize_manifest(data, "sample_text", instance)
    assert result.success
    assert "sample_text__dataset_manifest_gates" in {e.step_key for e in result.all_events if e.is_step_success}
    assert [(e.check_name, e.passed, e.description) for e in result.get_asset_check_evaluations()] == [
        (g.name, True, g.description) for g in manifest_gates_for(spec)
    ]
    assert len(manifest_gates_for(spec)) == 2  # sample_text: dedup_scope dataset
