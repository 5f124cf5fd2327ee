"""Invariants between layers, as DuckDB queries over the published Parquet files: one module per layer.

Each returns an `Outcome`: the number of violations, up to `SAMPLE` offending rows and the figures it measured.
Paths and values are always bound as parameters, never interpolated into SQL. `core.gates` declares which
invariant judges which asset, under which name and description; the Dagster asset checks and the tests run them.
"""

from prep_assets.core.invariants.bronze import (
    bronze_accounted,
    bronze_reject_rate,
    bronze_required_fields,
    count_csv_rows,
    count_elements,
    count_lines,
    count_parquet_rows,
)
from prep_assets.core.invariants.common import SAMPLE, Outcome, file_problems, require_input
from prep_assets.core.invariants.gold import (
    REJECT_EXAMPLES,
    TABULAR_REMEDIES,
    RowRule,
    gold_accounted,
    gold_ids_in_vocab,
    gold_loss_tokens,
    gold_mask_aligned,
    gold_pairs_complete,
    gold_reject_rate,
    gold_rows,
    gold_tabular_budget,
    gold_within_max_len,
    ids_in_vocab_rule,
    loss_tokens_rule,
    mask_aligned_rule,
    within_max_len_rule,
)
from prep_assets.core.invariants.manifest import (
    duplicates_resolve_to_kept,
    groups_in_one_split,
    shards_one_tokenizer,
    tabular_one_schema,
)
from prep_assets.core.invariants.shards import (
    ROW_PART_COLUMNS,
    ROW_PARTS,
    shard_files,
    shard_rows,
    shards_fixed_length,
    shards_padding_masked,
    shards_pairs_together,
    shards_positions_restart,
    shards_utilization,
)
from prep_assets.core.invariants.shards import (
    schema_problems as shard_schema_problems,
)
from prep_assets.core.invariants.shards_gold import (
    SCREENED_PARTS,
    Layout,
    screened_rows,
    shards_match_gold,
    shards_tokens_conserved,
)
from prep_assets.core.invariants.silver import (
    silver_accounted,
    silver_lengths,
    silver_not_emptied,
    silver_split_drawn,
    silver_unique,
    silver_unique_across_drops,
)

__all__ = [
    "REJECT_EXAMPLES",
    "ROW_PART_COLUMNS",
    "ROW_PARTS",
    "SAMPLE",
    "file_problems",
    "require_input",
    "TABULAR_REMEDIES",
    "Layout",
    "Outcome",
    "RowRule",
    "bronze_accounted",
    "bronze_reject_rate",
    "bronze_required_fields",
    "count_csv_rows",
    "count_elements",
    "count_lines",
    "count_parquet_rows",
    "duplicates_resolve_to_kept",
    "groups_in_one_split",
    "gold_accounted",
    "gold_ids_in_vocab",
    "gold_loss_tokens",
    "gold_mask_aligned",
    "gold_pairs_complete",
    "gold_reject_rate",
    "gold_rows",
    "gold_tabular_budget",
    "gold_within_max_len",
    "ids_in_vocab_rule",
    "loss_tokens_rule",
    "mask_aligned_rule",
    "SCREENED_PARTS",
    "screened_rows",
    "shard_schema_problems",
    "shard_files",
    "shard_rows",
    "shards_fixed_length",
    "shards_match_gold",
    "shards_one_tokenizer",
    "shards_padding_masked",
    "shards_pairs_together",
    "shards_positions_restart",
    "shards_tokens_conserved",
    "shards_utilization",
    "silver_accounted",
    "silver_lengths",
    "silver_not_emptied",
    "silver_split_drawn",
    "silver_unique",
    "silver_unique_across_drops",
    "tabular_one_schema",
    "within_max_len_rule",
]
