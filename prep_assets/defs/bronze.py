"""Bronze: raw records with provenance, and a rejects table, per drop."""

from prep_assets.core.lake import RECORDS
from prep_assets.core.records import BRONZE_SCHEMA
from prep_assets.defs.layers import LayerAsset

BRONZE = LayerAsset(
    layer="bronze",
    schema=BRONZE_SCHEMA,
    description=lambda spec: (
        f"Every parseable record of a drop in raw/{spec.name}/, as written, with provenance (source_file, "
        "source_line, byte_offset, drop, record_sha256) and its training content extracted per `input` "
        "(type, keys). Lines that do not parse or lack required fields go to rejects.parquet with file, "
        "line, byte offset and reason. Data version: the drop's sha256."
    ),
    preview=(RECORDS, ["record_id", "source_line", "content"]),
    data_version=lambda stats: stats.sha256,
    # what was read: lines (JSONL, TXT), the elements of a JSON array or table rows (CSV, Parquet)
    relabel=lambda stats: {} if stats.unit == "line" else {"lines_in": f"{stats.unit}s_in"},
)
