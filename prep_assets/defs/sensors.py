"""One sensor per dataset: complete new files in `raw/<dataset>/` become partitions, and their bronze runs.

Thin over `core.drops.poll_drops` (what is complete, what is a new drop). The sensor adds every registered
drop the instance does not know yet (so a tick that failed after registering loses nothing) and requests the
bronze run of each with the partition key as run key (Dagster never launches two runs with one run key of a
sensor); the layers below follow by declarative automation. With `clean.dedup_scope: dataset` it also requests
silver again for drops whose earlier drops changed (a file replaced), run key = partition + that set's hash.
"""

import hashlib


from dagster import (
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from prep_assets.core.dedup import stale_silver
from prep_assets.core.drops import poll_drops, registered_drops, superseded_drops
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.keys import CLEAN_RECORDS, RAW_RECORDS, asset_key
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource

POLL_SECONDS = 15


def sensor_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_drops_sensor"


def build_drop_sensor(spec: DatasetSpec) -> SensorDefinition:
    partitions = drops_partitions(spec.name)

    @sensor(
        name=sensor_name(spec),
        minimum_interval_seconds=POLL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=AssetSelection.assets(asset_key(spec, RAW_RECORDS), asset_key(spec, CLEAN_RECORDS)),
        description=(f"Polls raw/{spec.name}/ every {POLL_SECONDS}s. A file becomes a drop once its size and mtime "
                     "are unchanged across two ticks (hidden, `_`, .tmp/.part names ignored; symlinks and names no "
                     "reader takes refused, and reported). Adds the partition and requests its bronze run (run key = "
                     "partition key); automation carries it on."),
    )
    def _sensor(context: SensorEvaluationContext, lake: LakeResource) -> SensorResult | SkipReason:
        paths = lake.paths(spec.name)
        poll = poll_drops(paths, context.cursor)
        known = set(context.instance.get_dynamic_partitions(partitions.name or ""))
        gone = superseded_drops(paths)
        missing = sorted(k for k in registered_drops(paths) if k not in known and k not in gone)
        for note in poll.notes:
            context.log.info(note)
        if poll.waiting:
            context.log.info(f"waiting for {len(poll.waiting)} file(s) to stop changing: {poll.waiting[:10]}")
        requests = [RunRequest(run_key=k, partition_key=k, asset_selection=[asset_key(spec, RAW_RECORDS)],
                               tags={"prep_assets/drop": k}) for k in missing]
        for k, earlier in stale_silver(spec, paths).items():
            if k in known:
                context.log.info(f"{k}: the drops before it changed ({', '.join(earlier) or 'none'}); rebuilding its silver")
                # the silver being replaced (its stats' mtime) is in the key: a set seen before still gets a run
                built = (paths.partition_dir("silver", k) / "stats.json").stat().st_mtime_ns
                tag = hashlib.sha256(f"{built}:{','.join(earlier)}".encode()).hexdigest()[:12]
                requests.append(RunRequest(run_key=f"{k}:earlier-{tag}", partition_key=k,
                                           asset_selection=[asset_key(spec, CLEAN_RECORDS)], tags={"prep_assets/drop": k}))
        if not requests:
            return SensorResult(skip_reason=SkipReason(_skip(poll.waiting, poll.notes)), cursor=poll.cursor)
        return SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[partitions.build_add_request(missing)] if missing else [],
            cursor=poll.cursor,
        )

    return _sensor


def _skip(waiting: list[str], notes: list[str]) -> str:
    parts = [f"{len(waiting)} file(s) still changing" if waiting else "no new drop"]
    parts += notes[:5]
    return "; ".join(parts)
