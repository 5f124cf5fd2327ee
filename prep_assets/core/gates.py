"""The blocking quality gates between layers, declared once: each gate's layer, name, description and judge.

The Dagster asset checks (`defs/checks.py`), the manifest's publication (`core/manifest.py`), the gates table of
docs/shards.md (`markdown_table`) and the tests all read these declarations. How to add a gate: see `Gate`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa

from prep_assets.core import invariants as inv
from prep_assets.core.dedup import earlier_indexes
from prep_assets.core.drops import resolve_drop
from prep_assets.core.errors import DropError, TokenizerError
from prep_assets.core.lake import EXAMPLES, RECORDS, REJECTS, STATS, DatasetPaths, read_json
from prep_assets.core.masking import trainable_types
from prep_assets.core.record_types import record_type
from prep_assets.core.records import (
    BRONZE_REJECT_SCHEMA,
    BRONZE_SCHEMA,
    GOLD_REJECT_SCHEMA,
    GOLD_SCHEMA,
    SILVER_REJECT_SCHEMA,
    SILVER_SCHEMA,
)
from prep_assets.core.shards import ShardStats, drops_prompt_only_rows
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.sql import shared_database
from prep_assets.core.tokenizer import load_pinned_info

GateLayer = Literal[
    "bronze", "silver", "gold", "shards", "manifest"
]  # what a gate judges (the manifest: the dataset's)


# The Parquet files each layer's gates read besides the shards (layer folder, file name, the schema it must hold)
_READ: dict[str, tuple[tuple[str, str, pa.Schema], ...]] = {
    "bronze": (("bronze", RECORDS, BRONZE_SCHEMA), ("bronze", REJECTS, BRONZE_REJECT_SCHEMA)),
    "silver": (
        ("bronze", RECORDS, BRONZE_SCHEMA),
        ("silver", RECORDS, SILVER_SCHEMA),
        ("silver", REJECTS, SILVER_REJECT_SCHEMA),
    ),
    "gold": (
        ("silver", RECORDS, SILVER_SCHEMA),
        ("gold", EXAMPLES, GOLD_SCHEMA),
        ("gold", REJECTS, GOLD_REJECT_SCHEMA),
    ),
    "shards": (("gold", EXAMPLES, GOLD_SCHEMA),),
}


def _layer_dir(layer: str) -> property:
    return property(lambda on: on.paths.partition_dir(layer, on.partition), doc=f"the partition's {layer} folder")


@dataclass(frozen=True)
class Subject:
    """What a gate judges: one partition of a dataset (its layers' folders), or, for the manifest's gates, the
    dataset's manifest: the one given (before it is published) or else the published one."""

    spec: DatasetSpec
    paths: DatasetPaths
    partition: str = ""
    given_manifest: dict[str, Any] | None = None

    bronze = _layer_dir("bronze")
    silver = _layer_dir("silver")
    gold = _layer_dir("gold")
    shards = _layer_dir("shards")

    @property
    def shard_files(self) -> list[Path]:
        return inv.shard_files(self.shards)

    @cached_property
    def _unreadable(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def unreadable(self, layer: GateLayer) -> list[dict[str, Any]]:
        """Each column a file that `layer`'s gates read (`_READ`: the layer's own, the layer's before) lacks, holds
        as another kind, or holds a NULL in where its schema allows none (`inv.file_problems`), then the shard files'
        (`inv.shard_schema_problems`). A file that is not there is left to the gates that read it."""
        if layer not in self._unreadable:
            found = [
                problem
                for upstream, name, schema in _READ.get(layer, ())
                if (path := self.paths.partition_dir(upstream, self.partition) / name).exists()
                for problem in inv.file_problems(path, schema)
            ]
            shards = inv.shard_schema_problems(self.shard_files) if layer == "shards" else []
            self._unreadable[layer] = found + shards
        return self._unreadable[layer]

    @cached_property
    def manifest(self) -> dict[str, Any]:
        return read_json(self.paths.manifest_path) if self.given_manifest is None else self.given_manifest


Judge = Callable[[Subject], inv.Outcome]


class SharedPass(ABC):
    """A judge whose gates, when several run together, read one pass over the data (`shared`) rather than one
    each; run alone, a gate makes the pass for itself (`alone`). Either way a gate gets the same outcome."""

    @classmethod
    @abstractmethod
    def shared(cls, subject: Subject, judges: Sequence[Any]) -> Any:
        """The one pass, for the judges of the gates run together (in their order)."""

    @abstractmethod
    def from_shared(self, subject: Subject, value: Any, index: int) -> inv.Outcome:
        """This judge's outcome from the pass (`index`: its place among the judges)."""

    @abstractmethod
    def alone(self, subject: Subject) -> inv.Outcome:
        """This judge's outcome from a pass of its own."""


@dataclass(frozen=True)
class GoldRows(SharedPass):
    """A gold gate judged example by example (`inv.RowRule`): the rules judged together share one pass over gold."""

    rule: Callable[[Subject], inv.RowRule]

    @classmethod
    def shared(cls, subject: Subject, judges: Sequence[GoldRows]) -> list[inv.Outcome]:
        return inv.gold_rows(subject.gold, [j.rule(subject) for j in judges])

    def from_shared(self, subject: Subject, value: list[inv.Outcome], index: int) -> inv.Outcome:
        return value[index]

    def alone(self, subject: Subject) -> inv.Outcome:
        return inv.gold_rows(subject.gold, [self.rule(subject)])[0]


@dataclass(frozen=True)
class ShardRows(SharedPass):
    """A shard gate that reads its `part` of `inv.shard_rows` (None: it makes the pass for its own part). Judged
    together with the other parts the screen stands in for (`inv.SCREENED_PARTS`), they read `inv.screened_rows`."""

    part: str
    from_rows: Callable[[Subject, pa.Table | None], inv.Outcome]

    @classmethod
    def shared(cls, subject: Subject, judges: Sequence[ShardRows]) -> pa.Table | None:
        # `judged` gives it no gate whose files cannot be read as the shard schema says (`Gate.cannot_read`)
        files = subject.shard_files
        if not files:
            return None
        parts, pad_id = [j.part for j in judges], None
        if "padding" in parts:
            try:
                pad_id = load_pinned_info(subject.paths.tokenizer_dir).pad_id
            except TokenizerError:  # the padding gate meets this error judged alone; the others keep the pass
                parts.remove("padding")
        seq_len = subject.spec.sequence.max_seq_len
        if pad_id is not None and inv.SCREENED_PARTS <= set(parts):  # through the screen: one hash pass a side
            return inv.screened_rows(files, subject.gold, subject.spec.sequence.overlap, seq_len, pad_id, parts)
        return inv.shard_rows(files, parts, seq_len, pad_id)

    def from_shared(self, subject: Subject, value: pa.Table | None, index: int) -> inv.Outcome:
        if value is not None and inv.ROW_PART_COLUMNS[self.part] not in value.column_names:
            return self.alone(subject)
        return self.from_rows(subject, value)

    def alone(self, subject: Subject) -> inv.Outcome:
        return self.from_rows(subject, None)


def _always(spec: DatasetSpec) -> bool:
    return True


@dataclass(frozen=True)
class Gate:
    """One blocking gate: the layer it judges (a check of that layer's asset, `defs/keys.LAYER_ASSET`), its check's
    name, its one description (the check's, shown in the UI, and its row of the gates table in docs/shards.md) and
    its judge, in the datasets where it `applies`.

    To add a gate: write its invariant in `core/invariants/<layer>.py`, returning an `Outcome` (the violation
    count, offending rows, the figures it measured; a `description` only where figures say more than the count),
    then declare it here, in `GATES`, at its place in its layer's order:

        Gate("silver", "clean_records_<assertion>", "what it asserts, in the spec's terms",
             lambda on: inv.silver_<assertion>(on.silver, on.spec.clean.<option>), applies=lambda s: ...)

    The judge is a function of the `Subject` (the partition's layer folders, or the manifest); a gold rule judged
    row by row is `GoldRows(lambda on: inv.<rule>(...))`, a shard gate reading the shared row pass is
    `ShardRows("<part of inv.ROW_PARTS>", lambda on, rows: ...)`. Then regenerate the table in docs/shards.md
    (`markdown_table()`; a test holds them equal). The asset check, the UI and the manifest follow by themselves.
    """

    layer: GateLayer
    name: str
    description: str
    judge: Judge | SharedPass
    applies: Callable[[DatasetSpec], bool] = _always

    def named(self, outcome: inv.Outcome) -> inv.Outcome:
        """The outcome under this gate's name, described by this gate unless it found more to say."""
        return replace(outcome, name=self.name, description=outcome.description or self.description)

    def cannot_read(self, subject: Subject) -> inv.Outcome | None:
        """A gate's violation when a file it reads lacks a column, holds one as another kind, or a NULL where its
        schema allows none (`Subject.unreadable`): those columns, named, rather than the error, the cast reading or
        the NULL comparison (which passes) of its pass."""
        if self.layer == "manifest":
            return None
        problems = subject.unreadable(self.layer)
        if not problems:
            return None
        return self.named(
            inv.Outcome(
                len(problems),
                problems[: inv.SAMPLE],
                {"files": len({p["file"] for p in problems})},
                "not judged: a file this gate reads lacks a column, holds one as another type, or holds a NULL where "
                "the layer's schema allows none (listed); rematerialize the layer named",
            )
        )

    def evaluate(self, subject: Subject) -> inv.Outcome:
        """This gate judged alone."""
        if (unread := self.cannot_read(subject)) is not None:
            return unread
        judge = self.judge.alone if isinstance(self.judge, SharedPass) else self.judge
        return self.named(judge(subject))

    def probe(self, spec: DatasetSpec, paths: DatasetPaths, partition: str) -> inv.Outcome:
        """This gate judged alone on one partition."""
        return self.evaluate(Subject(spec, paths, partition))


def _source(on: Subject) -> Path | None:
    try:
        return resolve_drop(on.paths, on.partition)[1]
    except DropError:
        return None  # the file is gone or changed: account against the reader's own line count


def layout(spec: DatasetSpec) -> inv.Layout:
    seq = spec.sequence
    return inv.Layout(seq.max_seq_len, spec.packing.strategy, seq.overflow, seq.overlap, drops_prompt_only_rows(spec))


def _reported(shards_dir: Path) -> dict[str, Any] | None:
    """The shards' own per-split figures (`ShardStats.splits`), None before any were written."""
    stats = shards_dir / STATS
    return ShardStats.from_json(read_json(stats)).splits if stats.is_file() else None


def _manifest_partitions(on: Subject) -> list[dict[str, Any]]:
    return [{"partition": k, **v} for k, v in on.manifest["partitions"].items()]


def _table_columns(gold_dir: Path) -> list[str] | None:
    """A tabular partition's columns as its published gold stats give them; None for a drop of no record (a
    header-only file): it trained under no schema."""
    tabular = read_json(gold_dir / STATS).get("tabular") or {}
    return list(tabular.get("columns") or []) if tabular.get("records") else None


def _paired(spec: DatasetSpec) -> bool:
    return record_type(spec.input.type).paired


def _table_rows(spec: DatasetSpec) -> bool:
    return record_type(spec.input.type).table_rows


GATES: tuple[Gate, ...] = (
    Gate(
        "bronze",
        "raw_records_accounted",
        "records + rejects + blank lines = lines in the drop file (elements of a JSON array, rows of a CSV or "
        "Parquet file), recounted independently of the reader",
        lambda on: inv.bronze_accounted(on.bronze, _source(on)),
    ),
    Gate(
        "bronze",
        "raw_records_reject_rate",
        "rejects / (records + rejects) ≤ `checks.max_reject_rate` (blank lines excluded); metadata: the rate and "
        "the rejects by reason",
        lambda on: inv.bronze_reject_rate(on.bronze, on.spec.checks.max_reject_rate),
    ),
    Gate(
        "bronze",
        "raw_records_required_fields",
        "provenance present, record ids unique, content valid JSON",
        lambda on: inv.bronze_required_fields(on.bronze),
    ),
    Gate(
        "silver",
        "clean_records_unique",
        "with `clean.dedup: exact`: no two kept records have the same content (hash and bytes)",
        lambda on: inv.silver_unique(on.silver),
        applies=lambda s: s.clean.dedup == "exact",
    ),
    Gate(
        "silver",
        "clean_records_unique_across_drops",
        "with `clean.dedup: exact` and `dedup_scope: dataset`: no kept record has the content (hash and bytes) of "
        "a record of a drop registered earlier (their dedup indexes; a missing index fails)",
        lambda on: inv.silver_unique_across_drops(
            on.silver, [f for _, f in earlier_indexes(on.spec, on.paths, on.partition)]
        ),
        applies=lambda s: s.clean.dedup == "exact" and s.clean.dedup_scope == "dataset",
    ),
    Gate(
        "silver",
        "clean_records_duplicates_kept",
        "with `clean.dedup` and `dedup_scope: drop`: every record removed as a duplicate names a record the drop "
        "keeps, directly or through a near duplicate of a kept one (the manifest's `duplicates_kept` judges "
        "`dedup_scope: dataset`)",
        lambda on: inv.duplicates_resolve_to_kept([on.silver]),
        applies=lambda s: s.clean.dedup != "none" and s.clean.dedup_scope == "drop",
    ),
    Gate(
        "silver",
        "clean_records_length_bounds",
        "`clean.min_chars` ≤ chars ≤ `clean.max_chars` for every kept record",
        lambda on: inv.silver_lengths(on.silver, on.spec.clean.min_chars, on.spec.clean.max_chars),
    ),
    Gate(
        "silver",
        "clean_records_split_drawn",
        "with held-out splits (`split.*_ratio` or `split.*_count`) and no `tabular.group_by`: every kept record is "
        "in the split its content hash draws (ratios: where the hash falls; counts: its rank in the drop), "
        "recomputed apart from silver",
        lambda on: inv.silver_split_drawn(on.silver, on.spec.split),
        applies=lambda s: s.split.holds_out and (s.tabular is None or s.tabular.group_by is None),
    ),
    Gate(
        "silver",
        "clean_records_not_emptied",
        "the drop keeps a record unless it had none or mostly repeats (`duplicate`, `near_duplicate` at least as "
        "many as cleaning's rejects): cleaning that rejects every record (a `clean` threshold edited too far) fails "
        "instead of emptying the drop's shards; the description counts the rejects by reason",
        lambda on: inv.silver_not_emptied(on.silver),
    ),
    Gate(
        "silver",
        "clean_records_accounted",
        "each bronze record is exactly once in silver records or rejects",
        lambda on: inv.silver_accounted(on.silver, on.bronze),
    ),
    Gate(
        "gold",
        "tokenized_examples_mask_aligned",
        "no NULL list, value or count; equal list lengths, counts equal to the lists, mask ∈ {0,1}, mask 1 only on "
        "the token types `mask` trains (completion/EOS by default); the file holds ids, mask and types as lists of "
        "integers",
        GoldRows(lambda on: inv.mask_aligned_rule(trainable_types(on.spec))),
    ),
    Gate(
        "gold",
        "tokenized_examples_have_loss_tokens",
        "every example has ≥ 1 loss token (unless `sequence.keep_prompt_only_sequences` keeps them)",
        GoldRows(lambda on: inv.loss_tokens_rule()),
        applies=lambda s: not s.sequence.keep_prompt_only_sequences,
    ),
    Gate(
        "gold",
        "tokenized_examples_ids_in_vocab",
        "0 ≤ every token id < the tokenizer's vocab size",
        GoldRows(lambda on: inv.ids_in_vocab_rule(load_pinned_info(on.paths.tokenizer_dir).vocab_size)),
    ),
    Gate(
        "gold",
        "tokenized_examples_within_max_len",
        "1 ≤ tokens ≤ `sequence.max_seq_len` (any length ≥ 1 under `full` or `window`, which split examples in "
        "packing)",
        GoldRows(lambda on: inv.within_max_len_rule(on.spec.sequence.max_seq_len, on.spec.splits_examples)),
    ),
    Gate(
        "gold",
        "tokenized_examples_accounted",
        "gold examples + gold rejects = silver records, one to one (a pair counts once; a tabular example counts "
        "each record in `record_ids`)",
        lambda on: inv.gold_accounted(on.gold, on.silver),
    ),
    Gate(
        "gold",
        "tokenized_examples_reject_rate",
        "gold rejects / records entering gold (silver's kept records) ≤ `checks.max_gold_reject_rate` (default "
        "0.05); metadata: the rate, the counts, and the rejects by reason with a few example rows (record id, "
        "file:line, detail)",
        lambda on: inv.gold_reject_rate(on.gold, on.silver, on.spec.checks.max_gold_reject_rate),
    ),
    Gate(
        "gold",
        "tokenized_examples_pairs_complete",
        "preference only: one chosen + one rejected example per pair, one split, the first `shared_prefix_tokens` "
        "identical and masked",
        lambda on: inv.gold_pairs_complete(on.gold),
        applies=_paired,
    ),
    Gate(
        "gold",
        "tokenized_examples_tabular_budget",
        "tabular only: no record (any mode) or group (grouped) left out for not fitting `sequence.max_seq_len` "
        "with the schema prompt and BOS/EOS; fails before any shard is written, naming the largest, their "
        "tokens, the budget and the remedies",
        lambda on: inv.gold_tabular_budget(on.gold, on.spec.sequence.max_seq_len),
        applies=_table_rows,
    ),
    Gate(
        "shards",
        "packed_shards_fixed_length",
        "every list column exactly `sequence.max_seq_len`; `num_loss_tokens` = sum of the mask; one example id "
        "and offset per segment; every file holds the token lists, lengths and offsets as lists of integers",
        ShardRows(
            "fixed", lambda on, rows: inv.shards_fixed_length(on.shard_files, on.spec.sequence.max_seq_len, rows)
        ),
    ),
    Gate(
        "shards",
        "packed_shards_padding_masked",
        "padding (segment 0) = pad id, mask 0, padding token type, position 0",
        ShardRows(
            "padding",
            lambda on, rows: inv.shards_padding_masked(
                on.shard_files, load_pinned_info(on.paths.tokenizer_dir).pad_id, rows
            ),
        ),
    ),
    Gate(
        "shards",
        "packed_shards_positions_restart",
        "positions 0 at each segment start, +1 inside; segments 1..k; segment starts masked; the segments are "
        "exactly the ones `seq_lengths` lists (a row whose segments run past them fails as a row: the other gates "
        "judge only the tokens `seq_lengths` covers)",
        ShardRows("layout", lambda on, rows: inv.shards_positions_restart(on.shard_files, rows)),
    ),
    Gate(
        "shards",
        "packed_shards_tokens_conserved",
        "per split: shard tokens = gold tokens − tokens dropped by packing + window overlaps, both recomputed from "
        "gold in SQL and equal to the packer's own figures; every example placed as the strategy requires: whole "
        "once (bfd/ffd/single/greedy), as exactly its windows with a loss token, or (full) tiled from token 0 to its "
        "end, in its own split (where prompt-only rows are left out: in order, no token of a completion among the "
        "ones in no row, and those counted as dropped)",
        lambda on: inv.shards_tokens_conserved(on.shard_files, on.gold, layout(on.spec), _reported(on.shards)),
    ),
    Gate(
        "shards",
        "packed_shards_match_gold",
        "token by token, each segment equals its gold example at its offset (id, type), with gold's mask except "
        "the segment's first token (and a window's overlap), masked (judged with the other row gates, the screen "
        "first: docs/shards.md; then, or alone, rows first: a sum of per-token hashes of "
        "position, id, mask and type against the same sum over the row's gold tokens; then, for failing rows "
        "only, segment by segment and the first bad token; a failing row whose listed segments all match is a "
        "violation of its own: its `seq_lengths` cover tokens no example id names)",
        ShardRows(
            "checksum",
            lambda on, rows: inv.shards_match_gold(on.shard_files, on.gold, on.spec.sequence.overlap, rows),
        ),
    ),
    Gate(
        "shards",
        "packed_shards_utilization",
        "tokens in segments / (rows × `sequence.max_seq_len`) ≥ `checks.min_sequence_utilization`",
        lambda on: inv.shards_utilization(
            on.shard_files, on.spec.sequence.max_seq_len, on.spec.checks.min_sequence_utilization
        ),
    ),
    Gate(
        "shards",
        "packed_shards_pairs_together",
        "preference only: both examples of every pair in the same row (so file, row group and split)",
        lambda on: inv.shards_pairs_together(on.shard_files, on.gold),
        applies=_paired,
    ),
    Gate(
        "manifest",
        "dataset_manifest_one_tokenizer",
        "every partition's shards were made with the pinned tokenizer (one fingerprint)",
        lambda on: inv.shards_one_tokenizer(_manifest_partitions(on), on.manifest["tokenizer_fingerprint"]),
    ),
    Gate(
        "manifest",
        "dataset_manifest_one_table_schema",
        "tabular only: every drop of the manifest has the same columns in the same order (the manifest states one "
        "schema and schema prompt; put a table of other columns in a dataset of its own, or retire the drop)",
        lambda on: inv.tabular_one_schema(
            {
                k: columns
                for k in on.manifest["partitions"]
                if (columns := _table_columns(on.paths.partition_dir("gold", k))) is not None
            }
        ),
        applies=_table_rows,
    ),
    Gate(
        "manifest",
        "dataset_manifest_groups_in_one_split",
        "tabular with `group_by`: every group is in one split across the manifest's drops (a holdout of a count of "
        "groups draws each drop apart: a group held out in one drop and trained in another would leak)",
        lambda on: inv.groups_in_one_split(
            [on.paths.partition_dir("gold", k) for k in sorted(on.manifest["partitions"])]
        ),
        applies=lambda s: _table_rows(s) and s.tabular.group_by is not None,
    ),
    Gate(
        "manifest",
        "dataset_manifest_duplicates_kept",
        "with `dedup_scope: dataset`: every duplicate removed from the manifest's drops names a record kept in "
        "them (a copy kept only in a replaced or failed drop would otherwise be lost; rebuild the named drops' "
        "silver)",
        lambda on: inv.duplicates_resolve_to_kept(
            [on.paths.partition_dir("silver", k) for k in sorted(on.manifest["partitions"])]
        ),
        applies=lambda s: s.clean.dedup_scope == "dataset",
    ),
)


def gates_for(spec: DatasetSpec) -> tuple[Gate, ...]:
    """The gates of `spec`'s partitions (every layer but the manifest)."""
    return tuple(g for g in GATES if g.layer != "manifest" and g.applies(spec))


def manifest_gates_for(spec: DatasetSpec) -> tuple[Gate, ...]:
    """The gates of `spec`'s manifest."""
    return tuple(g for g in GATES if g.layer == "manifest" and g.applies(spec))


def markdown_table() -> str:
    """The gates table of docs/shards.md: every gate by layer, in the order declared."""
    lines = ["| layer | check | asserts |", "|---|---|---|"]
    for i, g in enumerate(GATES):
        first = i == 0 or GATES[i - 1].layer != g.layer
        lines.append(
            f"| {g.layer} | `{g.name}` | {g.description} |" if first else f"| | `{g.name}` | {g.description} |"
        )
    return "\n".join(lines) + "\n"


def _judged_together(subject: Subject, group: Sequence[Gate]) -> dict[str, inv.Outcome | Exception]:
    """Each gate of `group` (one kind of `SharedPass`) judged from one shared pass: the pass's error is every
    gate's, a gate's error its own."""
    judges = [g.judge for g in group if isinstance(g.judge, SharedPass)]
    try:
        value = type(judges[0]).shared(subject, judges)
    except Exception as exc:
        return {g.name: exc for g in group}
    out: dict[str, inv.Outcome | Exception] = {}
    for i, (g, judge) in enumerate(zip(group, judges, strict=True)):
        try:
            out[g.name] = g.named(judge.from_shared(subject, value, i))
        except Exception as exc:
            out[g.name] = exc
    return out


def judged(subject: Subject, gates: Sequence[Gate]) -> list[tuple[Gate, inv.Outcome | Exception]]:
    """Each gate's outcome, in order, or the exception its evaluation raised (the others still run). Gates of one
    kind of `SharedPass` run together read one pass; all of them use one DuckDB database."""
    with shared_database():
        together: dict[str, inv.Outcome | Exception] = {}
        for g in gates:
            try:
                if (unread := g.cannot_read(subject)) is not None:
                    together[g.name] = unread
            except Exception as exc:  # the check's own error is the gate's, as a pass's would be
                together[g.name] = exc
        judging = [g for g in gates if g.name not in together]
        for kind in dict.fromkeys(type(g.judge) for g in judging if isinstance(g.judge, SharedPass)):
            group = [g for g in judging if type(g.judge) is kind]
            if len(group) > 1:
                together.update(_judged_together(subject, group))
        out: list[tuple[Gate, inv.Outcome | Exception]] = []
        for g in gates:
            if g.name in together:
                out.append((g, together[g.name]))
                continue
            try:
                out.append((g, g.evaluate(subject)))
            except Exception as exc:
                out.append((g, exc))
        return out


def outcomes(
    spec: DatasetSpec, paths: DatasetPaths, partition: str, gates: Sequence[Gate]
) -> list[tuple[Gate, inv.Outcome | Exception]]:
    """`judged` on one partition."""
    return judged(Subject(spec, paths, partition), gates)


def raised(results: list[tuple[Gate, inv.Outcome | Exception]]) -> list[inv.Outcome]:
    """The outcomes, or the first gate's error raised (once every gate has run)."""
    for _, outcome in results:
        if isinstance(outcome, Exception):
            raise outcome
    return [o for _, o in results if isinstance(o, inv.Outcome)]


def evaluate(
    spec: DatasetSpec, paths: DatasetPaths, partition: str, layer: GateLayer | None = None
) -> list[inv.Outcome]:
    """Run the gates of one partition (of one layer, or all), as the asset checks do; a gate's error is raised."""
    if layer is not None and layer not in get_args(GateLayer):  # a typo would otherwise judge nothing
        raise ValueError(f"no layer {layer!r}; the layers: {get_args(GateLayer)}")
    return raised(outcomes(spec, paths, partition, [g for g in gates_for(spec) if layer is None or g.layer == layer]))
