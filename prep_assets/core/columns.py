"""What each column of the layers' Parquet files holds, in words: the column descriptions the UI shows.

One plain mapping, column name -> description, for every field of `core.records`' schemas; a few names mean
something else in one layer (`LAYER_COLUMNS` overrides them there). `shown_columns` leaves out the columns a
dataset's record type never fills (preference pairs, tabular assembly), so its schema lists only its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from prep_assets.core.record_types import TYPES

COLUMNS: dict[str, str] = {
    # provenance, on every record-level table
    "record_id": (
        "Stable id of the record: `<partition>:<line>` (`.<n>` for the n-th element of a JSON array on that line)."
    ),
    "drop": "Partition key of the drop the record came from (file name slug + 10 hex of its sha256).",
    "source_file": "Name of the raw file in raw/<dataset>/ the record was read from.",
    "source_line": (
        "1-based line of the raw file where the record starts (JSON array: its element's line; a table: its row)."
    ),
    "byte_offset": (
        "Byte offset where the record starts, from the start of the (decompressed) stream; Parquet: its row group's."
    ),
    # bronze
    "record_sha256": "sha256 of the raw record's bytes as read (before any normalization).",
    "record": "The raw record as written in the drop (a JSON object, a text line or a table row as JSON).",
    "content": "The record's training content extracted per `input` (type, keys), as canonical JSON.",
    # silver
    "content_sha256": "sha256 of the canonical content after normalization: the exact-dedup key.",
    "num_chars": "Characters of the normalized content (what `clean.min_chars`/`max_chars` compare).",
    "split": "train, validation or test, drawn deterministically from the content hash (`split` ratios).",
    # rejects
    "reason": "Why the row was rejected: a short code (counted per reason in the materialization's metadata).",
    "detail": "The rejection in words: the parse error, the filter and its threshold, or what did not fit.",
    "excerpt": "The start of the rejected line as read, to find it in the raw file.",
    "duplicate_of": "For a duplicate: the record_id of the record kept in its place (this drop or an earlier one).",
    "group_key": "Tabular: the group that could not fit in one example (null otherwise).",
    # gold
    "example_id": (
        "Stable id of the training example: its record id (preference: `<record_id>/chosen` or `/rejected`; "
        "packing_boundary prompt_completion_pair: `<record_id>/<pair number>`)."
    ),
    "token_ids": "Token ids of the example, per the pinned tokenizer (BOS/EOS included).",
    "loss_mask": "Per token: 1 = a loss target (trained), 0 = masked (prompt, system, padding).",
    "token_type_ids": "Per token: 0 prompt, 1 completion, 2 padding, 3 end-of-record EOS.",
    "num_tokens": "Number of tokens of the example.",
    "num_loss_tokens": "Number of tokens with loss_mask 1.",
    "num_prompt_tokens": "Number of masked (prompt) tokens.",
    "pair_id": "Preference: the id both branches of a pair share (the record id).",
    "branch": "Preference: chosen or rejected.",
    "shared_prefix_tokens": "Preference: tokens of the pair's identical masked prompt, shared by both branches.",
    "domain": "The record's domain: the value of its `input.domain_key` field (null: it names none).",
    "record_ids": (
        "Tabular: the records of the example, in order (its provenance columns are the first one's). "
        "Pair examples: [] after the record's first kept pair (the record is counted once)."
    ),
    "group_keys": "Tabular: the group of each BOS/EOS unit of the example (null in flat mode).",
    # shards
    "input_ids": "Token ids of the packed row: exactly `sequence.max_seq_len`, padded with the pad id.",
    "position_ids": "Position of each token within its segment: restarts at 0 at every segment, 0 on padding.",
    "segment_ids": "Which packed example each token belongs to: 1..k in the row, 0 = padding.",
    "seq_lengths": "Token count of each segment of the row, in order (for cu_seqlens); padding not included.",
    "example_ids": "The example_id of each segment of the row, in order.",
    "example_offsets": (
        "Per segment: where it starts in its gold example (0 unless `full` packing or a window split it)."
    ),
}

# names whose meaning differs in one layer (or one layer's rejects)
LAYER_COLUMNS: dict[str, dict[str, str]] = {
    "silver": {"content": "The record's content after `clean.normalize` (NFC, line endings, controls, spaces)."},
    "silver_rejects": {
        "content": "The normalized content, as the filters and dedup saw it.",
        "content_sha256": "sha256 of the normalized content (for duplicates; null when a filter rejected it first).",
    },
    "gold_rejects": {"num_tokens": "Tokens of the record or group that could not become an example."},
    "shards": {
        "loss_mask": "Per token of the row: 1 = a loss target, 0 = masked or padding.",
        "token_type_ids": "Per token of the row: 0 prompt, 1 completion, 2 padding, 3 end-of-record EOS.",
        "num_loss_tokens": "Number of loss targets in the row.",
    },
}

PREFERENCE_ONLY = ("pair_id", "branch", "shared_prefix_tokens")
TABULAR_ONLY = ("record_ids", "group_keys")


def describe(name: str, layer: str | None = None) -> str:
    """The description of a column (as it reads in `layer`, when that layer says it differently)."""
    return LAYER_COLUMNS.get(layer or "", {}).get(name) or COLUMNS.get(name, "")


def shown_columns(names: Iterable[str], input_type: str, domains: bool = False) -> list[str]:
    """The columns a dataset of this record type fills: no pair columns but for pairs, no assembly columns but
    for tables, no domain without `input.domain_key`."""
    record_type = TYPES[input_type]
    hidden = set() if record_type.paired else set(PREFERENCE_ONLY)
    hidden |= set() if record_type.table_rows else set(TABULAR_ONLY)
    hidden |= set() if domains else {"domain"}
    return [n for n in names if n not in hidden]
