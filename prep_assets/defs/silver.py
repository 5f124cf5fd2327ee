"""Silver: cleaned, exact-deduplicated records with a deterministic split, per drop."""

from prep_assets.core.lake import RECORDS
from prep_assets.core.records import SILVER_SCHEMA
from prep_assets.core.silver import repeats_of_earlier_drops
from prep_assets.defs.automation import layer_condition
from prep_assets.defs.keys import RAW_RECORDS
from prep_assets.defs.layers import LayerAsset

SILVER = LayerAsset(
    layer="silver",
    schema=SILVER_SCHEMA,
    upstream=(RAW_RECORDS,),
    automation=lambda spec: layer_condition(),
    # dedup_scope drop: a report (it depends on the earlier drops built by now), in the UI only, never in a file
    extra=lambda spec, paths, partition, stats: (
        {} if (n := repeats_of_earlier_drops(spec, paths, partition)) is None else {"repeats_of_earlier_drops": n}
    ),
    description=lambda spec: (
        "Bronze records normalized (`clean.normalize`: NFC, line endings, control characters, trailing "
        "whitespace), filtered (`clean.min_chars`/`max_chars`, empty, and the `clean.quality` heuristics: "
        "words, repeated lines/n-grams, non-alphanumeric share) and deduplicated (`clean.dedup`): exact on "
        "the sha256 of the full canonical content, confirmed on the bytes, and with `near` also MinHash/LSH "
        "near-duplicates (`clean.near`); with `clean.dedup_scope: dataset` also against every drop "
        "registered earlier (indexes under dedup_index/). Each kept record has a train/validation/test "
        "`split` drawn from its hash (`split`). Every dropped record is in rejects.parquet with its reason, "
        "normalized content and `duplicate_of`."
    ),
    preview=(RECORDS, ["record_id", "split", "content"]),
)
