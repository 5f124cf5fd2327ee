"""The partitioned layers in order, each built by its module's `build(spec, paths, partition, *, batch_size)`:
what a drop run does without Dagster (tests, benchmarks, tools); the Dagster assets call the same functions."""

from __future__ import annotations

from collections.abc import Callable

from prep_assets.core import bronze, gold, shards, silver
from prep_assets.core.lake import DatasetPaths
from prep_assets.core.parquet_io import DEFAULT_BATCH
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import Layer
from prep_assets.core.stats import LayerStats

BUILDS: dict[Layer, Callable[..., LayerStats]] = {
    "bronze": bronze.build,
    "silver": silver.build,
    "gold": gold.build,
    "shards": shards.build,
}


def build_partition(
    spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH
) -> dict[Layer, LayerStats]:
    """Every layer of one registered drop, bronze to shards (the tokenizer pinned before); each layer's stats."""
    return {layer: build(spec, paths, partition, batch_size=batch_size) for layer, build in BUILDS.items()}
