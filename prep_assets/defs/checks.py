"""Blocking quality gates between layers: the gates `core.gates` declares, as Dagster asset checks.

A failed gate names the offending rows in its metadata and stops the layers below it in the same run.
"""

import warnings
from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    DagsterInstance,
    MetadataValue,
    multi_asset_check,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from prep_assets.core import invariants as inv
from prep_assets.core.gates import Gate, Subject, gates_for, judged, manifest_gates_for
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.keys import LAYER_ASSET, PARTITIONED, asset_key
from prep_assets.defs.metadata import counts_table, md_table
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource

warnings.filterwarnings("ignore", message=".*partitions_def.*", category=Warning)


# facts shown as metadata entries of their own too (a rate to chart, counts as a table), beside the facts JSON
_RATES = ("reject_rate", "gold_reject_rate")
_COUNTS = ("rejects_by_reason",)


def _fact_entries(facts: dict) -> dict[str, MetadataValue]:
    out = {k: MetadataValue.float(float(facts[k])) for k in _RATES if isinstance(facts.get(k), (int, float))}
    out.update({k: counts_table(facts[k]) for k in _COUNTS if isinstance(facts.get(k), dict)})
    return out


def outcome_result(outcome: inv.Outcome, asset: AssetKey | None = None, name: str | None = None) -> AssetCheckResult:
    return AssetCheckResult(
        asset_key=asset,
        check_name=name,
        passed=outcome.passed,
        severity=AssetCheckSeverity.ERROR,
        description=outcome.description,
        metadata={
            "num_violations": outcome.violations,
            "offending": md_table(outcome.offending),
            "facts": MetadataValue.json(outcome.facts),
            **_fact_entries(outcome.facts),
        },
    )


def _gates_check(spec: DatasetSpec, asset: str, gates: list[Gate]) -> AssetChecksDefinition:
    """The gates of one asset, as one step (each Dagster step has a fixed cost): each gate still is its own blocking
    check with its own result, and any subset of them can run alone (the UI's "Execute" on one check). A gate
    that raises does not stop the others; the step then fails with the first error. The partitioned layers' gates
    judge one partition, the manifest's the published manifest."""
    key = asset_key(spec, asset)
    partitions = drops_partitions(spec.name) if asset in PARTITIONED else None

    @multi_asset_check(
        name="__".join(key.path) + "_gates",  # op names are one namespace across datasets
        specs=[
            AssetCheckSpec(g.name, asset=key, blocking=True, description=g.description, partitions_def=partitions)
            for g in gates
        ],
        can_subset=True,
        description=f"the blocking quality gates of {asset}",
    )
    def _checks(context: AssetCheckExecutionContext, lake: LakeResource) -> Iterator[AssetCheckResult]:
        selected = {k.name for k in context.selected_asset_check_keys}
        partition = context.partition_key if partitions is not None else ""
        error: Exception | None = None
        for gate, outcome in judged(
            Subject(spec, lake.paths(spec.name), partition), [g for g in gates if g.name in selected]
        ):
            if isinstance(outcome, Exception):  # the other gates still run and report
                error = error or outcome
                continue
            yield outcome_result(outcome, key, gate.name)
        if error is not None:
            raise error

    return _checks


NEVER_RUN = "never run"
NOT_CURRENT = "not run on the latest materialization"


def gates_pending(problems: list[str]) -> bool:
    """Some gates have not run on the latest materialization yet and none failed: a run may be on its way."""
    return bool(problems) and all(p.endswith((f": {NEVER_RUN}", f": {NOT_CURRENT}")) for p in problems)


def unpassed_gates(instance: DagsterInstance, spec: DatasetSpec, partitions: list[str]) -> dict[str, list[str]]:
    """Per partition, the gates that did not pass on its latest materialization (failed, never run, or older)."""
    gates = gates_for(spec)
    keys = [AssetCheckKey(asset_key(spec, LAYER_ASSET[g.layer]), g.name) for g in gates]
    infos = (
        instance.event_log_storage.get_asset_check_partition_info(keys, partition_keys=partitions)
        if partitions
        else []
    )
    latest = {(i.partition_key, i.check_key.name): i for i in infos}
    out: dict[str, list[str]] = {}
    for partition in partitions:
        problems = []
        for gate in gates:
            info = latest.get((partition, gate.name))
            if info is None:
                problems.append(f"{gate.name}: {NEVER_RUN}")
            elif info.latest_execution_status != AssetCheckExecutionRecordStatus.SUCCEEDED:
                problems.append(f"{gate.name}: {info.latest_execution_status.value.lower()}")
            elif not info.is_current:
                problems.append(f"{gate.name}: {NOT_CURRENT}")
        out[partition] = problems
    return out


def gate_checks(spec: DatasetSpec) -> list[AssetChecksDefinition]:
    gates = gates_for(spec) + manifest_gates_for(spec)
    layers = list(dict.fromkeys(g.layer for g in gates))  # in layer order
    return [_gates_check(spec, LAYER_ASSET[layer], [g for g in gates if g.layer == layer]) for layer in layers]
