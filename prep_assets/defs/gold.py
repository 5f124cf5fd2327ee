"""Gold: the pinned tokenizer, and tokenized examples with loss masks per drop."""

from typing import Any

from dagster import AssetExecutionContext, AssetsDefinition, DataVersion, MaterializeResult, MetadataValue, asset

from prep_assets.core.gold import build_tokenizer
from prep_assets.core.lake import EXAMPLES
from prep_assets.core.records import GOLD_SCHEMA
from prep_assets.core.spec import DatasetSpec
from prep_assets.defs.automation import gold_condition, tokenizer_condition
from prep_assets.defs.keys import CLEAN_RECORDS, TOKENIZER, asset_key, dataset_asset
from prep_assets.defs.layers import LayerAsset
from prep_assets.defs.metadata import decoded_examples, md_table, user_errors, worker
from prep_assets.defs.resources import LakeResource


def tokenizer_asset(spec: DatasetSpec) -> AssetsDefinition:
    source = spec.tokenizer.train and "trained byte-level BPE" or spec.tokenizer.path or spec.tokenizer.hub_id

    description = (
        f"The pinned tokenizer ({source}), from `tokenizer`: copied from a local path or the local hub cache, "
        "or trained (byte-level BPE, deterministic) from `tokenizer.train.files`; saved in the lake with the "
        "sha256 of each file. Its fingerprint is its data version: a new tokenizer makes gold stale."
    )

    @asset(
        **dataset_asset(
            spec, TOKENIZER, layer="gold", kind="huggingface", version="tokenizer", description=description
        ),
        automation_condition=tokenizer_condition(),
    )
    def tokenizer(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        paths = lake.paths(spec.name)
        with user_errors():
            record = build_tokenizer(spec, paths, lake.root)
        info = record["info"]
        return MaterializeResult(
            metadata={
                "worker": worker(),
                "fingerprint": record["fingerprint"],
                "vocab_size": info["vocab_size"],
                "eos_id": info["eos_id"],
                "pad_id": info["pad_id"],
                "bos_id": info["bos_id"] if info["bos_id"] is not None else -1,
                "add_bos": info["add_bos"],
                "source": MetadataValue.json(record["source"]),
                "files": MetadataValue.json(record["files"]),
                "path": MetadataValue.path(str(paths.tokenizer_dir)),
            },
            data_version=DataVersion(record["fingerprint"]),
        )

    return tokenizer


GOLD = LayerAsset(
    layer="gold",
    schema=GOLD_SCHEMA,
    upstream=(CLEAN_RECORDS, TOKENIZER),
    automation=lambda spec: gold_condition(asset_key(spec, TOKENIZER)),
    description=lambda spec: (
        "One training example per silver record: token_ids, loss_mask (1 = loss target), token_type_ids "
        "(0 prompt, 1 completion, 2 padding, 3 EOS), counts and provenance. Masks follow `mask`/`mask_default`; "
        "one EOS per completion (trained), BOS per the tokenizer; the first token of each example is masked. "
        "Examples over `sequence.max_seq_len` follow `sequence.overflow`; untrainable ones go to rejects. "
        "Tabular data: examples assembled from rows per `tabular.mode` (flat, grouped, sequential): the schema "
        "prompt (masked), then BOS + compact JSON lines + EOS units (trained); records or groups that cannot fit "
        "go to rejects and fail the blocking budget check."
    ),
    preview=(EXAMPLES, ["example_id", "split", "num_tokens", "num_loss_tokens"]),
    extra=lambda spec, paths, partition, stats: {
        "decoded_examples": decoded_examples(paths.partition_dir("gold", partition) / EXAMPLES, paths.tokenizer_dir),
        **tabular_metadata(stats.tabular),
    },
)


DISTRIBUTIONS = (
    "tokens_per_record",
    "tokens_per_group",
    "tokens_per_example",
    "records_per_example",
    "groups_per_example",
    "examples_per_group",
)


def tabular_metadata(tab: dict[str, Any] | None) -> dict[str, Any]:
    """Tabular assembly in the UI: mode, schema prompt, budget, order_by's inferred type, the per
    record/group/example distributions and the largest units that did not fit."""
    if not tab:
        return {}
    rows = [{"figure": k, **tab[k]} for k in DISTRIBUTIONS if tab.get(k)]
    return {
        "tabular_mode": tab["mode"],
        "schema_prompt": MetadataValue.text(tab["schema_prompt"]),
        "num_schema_prompt_tokens": tab["schema_prompt_tokens"],
        "record_budget_tokens": tab["record_budget"],
        "max_sequences_per_example": tab["max_sequences_per_example"],
        "num_records_in_examples": tab["records_in_examples"],
        "num_groups": tab["groups"] if tab["groups"] is not None else 0,
        # how order_by was typed (none without it) and the records it could not place (gold rejects)
        "order_by_type": (tab["order_by_type"] or "none") + (" (D/M/YYYY)" if tab["order_by_day_first"] else ""),
        "num_unorderable_records": tab["unorderable_records"],
        "tabular_distributions": md_table(rows),
        "over_budget": md_table(tab["over_budget"]),
    }
