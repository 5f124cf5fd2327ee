"""Blocking quality gates between layers: thin wrappers over `core.invariants` (DuckDB over Parquet).

A failed gate names the offending rows in its metadata and stops the layers below it in the same run.
"""


import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    DagsterInstance,
    MetadataValue,
    asset_check,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from prep_assets.core import invariants as inv
from prep_assets.core.drops import resolve_drop
from prep_assets.core.errors import DropError
from prep_assets.core.lake import DatasetPaths, read_json
from prep_assets.core.masking import trainable_types
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.tokenizer import FINGERPRINT_FILE
from prep_assets.defs.keys import (
    CLEAN_RECORDS,
    DATASET_MANIFEST,
    PACKED_SHARDS,
    RAW_RECORDS,
    TOKENIZED_EXAMPLES,
    asset_key,
)
from prep_assets.defs.metadata import md_table
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource

warnings.filterwarnings("ignore", message=".*partitions_def.*", category=Warning)

Probe = Callable[[DatasetSpec, DatasetPaths, str], inv.Outcome]


@dataclass(frozen=True)
class Gate:
    asset: str
    name: str
    description: str
    probe: Probe
    applies: Callable[[DatasetSpec], bool] = lambda spec: True


def _dir(layer: str) -> Callable[[DatasetPaths, str], Path]:
    return lambda p, k: p.partition_dir(layer, k)


bronze, silver, gold, shards = _dir("bronze"), _dir("silver"), _dir("gold"), _dir("shards")


def _source(p: DatasetPaths, k: str) -> Path | None:
    try:
        return resolve_drop(p, k)[1]
    except DropError:
        return None  # the file is gone or changed: account against the reader's own line count


def _pinned(p: DatasetPaths) -> dict:
    return read_json(p.tokenizer_dir / FINGERPRINT_FILE)["info"]


GATES: tuple[Gate, ...] = (
    Gate(RAW_RECORDS, "raw_records_accounted", "records + rejects + blank lines = lines in the drop file "
         "(recounted independently of the reader)", lambda s, p, k: inv.bronze_accounted(bronze(p, k), _source(p, k))),
    Gate(RAW_RECORDS, "raw_records_reject_rate", "rejects / lines <= checks.max_reject_rate",
         lambda s, p, k: inv.bronze_reject_rate(bronze(p, k), s.checks.max_reject_rate)),
    Gate(RAW_RECORDS, "raw_records_required_fields", "provenance present, record ids unique, content valid JSON",
         lambda s, p, k: inv.bronze_required_fields(bronze(p, k))),
    Gate(CLEAN_RECORDS, "clean_records_unique", "no two kept records share a content sha256",
         lambda s, p, k: inv.silver_unique(silver(p, k))),
    Gate(CLEAN_RECORDS, "clean_records_length_bounds", "clean.min_chars <= chars <= clean.max_chars",
         lambda s, p, k: inv.silver_lengths(silver(p, k), s.clean.min_chars, s.clean.max_chars)),
    Gate(CLEAN_RECORDS, "clean_records_accounted", "silver records + silver rejects = bronze records, one to one",
         lambda s, p, k: inv.silver_accounted(silver(p, k), bronze(p, k))),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_mask_aligned", "ids, mask and types of equal length; mask in {0,1} "
         "and 1 only on the token types `mask` trains (completion/EOS by default)",
         lambda s, p, k: inv.gold_mask_aligned(gold(p, k), trainable_types(s))),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_have_loss_tokens", "every example has at least one loss token",
         lambda s, p, k: inv.gold_loss_tokens(gold(p, k))),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_ids_in_vocab", "every token id < the tokenizer's vocab size",
         lambda s, p, k: inv.gold_ids_in_vocab(gold(p, k), _pinned(p)["vocab_size"])),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_within_max_len", "1 <= tokens <= sequence.max_seq_len",
         lambda s, p, k: inv.gold_within_max_len(gold(p, k), s.sequence.max_seq_len)),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_accounted", "gold examples + gold rejects = silver records",
         lambda s, p, k: inv.gold_accounted(gold(p, k), silver(p, k))),
    Gate(TOKENIZED_EXAMPLES, "tokenized_examples_pairs_complete", "preference: each pair has one chosen and one "
         "rejected example, in one split, with identical masked prompt tokens",
         lambda s, p, k: inv.gold_pairs_complete(gold(p, k)), applies=lambda s: s.input.type == "preference"),
    Gate(PACKED_SHARDS, "packed_shards_fixed_length", "every row exactly sequence.max_seq_len",
         lambda s, p, k: inv.shards_fixed_length(inv.shard_files(shards(p, k)), s.sequence.max_seq_len)),
    Gate(PACKED_SHARDS, "packed_shards_padding_masked", "padding: pad id, mask 0, segment 0",
         lambda s, p, k: inv.shards_padding_masked(inv.shard_files(shards(p, k)), _pinned(p)["pad_id"])),
    Gate(PACKED_SHARDS, "packed_shards_positions_restart", "positions restart at segment starts; first token masked",
         lambda s, p, k: inv.shards_positions_restart(inv.shard_files(shards(p, k)))),
    Gate(PACKED_SHARDS, "packed_shards_tokens_conserved", "shard tokens = gold tokens per split; each example once",
         lambda s, p, k: inv.shards_tokens_conserved(inv.shard_files(shards(p, k)), gold(p, k))),
    Gate(PACKED_SHARDS, "packed_shards_utilization", "sequence utilization >= checks.min_sequence_utilization",
         lambda s, p, k: inv.shards_utilization(inv.shard_files(shards(p, k)), s.sequence.max_seq_len,
                                                s.checks.min_sequence_utilization)),
    Gate(PACKED_SHARDS, "packed_shards_pairs_together", "preference: both examples of a pair in the same row",
         lambda s, p, k: inv.shards_pairs_together(inv.shard_files(shards(p, k)), gold(p, k)),
         applies=lambda s: s.input.type == "preference"),
)


def gates_for(spec: DatasetSpec) -> tuple[Gate, ...]:
    return tuple(g for g in GATES if g.applies(spec))


def outcome_result(outcome: inv.Outcome) -> AssetCheckResult:
    return AssetCheckResult(
        passed=outcome.passed,
        severity=AssetCheckSeverity.ERROR,
        description=outcome.description,
        metadata={
            "num_violations": outcome.violations,
            "offending": md_table(outcome.offending),
            "facts": MetadataValue.json(outcome.facts),
        },
    )


def _partition_gate(spec: DatasetSpec, gate: Gate) -> AssetChecksDefinition:
    @asset_check(
        asset=asset_key(spec, gate.asset),
        name=gate.name,
        blocking=True,
        partitions_def=drops_partitions(spec.name),
        description=gate.description,
    )
    def _check(context: AssetCheckExecutionContext, lake: LakeResource) -> AssetCheckResult:
        return outcome_result(gate.probe(spec, lake.paths(spec.name), context.partition_key))

    return _check


def _manifest_gate(spec: DatasetSpec) -> AssetChecksDefinition:
    @asset_check(
        asset=asset_key(spec, DATASET_MANIFEST),
        name="dataset_manifest_one_tokenizer",
        blocking=True,
        description="every partition's shards were made with the pinned tokenizer (one fingerprint)",
    )
    def _check(lake: LakeResource) -> AssetCheckResult:
        paths = lake.paths(spec.name)
        manifest = read_json(paths.manifest_path)
        parts = [{"partition": k, **v} for k, v in manifest["partitions"].items()]
        return outcome_result(inv.shards_one_tokenizer(parts, manifest["tokenizer_fingerprint"]))

    return _check


def unpassed_gates(instance: DagsterInstance, spec: DatasetSpec, partitions: list[str]) -> dict[str, list[str]]:
    """Per partition, the gates that did not pass on its latest materialization (failed, never run, or older)."""
    gates = gates_for(spec)
    keys = [AssetCheckKey(asset_key(spec, g.asset), g.name) for g in gates]
    infos = instance.event_log_storage.get_asset_check_partition_info(keys, partition_keys=partitions) if partitions else []
    latest = {(i.partition_key, i.check_key.name): i for i in infos}
    out: dict[str, list[str]] = {}
    for partition in partitions:
        problems = []
        for gate in gates:
            info = latest.get((partition, gate.name))
            if info is None:
                problems.append(f"{gate.name}: never run")
            elif info.latest_execution_status != AssetCheckExecutionRecordStatus.SUCCEEDED:
                problems.append(f"{gate.name}: {info.latest_execution_status.value.lower()}")
            elif not info.is_current:
                problems.append(f"{gate.name}: not run on the latest materialization")
        out[partition] = problems
    return out


def build_checks(spec: DatasetSpec) -> list[AssetChecksDefinition]:
    return [_partition_gate(spec, g) for g in gates_for(spec)] + [_manifest_gate(spec)]
