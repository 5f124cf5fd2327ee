"""Packed shards per drop, and the dataset manifest over all drops."""

from typing import Any

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    DagsterInstance,
    MaterializeResult,
    MetadataValue,
    asset,
)

from prep_assets.core.drops import superseded_drops
from prep_assets.core.lake import DatasetPaths
from prep_assets.core.manifest import build_manifest, manifest_partitions
from prep_assets.core.records import shard_schema
from prep_assets.core.shards import COUNTS, SPLIT_TABLES, UTILIZATIONS, ShardStats, metrics_markdown
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.automation import layer_condition
from prep_assets.defs.checks import gates_pending, unpassed_gates
from prep_assets.defs.events import SHARDS_EVENT_ID, latest_event_id
from prep_assets.defs.keys import (
    DATASET_MANIFEST,
    PACKED_SHARDS,
    TOKENIZED_EXAMPLES,
    TOKENIZER,
    asset_key,
    dataset_asset,
)
from prep_assets.defs.layers import LayerAsset
from prep_assets.defs.metadata import decoded_row, md_table, user_errors, worker
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource


def split_tables(splits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The per-split metrics as narrow tables (`core.shards.SPLIT_TABLES`), and what each metric means."""
    tables = {
        name: md_table([{"split": s, **{c: m[c] for c in columns}} for s, m in splits.items()])
        for name, columns in SPLIT_TABLES.items()
    }
    return {**tables, "metrics": MetadataValue.md(metrics_markdown())}


def _shards_metadata(spec: DatasetSpec, paths: DatasetPaths, partition: str, stats: ShardStats) -> dict[str, Any]:
    """Totals, per-split figures and distributions, the file lists and row 0 decoded."""
    totals = stats.totals
    splits = stats.splits
    distributions = [
        {"split": s, "figure": name, **d}
        for s, m in splits.items()
        if m["sequences"]
        for name, d in m["distributions"].items()
    ]
    first = next((m["files"][0]["path"] for m in splits.values() if m["files"]), None)
    out = paths.partition_dir("shards", partition)
    return {
        "dagster/row_count": totals["sequences"],
        **{f"num_{k}": totals[k] for k in COUNTS if k != "sequences"},
        **{k: totals[k] for k in (*UTILIZATIONS, "max_batch_size")},
        "strategy": f"{spec.packing.strategy} / overflow {spec.sequence.overflow}",
        **split_tables(splits),
        "length_distributions_tokens": md_table(distributions),
        **({"decoded_row": decoded_row(out / first, paths.tokenizer_dir)} if first else {}),
        "files": MetadataValue.json([f["path"] for m in splits.values() for f in m["files"]]),
        "exports": MetadataValue.json(
            [f["path"] for m in splits.values() for e in m["exports"].values() for f in e["files"]]
            + [f["path"] for e in (stats.exports or {}).values() for f in e["files"]]  # partition-level
        ),
    }


SHARDS = LayerAsset(
    layer="shards",
    schema=shard_schema(True),  # the domain column shown only for a dataset with input.domain_key
    upstream=(TOKENIZED_EXAMPLES, TOKENIZER),
    automation=lambda spec: layer_condition(),
    description=lambda spec: (
        f"Rows of exactly `sequence.max_seq_len` ({spec.sequence.max_seq_len}) tokens per split, packed with "
        f"`packing.strategy` ({spec.packing.strategy}), overflow `{spec.sequence.overflow}`, padded with the pad "
        "id (mask 0, segment 0). Columns: input_ids, loss_mask, position_ids (restart per segment), segment_ids "
        "(1..k, 0 = padding), token_type_ids, seq_lengths, example_ids, example_offsets, num_loss_tokens. Files "
        "of at most `output.max_tokens_per_shard` tokens under `shards/<drop>/<split>/`, plus the exports in "
        f"`output.formats` ({', '.join(spec.output.formats)})."
    ),
    extra=_shards_metadata,
)


def manifest_asset(spec: DatasetSpec) -> AssetsDefinition:
    description = (
        f"lake/{spec.name}/manifest.json: the shards of every drop whose gates all passed on its latest "
        "materialization (drops replaced by a changed file of the same name are left out), by split, with "
        "paths relative to the manifest, sha256, sequences, tokens, loss tokens, max_batch_size, the tokenizer "
        "fingerprint, max_seq_len and the config hash. What a trainer points at."
    )

    @asset(
        **dataset_asset(
            spec, DATASET_MANIFEST, layer="shards", kind="json", version="shards", description=description
        ),
        deps=[
            AssetDep(asset_key(spec, PACKED_SHARDS), partition_mapping=AllPartitionMapping()),
            asset_key(spec, TOKENIZER),
        ],
    )
    def dataset_manifest(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        return MaterializeResult(metadata=refresh_manifest(context.instance, spec, lake.paths(spec.name)))

    return dataset_manifest


def refresh_manifest(instance: DagsterInstance, spec: DatasetSpec, paths: DatasetPaths) -> dict[str, Any]:
    """Publish the manifest over the instance's partitions whose gates passed; returns its UI metadata (the
    manifest asset's, and the retire job's materialization of it)."""
    # taken first: shards landing while this runs make the manifest sensor ask for another refresh
    shards_event_id = latest_event_id(instance, asset_key(spec, PACKED_SHARDS))
    registered = sorted(instance.get_dynamic_partitions(drops_partitions(spec.name).name))
    unpassed = unpassed_gates(instance, spec, registered)
    superseded = superseded_drops(paths)
    included, excluded = manifest_partitions(registered, superseded, unpassed)
    for partition in (p for p in excluded if p not in superseded):
        pending = latest_event_id(instance, asset_key(spec, PACKED_SHARDS), partition)
        if gates_pending(unpassed.get(partition, [])) and pending is not None and shards_event_id is not None:
            # its gates may still be running (runs go side by side in production): count the manifest
            # as built before those shards, so the manifest sensor asks again once they are done
            shards_event_id = min(shards_event_id, pending - 1)
    with user_errors():
        manifest = build_manifest(spec, paths, included)
    splits = manifest["splits"]
    files = [{"split": s, "files": len(m["files"]), "exports": len(m["exports"])} for s, m in splits.items()]
    return {
        "worker": worker(),
        "num_partitions": len(manifest["partitions"]),
        SHARDS_EVENT_ID: shards_event_id if shards_event_id is not None else -1,
        "num_sequences": sum(m["sequences"] for m in manifest["splits"].values()),
        "num_tokens": sum(m["output_tokens"] for m in manifest["splits"].values()),
        "splits_files": md_table(files),
        **split_tables(manifest["splits"]),
        "num_partitions_excluded": len(excluded),
        "excluded_partitions": md_table([{"partition": k, "why": v} for k, v in sorted(excluded.items())]),
        "config_hash": manifest["config_hash"],
        "tokenizer_fingerprint": manifest["tokenizer_fingerprint"],
        "path": MetadataValue.path(str(paths.manifest_path)),
    }
