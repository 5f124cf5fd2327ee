"""The one place the Dagster `Definitions` are built: a graph of assets and checks per dataset spec.

Importing it builds nothing; the code location Dagster loads is `prep_assets.code_location`."""

from __future__ import annotations

import re
from pathlib import Path

from dagster import (
    AssetChecksDefinition,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    Definitions,
    Failure,
    MetadataValue,
    asset,
    define_asset_job,
)

from prep_assets.core.mix import scan_mixes
from prep_assets.core.spec import DatasetSpec, scan_specs
from prep_assets.defs.automation import automation_sensor
from prep_assets.defs.bronze import BRONZE
from prep_assets.defs.checks import gate_checks
from prep_assets.defs.executors import executor_from_env
from prep_assets.defs.gold import GOLD, tokenizer_asset
from prep_assets.defs.keys import (
    DATASET_MANIFEST,
    PARTITIONED,
    TOKENIZER,
    asset_key,
    drop_job_name,
    manifest_job_name,
    mix_asset_key,
    mix_job_name,
    tokenizer_job_name,
)
from prep_assets.defs.layers import layer_asset
from prep_assets.defs.logs import JOB_CONFIG, console_logger
from prep_assets.defs.mix import mix_asset, mix_checks
from prep_assets.defs.resources import LakeResource, default_batch_size, default_data_dir
from prep_assets.defs.retire import retire_job
from prep_assets.defs.sensors import build_drop_sensor, build_manifest_sensor
from prep_assets.defs.shards import SHARDS, manifest_asset
from prep_assets.defs.silver import SILVER


def dataset_jobs(spec: DatasetSpec) -> list:
    executor = executor_from_env()
    return [
        define_asset_job(
            tokenizer_job_name(spec),
            selection=AssetSelection.assets(asset_key(spec, TOKENIZER)),
            executor_def=executor,
            config=JOB_CONFIG,
        ),
        define_asset_job(
            drop_job_name(spec),
            selection=AssetSelection.assets(*(asset_key(spec, n) for n in PARTITIONED)),
            description=f"All layers of one {spec.name} drop: bronze -> silver -> gold -> packed shards, with gates.",
            executor_def=executor,
            config=JOB_CONFIG,
        ),
        define_asset_job(
            manifest_job_name(spec),
            selection=AssetSelection.assets(asset_key(spec, DATASET_MANIFEST)),
            executor_def=executor,
            config=JOB_CONFIG,
        ),
        retire_job(spec),
    ]


def dataset_assets(spec: DatasetSpec) -> list[AssetsDefinition]:
    """A dataset's assets and asset checks, unbound (as `materialize` takes them)."""
    return [
        layer_asset(spec, BRONZE),
        layer_asset(spec, SILVER),
        tokenizer_asset(spec),
        layer_asset(spec, GOLD),
        layer_asset(spec, SHARDS),
        manifest_asset(spec),
        *gate_checks(spec),
    ]


SPEC_ERROR = "spec_error"


def spec_error_asset(name: str, error: str, kind: str = "dataset") -> AssetsDefinition:
    """Stands in the graph for a dataset whose spec does not load: its description and every materialization
    show the error, while every other dataset loads and runs as usual."""

    safe = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"  # a file name may hold what Dagster's names may not

    @asset(
        key=AssetKey([safe, SPEC_ERROR]),
        group_name=safe,
        kinds={"yaml"},
        description=f"The spec of {kind} {name!r} does not load, so none of its assets exist:\n\n{error}",
        metadata={"error": MetadataValue.md(f"```\n{error}\n```")},
    )
    def _broken() -> None:
        raise Failure(description=f"{kind} {name!r}: its spec does not load:\n{error}")

    return _broken


def build_definitions(data_dir: Path | None = None, dataset: str | None = None) -> Definitions:
    """Every dataset of the data dir (or only `dataset`); a broken spec becomes its own error asset."""
    data_dir = (data_dir or default_data_dir()).resolve()
    scan = scan_specs(data_dir / "datasets")
    if dataset is not None:
        scan = scan.only(dataset)
    assets: list[AssetsDefinition] = [spec_error_asset(name, err) for name, err in scan.broken.items()]
    jobs = []
    sensors = []
    for spec in scan.specs:
        assets += dataset_assets(spec)
        jobs += dataset_jobs(spec)
        sensors += [build_drop_sensor(spec), build_manifest_sensor(spec)]
    if dataset is None:  # training mixes (data/mixes/*.yaml) over the datasets; a broken one is an error asset
        mixes = scan_mixes(data_dir / "mixes", {s.name for s in scan.specs} | set(scan.broken))
        assets += [spec_error_asset(f"mix_{name}", err, "mix") for name, err in mixes.broken.items()]
        for mix in mixes.mixes:
            assets += [mix_asset(mix), mix_checks(mix)]
            jobs.append(
                define_asset_job(
                    mix_job_name(mix.name), selection=AssetSelection.assets(mix_asset_key(mix.name)), config=JOB_CONFIG
                )
            )
    return Definitions(
        assets=[a for a in assets if not isinstance(a, AssetChecksDefinition)],
        asset_checks=[a for a in assets if isinstance(a, AssetChecksDefinition)],
        jobs=jobs,
        sensors=[*sensors, automation_sensor()] if sensors else [],
        resources={"lake": LakeResource(data_dir=str(data_dir), batch_size=default_batch_size())},
        executor=executor_from_env(),
        loggers={"console": console_logger},
    )
