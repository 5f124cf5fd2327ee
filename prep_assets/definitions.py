"""The one place the Dagster `Definitions` are built: a graph of assets and checks per dataset spec."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetChecksDefinition, AssetsDefinition, AssetSelection, Definitions, define_asset_job

from prep_assets.core.spec import DatasetSpec, load_specs
from prep_assets.defs.bronze import build_bronze
from prep_assets.defs.checks import build_checks
from prep_assets.defs.gold import build_gold, build_tokenizer_asset
from prep_assets.defs.keys import (
    DATASET_MANIFEST,
    PARTITIONED,
    TOKENIZER,
    asset_key,
    drop_job_name,
    manifest_job_name,
    tokenizer_job_name,
)
from prep_assets.defs.resources import LakeResource, default_batch_size, default_data_dir
from prep_assets.defs.automation import automation_sensor
from prep_assets.defs.executors import executor_from_env
from prep_assets.defs.sensors import build_drop_sensor, build_manifest_sensor
from prep_assets.defs.shards import build_manifest_asset, build_shards
from prep_assets.defs.silver import build_silver


def dataset_jobs(spec: DatasetSpec) -> list:
    return [
        define_asset_job(tokenizer_job_name(spec), selection=AssetSelection.assets(asset_key(spec, TOKENIZER))),
        define_asset_job(
            drop_job_name(spec),
            selection=AssetSelection.assets(*(asset_key(spec, n) for n in PARTITIONED)),
            description=f"All layers of one {spec.name} drop: bronze -> silver -> gold -> packed shards, with gates.",
        ),
        define_asset_job(manifest_job_name(spec), selection=AssetSelection.assets(asset_key(spec, DATASET_MANIFEST))),
    ]


def dataset_assets(spec: DatasetSpec) -> list[AssetsDefinition]:
    """A dataset's assets and asset checks, unbound (as `materialize` takes them)."""
    return [
        build_bronze(spec),
        build_silver(spec),
        build_tokenizer_asset(spec),
        build_gold(spec),
        build_shards(spec),
        build_manifest_asset(spec),
        *build_checks(spec),
    ]


def build_definitions(data_dir: Path | None = None) -> Definitions:
    data_dir = (data_dir or default_data_dir()).resolve()
    assets: list[AssetsDefinition] = []
    jobs = []
    sensors = []
    for spec in load_specs(data_dir / "datasets"):
        assets += dataset_assets(spec)
        jobs += dataset_jobs(spec)
        sensors += [build_drop_sensor(spec), build_manifest_sensor(spec)]
    return Definitions(
        assets=[a for a in assets if not isinstance(a, AssetChecksDefinition)],
        asset_checks=[a for a in assets if isinstance(a, AssetChecksDefinition)],
        jobs=jobs,
        sensors=[*sensors, automation_sensor()] if sensors else [],
        resources={"lake": LakeResource(data_dir=str(data_dir), batch_size=default_batch_size())},
        executor=executor_from_env(),
    )


defs = build_definitions()
