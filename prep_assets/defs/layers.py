"""The one asset factory of the four partitioned layers: each layer declares what differs (`LayerAsset`), and
every one builds its partition with its core `build(spec, paths, partition)`, shows its stats' figures and a
preview, and lets a user error fail the step with its message."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
)

from prep_assets.core.build import BUILDS
from prep_assets.core.lake import DatasetPaths
from prep_assets.core.progress import reporting
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import Layer
from prep_assets.defs.keys import LAYER_ASSET, asset_key, dataset_asset
from prep_assets.defs.metadata import column_schema, preview, stats_metadata, user_errors, worker
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource

Extra = Callable[[DatasetSpec, DatasetPaths, str, Any], dict[str, Any]]


def _no_extra(spec: DatasetSpec, paths: DatasetPaths, partition: str, stats: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class LayerAsset:
    """What one partitioned layer's asset declares beyond the shared shape."""

    layer: Layer  # built by its core module's `build` (`core.build.BUILDS`)
    schema: pa.Schema  # the rows it publishes (the UI's column schema)
    description: Callable[[DatasetSpec], str]
    upstream: tuple[str, ...] = ()  # asset names it depends on
    automation: Callable[[DatasetSpec], AutomationCondition] | None = None
    preview: tuple[str, list[str]] | None = None  # (file in the partition dir, columns) shown as a table
    extra: Extra = _no_extra  # metadata beyond the stats' figures
    data_version: Callable[[Any], str] | None = None  # from the stats; none: Dagster derives it
    relabel: Callable[[Any], dict[str, str]] = lambda stats: {}  # metadata label -> the one shown, from the stats


def layer_asset(spec: DatasetSpec, declared: LayerAsset) -> AssetsDefinition:
    @asset(
        **dataset_asset(
            spec,
            LAYER_ASSET[declared.layer],
            layer=declared.layer,
            kind="parquet",
            version=declared.layer,
            description=declared.description(spec),
        ),
        automation_condition=declared.automation(spec) if declared.automation else None,
        deps=[asset_key(spec, up) for up in declared.upstream],
        partitions_def=drops_partitions(spec.name),
        metadata={
            "dagster/column_schema": column_schema(
                declared.schema, declared.layer, spec.input.type, spec.input.domain_key is not None
            )
        },
    )
    def _layer(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        paths = lake.paths(spec.name)
        partition = context.partition_key
        out = paths.partition_dir(declared.layer, partition)
        with user_errors(), reporting(context.log.info):  # progress lines in the run's log
            stats = BUILDS[declared.layer](spec, paths, partition, batch_size=lake.batch_size)
        shown = {"worker": worker(), **stats_metadata(stats), **declared.extra(spec, paths, partition, stats)}
        labels = declared.relabel(stats)
        shown = {labels.get(k, k): v for k, v in shown.items()}
        if declared.preview is not None:
            file, columns = declared.preview
            shown["preview"] = preview(out / file, columns)
        shown["path"] = MetadataValue.path(str(out))
        version = declared.data_version(stats) if declared.data_version else None
        return MaterializeResult(metadata=shown, data_version=DataVersion(version) if version else None)

    return _layer
