"""What the event log says about a dataset's assets: the latest materialization's storage id, and which shards
event the latest manifest was built after (the manifest records it as `shards_event_id`)."""

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

SHARDS_EVENT_ID = "shards_event_id"


def latest_event_id(instance: DagsterInstance, key: AssetKey, partition: str | None = None) -> int | None:
    """Storage id of the asset's latest materialization (of one partition, or any), None if it has none."""
    flt = AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition is not None else key
    records = instance.fetch_materializations(flt, limit=1).records
    return records[0].storage_id if records else None


def manifest_covers(instance: DagsterInstance, manifest: AssetKey) -> int:
    """The latest shards event id the latest manifest was built after (-1 when there is no manifest yet)."""
    records = instance.fetch_materializations(manifest, limit=1).records
    if not records or records[0].asset_materialization is None:
        return -1
    value = records[0].asset_materialization.metadata.get(SHARDS_EVENT_ID)
    return int(value.value) if value is not None else -1
