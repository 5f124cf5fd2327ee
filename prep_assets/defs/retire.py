"""The `<dataset>_retire` job: retire a bad drop from the UI (Launchpad: the partition key or file name as config).

`prep-assets retire` runs the same job in process. Its one op moves the drop aside (`core.retire.retire_drop`),
deletes its dynamic partition and publishes the manifest without it (a materialization of the manifest asset).
"""

from collections.abc import Iterator
from typing import Any

from dagster import AssetMaterialization, Config, Failure, JobDefinition, OpExecutionContext, job, op

from prep_assets.core.retire import retire_drop
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.executors import executor_from_env
from prep_assets.defs.keys import DATASET_MANIFEST, asset_key
from prep_assets.defs.metadata import user_errors
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource
from prep_assets.defs.shards import refresh_manifest


class RetireConfig(Config):
    """Which drop to retire, and why (kept in its retired.json)."""

    drop: str  # a partition key, or the drop's file name in raw/<dataset>/
    reason: str = ""
    retired_by: str = ""  # the OS user when empty (the CLI passes its own)


def retire_note(record: dict[str, Any]) -> str:
    return f"its outputs and raw file moved under retired/{record['partition']}/"


def retire_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_retire"


def retire_op_name(spec: DatasetSpec) -> str:
    return f"{spec.name}__retire_drop"


def retire_job(spec: DatasetSpec) -> JobDefinition:
    manifest = asset_key(spec, DATASET_MANIFEST)

    @op(name=retire_op_name(spec), out={}, description=f"Retire one drop of {spec.name} and refresh its manifest.")
    def _retire(
        context: OpExecutionContext, config: RetireConfig, lake: LakeResource
    ) -> Iterator[AssetMaterialization]:
        paths = lake.paths(spec.name)
        via = f"run {context.run_id}"
        with user_errors():
            record = retire_drop(paths, config.drop, reason=config.reason, user=config.retired_by or None, via=via)
        partition = record["partition"]
        name = drops_partitions(spec.name).name or ""
        if context.instance.has_dynamic_partition(name, partition):
            context.instance.delete_dynamic_partition(name, partition)
        context.log.info(f"retired {partition} ({record['file']}): moved {', '.join(record['moved']) or 'nothing'}")
        try:
            refreshed = refresh_manifest(context.instance, spec, paths)
        except Failure as exc:  # the drop is retired all the same: say so, and what publishes the manifest
            gone = "is withdrawn (it named the drop's files)" if record["manifest_withdrawn"] else "stays as it was"
            raise Failure(
                description=(
                    f"{partition} is retired ({retire_note(record)}); the manifest {gone} and was not published "
                    f"again: {exc.description} Run `prep-assets run --dataset {spec.name}`: it rebuilds the "
                    "later drops (records they held back as repeats of the retired drop's come back) and publishes "
                    "the manifest"
                )
            ) from exc
        yield AssetMaterialization(
            asset_key=manifest,
            description=f"refreshed after retiring {partition}",
            metadata={**refreshed, "retired": partition},
        )

    @job(
        name=retire_job_name(spec),
        description=(
            f"Retire a bad drop of {spec.name}: set `drop` (partition key or file name) and an optional `reason` in "
            f"the Launchpad. Its outputs and raw file move under lake/{spec.name}/retired/<partition>/ with "
            "retired.json (who, when, why, sha256); the partition and its manifest entry are removed; the same "
            "bytes are never registered again."
        ),
        tags={"prep_assets/retire": "true"},
        executor_def=executor_from_env(),
    )
    def _job() -> None:
        _retire()

    return _job
