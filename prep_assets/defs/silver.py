"""Silver: cleaned, exact-deduplicated records with a deterministic split, per drop."""

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, MetadataValue, asset

from prep_assets.core.lake import RECORDS
from prep_assets.core.records import SILVER_SCHEMA
from prep_assets.core.silver import build_silver
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.automation import layer_condition
from prep_assets.defs.keys import CLEAN_RECORDS, RAW_RECORDS, asset_key, code_version
from prep_assets.defs.metadata import column_schema, counts_table, preview, user_errors, worker
from prep_assets.defs.partitions import drops_partitions
from prep_assets.defs.resources import LakeResource


def silver_asset(spec: DatasetSpec) -> AssetsDefinition:
    @asset(
        key=asset_key(spec, CLEAN_RECORDS),
        automation_condition=layer_condition(),
        deps=[asset_key(spec, RAW_RECORDS)],
        partitions_def=drops_partitions(spec.name),
        group_name="silver",
        kinds={"parquet"},
        code_version=code_version(spec, "silver"),
        description=(
            "Bronze records normalized (`clean.normalize`: NFC, line endings, control characters, trailing "
            "whitespace), filtered (`clean.min_chars`/`max_chars`, empty, and the `clean.quality` heuristics: "
            "words, repeated lines/n-grams, non-alphanumeric share) and deduplicated (`clean.dedup`): exact on "
            "the sha256 of the full canonical content, confirmed on the bytes, and with `near` also MinHash/LSH "
            "near-duplicates (`clean.near`); with `clean.dedup_scope: dataset` also against every drop "
            "registered earlier (indexes under dedup_index/). Each kept record has a train/validation/test "
            "`split` drawn from its hash (`split`). Every dropped record is in rejects.parquet with its reason, "
            "normalized content and `duplicate_of`."
        ),
        metadata={"dagster/column_schema": column_schema(SILVER_SCHEMA)},
        tags={"layer": "silver"},
    )
    def clean_records(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        paths = lake.paths(spec.name)
        key = context.partition_key
        out = paths.partition_dir("silver", key)
        with user_errors():
            stats = build_silver(spec, paths, key, batch_size=lake.batch_size)
        return MaterializeResult(
            metadata={
                "worker": worker(),
                "dagster/row_count": stats["records"],
                "num_records_in": stats["records_in"],
                "num_rejects": stats["rejects"],
                "rejects_by_reason": counts_table(stats["rejects_by_reason"]),
                "records_by_split": counts_table(stats["records_by_split"], key="split"),
                "num_chars": stats["chars"],
                "dedup": stats["dedup"],
                "dedup_scope": stats["dedup_scope"],
                "hash_collisions": stats["hash_collisions"],
                "duplicates_of_earlier_drops": stats["duplicates_of_earlier_drops"],
                "path": MetadataValue.path(str(out)),
                "preview": preview(out / RECORDS, ["record_id", "split", "content"]),
            }
        )

    return clean_records
