"""One sensor per dataset: complete new files in `raw/<dataset>/` become partitions, and their drop runs.

Thin over `core.drops.poll_drops` (what is complete, what is a new drop). The sensor adds every registered
drop the instance does not know yet (so a tick that failed after registering loses nothing) and requests the
whole drop job of each (`<dataset>_drops`: bronze -> silver -> gold -> shards and their gates in one run) with
the partition key as run key (Dagster never launches two runs with one run key of a sensor): one run instead of
one per layer and automation tick, so a small drop reaches the manifest in seconds. Automation still rebuilds
what goes stale. Until the tokenizer is pinned (automation builds it), new drops wait: their gold would fail.
With `clean.dedup_scope: dataset` it also requests silver again for drops whose earlier drops changed (a file
replaced), run key = partition + that set's hash.
"""

import hashlib

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from prep_assets.core.dedup import stale_silver
from prep_assets.core.drops import poll_drops, registered_drops, superseded_drops
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.events import latest_event_id, manifest_covers
from prep_assets.defs.keys import (
    CLEAN_RECORDS,
    DATASET_MANIFEST,
    PACKED_SHARDS,
    TOKENIZER,
    asset_key,
    drop_job_name,
    manifest_job_name,
)
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource

POLL_SECONDS = 5  # a drop is registered after two ticks with the same size and mtime: 5-10 s after its write
# the sensor daemon loops every 5 s and evaluates a sensor whose last tick is at least this old: below 5, every
# loop ticks (at exactly 5, a loop that came a little early skipped the sensor, and ticks were 10 s apart)
MIN_INTERVAL_SECONDS = 3
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def sensor_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_drops_sensor"


# both sensors: on out of the box (`dagster dev` runs them), evaluated on every loop of the sensor daemon
_RUNNING_EVERY_TICK = {"minimum_interval_seconds": MIN_INTERVAL_SECONDS, "default_status": DefaultSensorStatus.RUNNING}


def build_drop_sensor(spec: DatasetSpec) -> SensorDefinition:
    partitions = drops_partitions(spec.name)

    @sensor(
        name=sensor_name(spec),
        **_RUNNING_EVERY_TICK,
        job_name=drop_job_name(spec),
        description=(
            f"Polls raw/{spec.name}/ every {POLL_SECONDS}s. A file becomes a drop once its size and mtime "
            "are unchanged across two ticks (hidden, `_`, .tmp/.part names ignored; symlinks and names no "
            f"reader takes refused, and reported). Adds the partition and requests the {drop_job_name(spec)} "
            "run of all its layers and gates (run key = partition key), once the tokenizer is pinned."
        ),
    )
    def _sensor(context: SensorEvaluationContext, lake: LakeResource) -> SensorResult | SkipReason:
        paths = lake.paths(spec.name)
        poll = poll_drops(paths, context.cursor)
        known = set(context.instance.get_dynamic_partitions(partitions.name or ""))
        gone = superseded_drops(paths)
        missing = sorted(k for k in registered_drops(paths) if k not in known and k not in gone)
        if missing and latest_event_id(context.instance, asset_key(spec, TOKENIZER)) is None:
            # registered in the lake, added and requested on the first tick after the tokenizer is pinned
            context.log.info(f"{len(missing)} new drop(s) wait for the tokenizer (automation builds it)")
            missing = []
        for note in poll.notes:
            context.log.info(note)
        if poll.waiting:
            context.log.info(f"waiting for {len(poll.waiting)} file(s) to stop changing: {poll.waiting[:10]}")
        requests = [
            RunRequest(run_key=k, partition_key=k, tags={"prep_assets/drop": k})  # the whole drop job
            for k in missing
        ]
        for k, earlier in stale_silver(spec, paths).items():
            if k in known:
                context.log.info(
                    f"{k}: the drops before it changed ({', '.join(earlier) or 'none'}); rebuilding its silver"
                )
                # the silver being replaced (its stats' mtime) is in the key: a set seen before still gets a run
                built = (paths.partition_dir("silver", k) / "stats.json").stat().st_mtime_ns
                tag = hashlib.sha256(f"{built}:{','.join(earlier)}".encode()).hexdigest()[:12]
                requests.append(
                    RunRequest(
                        run_key=f"{k}:earlier-{tag}",
                        partition_key=k,
                        asset_selection=[asset_key(spec, CLEAN_RECORDS)],
                        tags={"prep_assets/drop": k},
                    )
                )
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


def manifest_sensor_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_manifest_sensor"


def build_manifest_sensor(spec: DatasetSpec) -> SensorDefinition:
    """Refreshes the manifest whenever a shards partition was materialized after the manifest's latest
    materialization, once no run that builds shards or the manifest is queued or running.

    The manifest records the id of the latest shards event it was built after (`shards_event_id`); the sensor
    compares it with the event log's, not tick-to-tick flags: declarative automation's "updated since
    last handled" lost a drop whose shards landed in the same tick as a manifest refresh (both flags in one
    tick: the reset wins), so the manifest stayed one drop short. Run key = the latest shards event's id."""
    shards, manifest = asset_key(spec, PACKED_SHARDS), asset_key(spec, DATASET_MANIFEST)
    jobs = {drop_job_name(spec), manifest_job_name(spec)}

    @sensor(
        name=manifest_sensor_name(spec),
        **_RUNNING_EVERY_TICK,
        job_name=manifest_job_name(spec),
        description=(
            f"Every {POLL_SECONDS}s: refreshes {spec.name}/dataset_manifest once a packed_shards partition "
            "was materialized after it and no shards or manifest run is queued or running (the refresh "
            "then sees every gate of that partition)."
        ),
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        instance = context.instance
        shards_id = latest_event_id(instance, shards)
        if shards_id is None:
            return SkipReason("no packed_shards partition materialized yet")
        if manifest_covers(instance, manifest) >= shards_id:
            return SkipReason("the manifest was built after the latest packed_shards materialization")
        busy = [
            r.dagster_run.run_id
            for r in instance.get_run_records(RunsFilter(statuses=UNFINISHED))
            if r.dagster_run.job_name in jobs or {shards, manifest} & set(r.dagster_run.asset_selection or ())
        ]
        if busy:
            return SkipReason(f"waiting for {len(busy)} run(s) building shards or the manifest: {busy[:3]}")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"manifest-after-{shards_id}")]  # the manifest job
        )

    return _sensor
