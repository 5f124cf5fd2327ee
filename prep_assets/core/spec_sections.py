"""The sections of a dataset spec (`input`, `clean`, `tokenizer`, `sequence`, ...): one pydantic model each,
strict (unknown keys are errors) and frozen. `core/spec.py` assembles them into a `DatasetSpec`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

InputFormat = Literal["auto", "jsonl", "jsonl.gz", "json", "txt", "csv", "parquet"]
TabularMode = Literal["flat", "grouped", "sequential"]
ColumnType = Literal["string", "int", "float"]
TabularPrompt = Literal["schema", "safe_synthesizer"]
TabularAssembly = Literal["default", "safe_synthesizer"]
RecordEncoding = Literal["continuation", "standalone"]
AUTO_MAX_SEQUENCES = 10  # `max_sequences_per_example: auto` (Safe Synthesizer's default without DP)
MaskAction = Literal["train", "mask"]
Overflow = Literal["drop", "truncate_right", "truncate_left", "window"]
PackingStrategy = Literal["bfd", "ffd", "full", "single", "greedy"]
Recipe = Literal["gdp", "safe_synthesizer"]
Boundary = Literal["jsonl", "prompt_completion_pair"]  # gdp's --packing_boundary / --attention_boundary values
Layer = Literal["bronze", "silver", "gold", "shards"]

# Which file suffixes each concrete format reads; `auto` picks by suffix.
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl.gz": (".jsonl.gz", ".ndjson.gz"),
    "jsonl": (".jsonl", ".ndjson"),
    "json": (".json",),
    "txt": (".txt",),
    "csv": (".csv",),
    "parquet": (".parquet",),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class InputSpec(_Strict):
    format: InputFormat = "auto"
    type: str  # a name registered in core/record_types.py
    text_key: str = "text"
    prompt_key: str | list[str] = "prompt"
    completion_key: str = "completion"
    prompt_separator: str = "\n\n"
    prompt_prefix: str = ""
    prompt_postfix: str = ""
    # gdp's separator rule: the prompt's trailing spaces stripped, the completion's leading ones replaced by one
    # space (gdp's default; its `--disable_space_separator` is `false` here); no space without a prompt
    space_separator: bool = False
    # txt: each line keeps its line end (`\n`; `\r\n` read as `\n`), as gdp reads a .txt file (`recipe: gdp`)
    keep_line_ends: bool = False
    # chat / preference: where the conversation is and how its roles are named (None = detect per record:
    # `messages` with role/content, or `conversations` with from/value, or a list of prompt/completion pairs)
    messages_key: str | None = None
    role_key: str | None = None
    content_key: str | None = None
    role_map: dict[str, str] = {}
    system_key: str = "system"
    tools_key: str = "tools"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    max_line_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_gzip_ratio: float = Field(default=100.0, gt=1)  # decompressed / compressed bytes (floor 256 MiB)
    # the record field naming its domain (a string): it travels with the record to gold, is counted per domain
    # in the manifest and routes records in the formats that group by domain (`astrai_bin`)
    domain_key: str | None = None
    # gdp's --categories_path list (inline): a record's `category_key` value names one of them; its position is the
    # `category_id` gold keeps and the hdf5 output writes per token (gdp's category_ids); no value: -1
    categories: list[str] | None = None
    category_key: str = "category"  # the key gdp reads

    @model_validator(mode="after")
    def _check_keys(self) -> InputSpec:
        if isinstance(self.prompt_key, list) and not self.prompt_key:
            raise ValueError("prompt_key: give a key or a non-empty list of keys")
        if self.categories is not None and (not self.categories or len(set(self.categories)) < len(self.categories)):
            raise ValueError("categories: a non-empty list of distinct category names")
        return self

    @property
    def roles(self) -> dict[str, str]:
        """Source role name -> chat role: the defaults, overridden by `role_map`."""
        return {**DEFAULT_ROLE_MAP, **self.role_map}

    @property
    def prompt_keys(self) -> tuple[str, ...]:
        return (self.prompt_key,) if isinstance(self.prompt_key, str) else tuple(self.prompt_key)


CHAT_ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ROLE_MAP: dict[str, str] = {
    **{r: r for r in CHAT_ROLES},
    "human": "user",
    "gpt": "assistant",
    "function_call": "assistant",
    "observation": "tool",
}


class NormalizeSpec(_Strict):
    nfc: bool = True
    newlines: bool = True
    control_chars: bool = True
    trailing_whitespace: bool = True


class QualitySpec(_Strict):
    """Gopher/C4-style heuristics over a record's text (its text fields joined by newlines); each off when null."""

    min_words: int | None = Field(default=None, ge=1)
    max_repeated_line_fraction: float | None = Field(default=None, ge=0, le=1)  # repeated lines / lines
    max_repeated_ngram_fraction: float | None = Field(default=None, ge=0, le=1)  # chars in repeated word n-grams
    repeated_ngram_size: int = Field(default=5, ge=1, le=20)
    max_non_alnum_fraction: float | None = Field(default=None, ge=0, le=1)  # non-alphanumeric, non-space chars

    @property
    def enabled(self) -> bool:
        """Is any heuristic on? (Each is a field that is null when off; `repeated_ngram_size` only sets one up.)"""
        return any(
            getattr(self, name) is not None for name in type(self).model_fields if name != "repeated_ngram_size"
        )


class NearDedupSpec(_Strict):
    """MinHash + LSH near-duplicate removal (`dedup: near`): a record whose estimated Jaccard similarity with a
    kept record reaches `threshold` is removed."""

    threshold: float = Field(default=0.7, gt=0, le=1)
    unit: Literal["word", "char"] = "word"
    ngram: int = Field(default=3, ge=1, le=50)
    num_perm: int = Field(default=128, ge=16, le=1024)
    seed: int = 1


class CleanSpec(_Strict):
    normalize: NormalizeSpec | bool = True
    min_chars: int = Field(default=1, ge=0)
    max_chars: int | None = Field(default=None, ge=1)
    quality: QualitySpec = QualitySpec()
    dedup: Literal["exact", "near", "none"] = "exact"  # near: exact first, then near-duplicates
    dedup_scope: Literal["drop", "dataset"] = "drop"
    near: NearDedupSpec = NearDedupSpec()
    # keep records whose trained turn (completion, assistant message) is empty or whitespace only
    keep_empty_turns: bool = False
    # AstrAI's `preprocessing.max_items`: at most this many kept records per drop, the rest rejected `max_items`
    max_items: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _scope_needs_dedup(self) -> CleanSpec:
        if self.dedup_scope == "dataset" and self.dedup == "none":
            raise ValueError("clean.dedup_scope: dataset needs clean.dedup: exact or near (tables default to none)")
        return self

    @property
    def normalization(self) -> NormalizeSpec:
        if isinstance(self.normalize, NormalizeSpec):
            return self.normalize
        if self.normalize:
            return NormalizeSpec()
        return NormalizeSpec(nfc=False, newlines=False, control_chars=False, trailing_whitespace=False)


class TrainTokenizerSpec(_Strict):
    files: list[str] = Field(min_length=1)
    vocab_size: int = Field(default=4096, ge=300, le=1_000_000)
    min_frequency: int = Field(default=2, ge=1)
    special_tokens: list[str] = ["<|endoftext|>", "<|pad|>"]
    eos_token: str = "<|endoftext|>"
    pad_token: str | None = "<|pad|>"
    bos_token: str | None = None

    @model_validator(mode="after")
    def _specials_listed(self) -> TrainTokenizerSpec:
        for name in ("eos_token", "pad_token", "bos_token"):
            value = getattr(self, name)
            if value is not None and value not in self.special_tokens:
                raise ValueError(f"{name} {value!r} must be one of special_tokens {self.special_tokens}")
        return self


class TokenizerSpec(_Strict):
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    train: TrainTokenizerSpec | None = None
    add_bos: bool | None = None
    add_eos: bool = True
    # a chat template for tokenizers without one (or to replace theirs): inline Jinja, or a file
    chat_template: str | None = None
    chat_template_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSpec:
        given = [k for k in ("path", "hub_id", "train") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, hub_id, train (got {given or 'none'})")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give chat_template (inline) or chat_template_file, not both")
        if self.hub_id is not None and not self.revision:
            raise ValueError("hub_id needs a revision (a commit sha or tag) so the tokenizer is pinned")
        return self


class SequenceSpec(_Strict):
    max_seq_len: int = Field(default=2048, ge=8, le=1_048_576)
    overflow: Overflow = "drop"
    # window: tokens each window repeats from the previous one (masked); at most max_seq_len / 2
    overlap: int = Field(default=0, ge=0)
    # gdp's --keep_prompt_only_sequences: keep an example with no trained token (a prompt truncated to nothing
    # of its completion, a prompt whose completion is empty) instead of rejecting it `no_trained_tokens`
    keep_prompt_only_sequences: bool = False

    @model_validator(mode="after")
    def _overlap(self) -> SequenceSpec:
        if self.overlap and self.overflow != "window":
            raise ValueError("overlap applies only to overflow: window")
        if 2 * self.overlap > self.max_seq_len:
            raise ValueError(f"overlap {self.overlap} must be at most max_seq_len / 2 ({self.max_seq_len // 2})")
        return self


class PackingSpec(_Strict):
    strategy: PackingStrategy = "bfd"
    # examples per row; for tabular data, records (flat, sequential) or groups (grouped) per example.
    # `auto` = 10; unset = no limit, except for tabular data where unset means `auto`.
    max_sequences_per_example: int | Literal["auto"] | None = None

    @model_validator(mode="after")
    def _per_example(self) -> PackingSpec:
        n = self.max_sequences_per_example
        if isinstance(n, int) and not isinstance(n, bool) and n < 1:
            raise ValueError("max_sequences_per_example must be at least 1 (or auto)")
        return self

    seed: int = 0
    shuffle: bool = True
    # gdp's --packing_boundary / --attention_boundary: a record (`jsonl`, one line) or each of its prompt/completion
    # pairs (`prompt_completion_pair`) is the unit rows take whole / the span tokens attend within (the attention
    # boundary is where gdp's token type 3 falls: docs/spec.md, "gdp recipe")
    packing_boundary: Boundary = "jsonl"
    attention_boundary: Boundary = "jsonl"
    # greedy: an example gold dropped as too long (overflow drop) closes the open row, as gdp's greedy meets it
    # (it never fits); gold then marks each example that follows a dropped one of its split (`recipe: gdp`)
    close_row_at_dropped: bool = False

    @model_validator(mode="after")
    def _boundaries(self) -> PackingSpec:
        if self.packing_boundary == "prompt_completion_pair" and self.strategy == "full":
            raise ValueError(
                "packing_boundary prompt_completion_pair packs each pair whole: use strategy greedy, single, bfd "
                "or ffd (full cuts examples across rows)"
            )
        if self.packing_boundary == "prompt_completion_pair" and self.attention_boundary == "jsonl":
            if self.strategy not in ("greedy", "single"):
                raise ValueError(
                    f"packing_boundary prompt_completion_pair with attention_boundary jsonl (gdp's all shot "
                    f"layout) lets a pair attend to the earlier pairs of its record in its row, which needs them "
                    f"packed in input order: use strategy greedy or single, not {self.strategy}"
                )
        return self


class TabularSpec(_Strict):
    """How table rows become training examples (docs/spec.md, "Tabular data"). The mode follows from the keys when
    not given: sequential with `time_series: true`, grouped with `group_by`, else flat."""

    mode: TabularMode | None = None
    time_series: bool = False  # sequential; takes priority over grouped when group_by is set
    group_by: str | None = None  # sequential without it: the whole drop is one series (SS's pseudo-group)
    order_by: str | None = None
    # sequential without order_by: a generated first column `elapsed_seconds` = position in group x this (SS's
    # time_series.timestamp_interval_seconds without a timestamp_column)
    timestamp_interval_seconds: int | None = Field(default=None, gt=0)
    # which strings are missing values (CSV cells; typed columns' text), and column types: CSV cells' overriding the
    # inference, JSON and Parquet values' read as that type (`records._as_declared`)
    null_values: list[str] = [""]
    column_types: dict[str, ColumnType] = {}
    # the tokens wrapping each unit of records; default: the tokenizer's BOS (its EOS if it has none) and EOS
    bos_token: str | None = None
    eos_token: str | None = None
    # Safe Synthesizer's behaviours (docs/spec.md, "Safe Synthesizer recipe"); `recipe: safe_synthesizer` sets them
    prompt: TabularPrompt = "schema"  # safe_synthesizer: "[INST] Generate a JSONL dataset ... [/INST]" + BOS/EOS
    record_encoding: RecordEncoding = "continuation"  # standalone: each record line tokenized on its own
    float_digits: int | None = Field(default=None, ge=1, le=15)  # floats rounded to this many decimals (SS: 10)
    key_columns_first: bool = False  # sequential: group_by then order_by lead each record and the prompt
    assembly: TabularAssembly = "default"  # safe_synthesizer: SS's group order, RNG and passes
    num_input_records_to_sample: int | None = Field(default=None, gt=0)  # assembly safe_synthesizer only
    differential_privacy: bool = False  # max_sequences_per_example auto -> 1
    missing_ints_as_floats: bool = False  # SS (pandas): an integer column with a missing cell renders 49.0
    # SS's time-series validation (core/time_series_checks.py): a drop whose groups differ in size, start or stop,
    # or whose intervals are not one whole number of seconds, is refused; off under the recipe too
    validate_time_series: bool = False
    timestamp_format: str | None = None  # SS's time_series.timestamp_format: strftime, or elapsed_seconds
    # SS's holdout (core/tabular_holdout.py): test records drawn as SS draws them with split.seed; below 1 a
    # fraction of the drop's records, from 1 a number; 0 (the default, the recipe's too): none
    holdout: float = Field(default=0.0, ge=0)
    max_holdout: int = Field(default=2000, ge=0)

    @model_validator(mode="after")
    def _keys(self) -> TabularSpec:
        mode = self.resolved_mode
        if self.mode is not None and self.time_series and self.mode != "sequential":
            raise ValueError(f"time_series: true makes the mode sequential, but mode is {self.mode}")
        if mode == "sequential" and self.order_by is None and self.timestamp_interval_seconds is None:
            raise ValueError(
                "sequential mode (time series) needs order_by (a timestamp column), or "
                "timestamp_interval_seconds to generate an elapsed_seconds column (Safe Synthesizer's way)"
            )
        if self.timestamp_interval_seconds is not None and mode != "sequential":
            raise ValueError("timestamp_interval_seconds is a time series' interval: it needs time_series: true")
        if self.timestamp_interval_seconds is not None and self.order_by is not None and not self.validate_time_series:
            raise ValueError(
                "timestamp_interval_seconds with order_by is checked against the timestamps by Safe Synthesizer's "
                "validation: set validate_time_series: true (without order_by it generates elapsed_seconds)"
            )
        if (self.validate_time_series or self.timestamp_format is not None) and mode != "sequential":
            raise ValueError("validate_time_series and timestamp_format apply to a time series (time_series: true)")
        if self.timestamp_format is not None and not self.validate_time_series:
            raise ValueError("timestamp_format is read by Safe Synthesizer's validation: set validate_time_series")
        if mode == "grouped" and self.group_by is None:
            raise ValueError("grouped mode needs group_by")
        if mode == "flat" and (self.group_by is not None or self.order_by is not None):
            raise ValueError("flat mode shuffles single records: group_by/order_by need mode grouped or sequential")
        if self.num_input_records_to_sample is not None and self.assembly != "safe_synthesizer":
            raise ValueError(
                "num_input_records_to_sample is Safe Synthesizer's sampling: it needs assembly safe_synthesizer"
            )
        return self

    @property
    def generates_timestamps(self) -> bool:
        """Whether gold adds an elapsed_seconds column to order a time series without a timestamp column."""
        return self.resolved_mode == "sequential" and self.order_by is None

    @property
    def resolved_mode(self) -> TabularMode:
        if self.time_series or self.mode == "sequential":
            return "sequential"
        if self.mode is not None:
            return self.mode
        return "grouped" if self.group_by is not None else "flat"


class SplitSpec(_Strict):
    validation_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    test_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    # exactly this many kept records of each drop (those with the smallest split hashes); exclusive with the ratios
    validation_count: int | None = Field(default=None, ge=0)
    test_count: int | None = Field(default=None, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _sum(self) -> SplitSpec:
        if self.by_count and (self.validation_ratio or self.test_ratio):
            raise ValueError(
                "give the held-out splits as ratios (validation_ratio, test_ratio) or as counts of records "
                "(validation_count, test_count), not both"
            )
        if self.validation_ratio + self.test_ratio >= 1.0:
            raise ValueError("validation_ratio + test_ratio must be below 1 (something must train)")
        return self

    @property
    def by_count(self) -> bool:
        """Whether the held-out splits are counts of records (`validation_count`, `test_count`)."""
        return self.validation_count is not None or self.test_count is not None

    @property
    def holds_out(self) -> bool:
        """Whether any record can leave train."""
        return bool(self.validation_ratio or self.test_ratio or self.validation_count or self.test_count)


class OutputSpec(_Strict):
    # parquet always; npy: flat memmap arrays + meta.json; megatron: .bin/.idx of gold documents; docs/formats.md
    formats: list[str] = ["parquet"]  # names registered in core/formats.py
    max_tokens_per_shard: int = Field(default=50_000_000, ge=8)
    compression: Literal["zstd", "snappy", "none"] = "zstd"
    # hdf5 (SambaNova gdp): metadata.yaml's tokenizer_model_type (gdp writes str(type(model_config)))
    hdf5_model_type: str | None = None
    hdf5_test_jsonl: bool = False  # the test split as gdp's untokenized test_files/*.jsonl, not HDF5
    categories: list[str] | None = None  # gdp's --categories_path list: domains -> category_ids, in this order
    # hdf5: gdp's --num_training_splits / --num_dev_splits / --num_test_splits, the train / dev / test rows of a drop
    # in exactly this many files (test with hdf5_test_jsonl: its records in this many JSONL files)
    num_training_splits: int | None = Field(default=None, ge=1)
    num_dev_splits: int | None = Field(default=None, ge=1)
    num_test_splits: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _categories(self) -> OutputSpec:
        if self.categories is not None and (not self.categories or len(set(self.categories)) < len(self.categories)):
            raise ValueError("output.categories: a non-empty list of distinct domain names")
        for key in ("num_training_splits", "num_dev_splits", "num_test_splits"):
            if getattr(self, key) is not None and "hdf5" not in self.formats:
                raise ValueError(f"output.{key} sets the number of gdp HDF5 files: add hdf5 to output.formats")
        return self


class ChecksSpec(_Strict):
    max_reject_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    # gold rejects / silver records of a drop (records that could not become a training example)
    max_gold_reject_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    min_sequence_utilization: float = Field(default=0.5, ge=0.0, le=1.0)
