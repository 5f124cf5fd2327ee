"""Bronze: raw records with provenance, and a rejects table, per drop."""

from dagster import AssetExecutionContext, AssetsDefinition, DataVersion, MaterializeResult, MetadataValue, asset

from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import resolve_drop
from prep_assets.core.lake import RECORDS
from prep_assets.core.records import BRONZE_SCHEMA
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.keys import RAW_RECORDS, asset_key, code_version
from prep_assets.defs.metadata import column_schema, counts_table, preview, user_errors, worker
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource


def bronze_asset(spec: DatasetSpec) -> AssetsDefinition:
    @asset(
        key=asset_key(spec, RAW_RECORDS),
        partitions_def=drops_partitions(spec.name),
        group_name="bronze",
        kinds={"parquet"},
        code_version=code_version(spec, "bronze"),
        description=(
            f"Every parseable record of a drop in raw/{spec.name}/, as written, with provenance (source_file, "
            "source_line, byte_offset, drop, record_sha256) and its training content extracted per `input` "
            "(type, keys). Lines that do not parse or lack required fields go to rejects.parquet with file, "
            "line, byte offset and reason. Data version: the drop's sha256."
        ),
        metadata={"dagster/column_schema": column_schema(BRONZE_SCHEMA)},
        tags={"layer": "bronze"},
    )
    def raw_records(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        paths = lake.paths(spec.name)
        out = paths.partition_dir("bronze", context.partition_key)
        with user_errors():
            drop, source = resolve_drop(paths, context.partition_key)
            stats = build_raw_records(spec, drop, source, out, batch_size=lake.batch_size)
        return MaterializeResult(
            metadata={
                "worker": worker(),
                "dagster/row_count": stats["records"],
                "num_rejects": stats["rejects"],
                "lines_in": stats["lines_in"],
                "blank_lines": stats["blank_lines"],
                "rejects_by_reason": counts_table(stats["rejects_by_reason"]),
                "source_file": stats["file"],
                "source_sha256": stats["sha256"],
                "format": stats["format"],
                "path": MetadataValue.path(str(out)),
                "preview": preview(out / RECORDS, ["record_id", "source_line", "content"]),
            },
            data_version=DataVersion(drop.sha256),
        )

    return raw_records
