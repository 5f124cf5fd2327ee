"""Gold: the pinned tokenizer, and silver records tokenized into training examples with loss masks and token types.

These are what the Dagster assets call (and what tests and the benchmark call directly). Each writes
its whole partition into a staging directory that replaces the previous output in one atomic step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prep_assets.core.arrays import list_array, percentiles, segment_sums
from prep_assets.core.chat import ChatTemplate
from prep_assets.core.invariants.common import require_input
from prep_assets.core.lake import (
    EXAMPLES,
    RECORDS,
    REJECTS,
    STATS,
    DatasetPaths,
    loads_json,
    staged_dir,
    write_json_atomic,
)
from prep_assets.core.masking import TokenizedBatch, tokenize_batches
from prep_assets.core.parquet_io import DEFAULT_BATCH, ParquetSink, gc_paused, iter_batches
from prep_assets.core.progress import Progress
from prep_assets.core.record_types import shape_of
from prep_assets.core.records import (
    AFTER_DROPPED,
    CATEGORY,
    DEFAULT_DOMAIN,
    GOLD_REJECT_SCHEMA,
    NO_CATEGORY,
    SILVER_SCHEMA,
    SPLITS,
    TYPE_COMPLETION,
    TYPE_EOS,
    TYPE_PROMPT,
    gold_schema,
)
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.stats import LayerStats, figure
from prep_assets.core.tabular_gold import build_tabular_examples
from prep_assets.core.tokenizer import PinnedTokenizer, load_pinned, pin_tokenizer

# ---------------------------------------------------------------- tokenizer


def build_tokenizer(spec: DatasetSpec, paths: DatasetPaths, data_dir: Path) -> dict[str, Any]:
    with staged_dir(paths.tokenizer_dir) as stage:
        record = pin_tokenizer(spec.tokenizer, base=data_dir, dest=stage)
        if shape_of(spec) in ("messages", "pair"):
            ChatTemplate(load_pinned(stage))  # fail here, before any drop, if there is no template
    return record


# ---------------------------------------------------------------- gold


@dataclass
class _GoldTally:
    """What gold counts while it writes: rejects by reason, token totals, overflow per split, example lengths."""

    reasons: Counter[str] = field(default_factory=Counter)
    totals: Counter[str] = field(default_factory=Counter)
    overflow_by_split: Counter[str] = field(default_factory=Counter)
    lengths: list[np.ndarray] = field(default_factory=list)
    by_domain: dict[str, Counter[str]] = field(default_factory=dict)  # with input.domain_key: examples, tokens
    pairs_rejected: Counter[str] = field(default_factory=Counter)  # pair units: rejected pairs of kept records
    dropped_in: set[str] = field(default_factory=set)  # splits with a dropped example since their last kept one

    def after_dropped(self, tb: TokenizedBatch, unit_splits: list[str]) -> np.ndarray:
        """Per kept unit of `tb`, in order: whether a unit of its split was dropped as too long since the split's
        previous kept unit (across batches); what gdp's greedy closes its open row at."""
        dropped = [(int(e), True) for e, reason, *_ in tb.rejects if reason == "too_long"]
        out = np.zeros(len(tb.kept), dtype=bool)
        j = 0
        for e, is_drop in sorted([*dropped, *((int(e), False) for e in tb.kept.tolist())]):
            if is_drop:
                self.dropped_in.add(unit_splits[e])
            else:
                out[j] = unit_splits[e] in self.dropped_in
                self.dropped_in.discard(unit_splits[e])
                j += 1
        return out

    def count_domains(self, domains: list[str | None], lengths: np.ndarray, n_loss: np.ndarray) -> None:
        for domain, n, loss in zip(domains, lengths.tolist(), n_loss.tolist(), strict=True):
            c = self.by_domain.setdefault(domain if domain is not None else DEFAULT_DOMAIN, Counter())
            c["examples"] += 1
            c["tokens"] += n
            c["loss_tokens"] += loss


@dataclass(frozen=True)
class _PairUnits:
    """A batch's records split into their prompt/completion pairs (gdp's prompt_completion_pair boundary): one
    content per pair, `owner` its record's index in the batch, `number` its place in the record (from 1)."""

    contents: list[dict[str, Any]]
    owner: np.ndarray
    number: np.ndarray

    @classmethod
    def of(cls, contents: list[dict[str, Any]]) -> _PairUnits:
        sizes = [len(c["turns"]) for c in contents]
        pairs = [{"turns": [t]} for c in contents for t in c["turns"]]
        owner = np.repeat(np.arange(len(contents)), sizes)
        number = np.concatenate([np.arange(1, n + 1) for n in sizes]) if sizes else np.zeros(0, dtype=np.int64)
        return cls(pairs, owner, number)

    def without_inner_boundaries(self, tb: TokenizedBatch) -> TokenizedBatch:
        """gdp's attention_boundary jsonl over pair units: only a record's last pair ends in the attention boundary
        (type 3); the EOS ending each earlier pair is a completion token (1), as gdp types it, so a pair attends to
        the earlier pairs of its record in its row. A record whose last pair is rejected has no boundary (gdp's
        last article was dropped whole)."""
        sizes = np.bincount(self.owner, minlength=int(self.owner.max(initial=-1)) + 1)
        inner = (self.number < sizes[self.owner])[tb.kept]
        if not inner.any():
            return tb
        per_token = np.repeat(inner, np.diff(tb.offsets))
        types = np.where(per_token & (tb.token_type_ids == TYPE_EOS), TYPE_COMPLETION, tb.token_type_ids)
        return replace(tb, token_type_ids=types.astype(tb.token_type_ids.dtype, copy=False))

    def to_records(self, tb: TokenizedBatch, tally: _GoldTally) -> tuple[TokenizedBatch, np.ndarray, pa.Array]:
        """The pairs' batch as the records': kept pairs name their record (`kept`), a record all of whose pairs are
        rejected is one reject (its first pair's reason); a rejected pair of a kept record is counted by reason
        in `pairs_rejected_by_reason`. Also each kept pair's number and its `record_ids` (null for a record's first
        kept pair, [] for the later ones: gold's accounting counts the record once)."""
        records = self.owner[tb.kept]
        first = np.ones(len(records), dtype=bool)
        first[1:] = records[1:] != records[:-1]
        kept_records = set(records.tolist())
        rejects: list[tuple[int, str, str, int]] = []
        for e, reason, detail, n in tb.rejects:
            record, number = int(self.owner[e]), int(self.number[e])
            if record in kept_records:
                tally.pairs_rejected[reason] += 1
            elif not rejects or rejects[-1][0] != record:
                total = int(np.count_nonzero(self.owner == record))
                rejects.append((record, reason, f"all {total} pairs rejected; pair {number}: {detail}", n))
        lost = [(int(self.owner[e]), n) for e, n in tb.lost or []]
        record_ids = pa.array([None if f else [] for f in first.tolist()], pa.list_(pa.string()))
        mapped = replace(tb, kept=records, rejects=rejects, lost=lost)
        return mapped, self.number[tb.kept], record_ids


def _record_examples(
    spec: DatasetSpec,
    silver_dir: Path,
    pt: PinnedTokenizer,
    chat: ChatTemplate | None,
    ex_sink: ParquetSink,
    rej_sink: ParquetSink,
    batch_size: int,
    tally: _GoldTally,
) -> None:
    """One gold example per silver record (two per preference pair; one per prompt/completion pair under gdp's
    prompt_completion_pair boundary), tokenized and written batch by batch."""
    cols = ["record_id", "drop", "source_file", "source_line", "byte_offset", "split", "content"]
    # closed on the way out, error or not, so their worker threads stop with the step (a traceback kept by the
    # caller would otherwise keep the generators, and a prefetch or an encode, alive)
    with (
        closing(iter_batches(silver_dir / RECORDS, batch_size=batch_size, columns=[*cols, "domain"])) as read,
        closing(tokenize_batches(_units(read, spec), spec, pt, chat)) as stream,
    ):
        progress = Progress(
            f"gold {silver_dir.name}: tokenizing", pq.ParquetFile(silver_dir / RECORDS).metadata.num_rows
        )
        for (batch, pair_units, categories), unit_tb in stream:
            progress.advance(batch.num_rows)
            after_dropped = None
            if spec.packing.close_row_at_dropped:
                splits = batch.column("split").to_pylist()
                unit_splits = splits if pair_units is None else [splits[r] for r in pair_units.owner.tolist()]
                after_dropped = tally.after_dropped(unit_tb, unit_splits)
            if pair_units is not None and spec.packing.attention_boundary == "jsonl":
                unit_tb = pair_units.without_inner_boundaries(unit_tb)
            tb, pair_number, record_ids = (
                pair_units.to_records(unit_tb, tally) if pair_units is not None else (unit_tb, None, None)
            )
            tally.totals["tokens_dropped_by_overflow"] += tb.tokens_dropped
            tally.totals["examples_split_at_turn_boundary"] += tb.split_at_turn_boundary
            record_split = batch.column("split").to_pylist()
            for rec, n in tb.lost or []:
                tally.overflow_by_split[record_split[rec]] += n
            if tb.cut is not None:
                for e in np.flatnonzero(tb.cut).tolist():
                    tally.overflow_by_split[record_split[int(tb.kept[e])]] += int(tb.cut[e])
            if tb.rejects:
                idx = pa.array([r[0] for r in tb.rejects], type=pa.int64())
                rej = batch.select(cols[:-1]).take(idx)
                for r in tb.rejects:
                    tally.reasons[r[1]] += 1
                rej_sink.write(
                    pa.Table.from_batches([rej])
                    .append_column("reason", pa.array([r[1] for r in tb.rejects]))
                    .append_column("detail", pa.array([r[2] for r in tb.rejects]))
                    .append_column("num_tokens", pa.array([r[3] for r in tb.rejects], type=pa.int32()))
                    .append_column("group_key", pa.nulls(len(tb.rejects), pa.string()))
                )
            if len(tb.kept) == 0:
                continue
            lengths = np.diff(tb.offsets)
            n_loss = segment_sums(tb.loss_mask, tb.offsets)
            n_prompt = segment_sums(tb.token_type_ids == TYPE_PROMPT, tb.offsets)
            take = pa.array(tb.kept, type=pa.int64())
            kept = pa.Table.from_batches([batch.select(cols[:-1])]).take(take)
            pair_id = branch = pa.nulls(len(tb.kept), pa.string())
            shared = pa.nulls(len(tb.kept), pa.int32())
            example_id = kept.column("record_id")
            if pair_number is not None:  # `<record_id>/<pair number>`
                example_id = pc.binary_join_element_wise(example_id, pa.array(pair_number.astype(str)), "/")
            if tb.branches is not None and tb.shared_prefix is not None:
                pair_id, branch = example_id, pa.array(tb.branches, pa.string())
                shared = pa.array(tb.shared_prefix.astype(np.int32))
                example_id = pc.binary_join_element_wise(example_id, branch, "/")
            ex_sink.write(
                pa.table(
                    {
                        "example_id": example_id,
                        **{c: kept.column(c) for c in cols[:-1]},
                        "token_ids": list_array(tb.token_ids, tb.offsets, pa.int32()),
                        "loss_mask": list_array(tb.loss_mask, tb.offsets, pa.uint8()),
                        "token_type_ids": list_array(tb.token_type_ids, tb.offsets, pa.uint8()),
                        "num_tokens": pa.array(lengths.astype(np.int32)),
                        "num_loss_tokens": pa.array(n_loss.astype(np.int32)),
                        "num_prompt_tokens": pa.array(n_prompt.astype(np.int32)),
                        "pair_id": pair_id,
                        "branch": branch,
                        "shared_prefix_tokens": shared,
                        "record_ids": (
                            record_ids if record_ids is not None else pa.nulls(len(tb.kept), pa.list_(pa.string()))
                        ),
                        "group_keys": pa.nulls(len(tb.kept), pa.list_(pa.string())),
                        "domain": batch.column("domain").take(take),
                        **({CATEGORY: pa.array(categories[tb.kept])} if categories is not None else {}),
                        **({AFTER_DROPPED: pa.array(after_dropped)} if after_dropped is not None else {}),
                    },
                    schema=ex_sink.schema,
                )
            )
            tally.lengths.append(lengths)
            if spec.input.domain_key is not None:
                tally.count_domains(batch.column("domain").take(take).to_pylist(), lengths, n_loss)
            tally.totals["tokens"] += int(lengths.sum())
            tally.totals["loss_tokens"] += int(n_loss.sum())
            tally.totals["examples_without_trained_tokens"] += int(np.count_nonzero(n_loss == 0))
            tally.totals["prompt_tokens"] += int(n_prompt.sum())


_Key = tuple[pa.RecordBatch, "_PairUnits | None", "np.ndarray | None"]


def _units(read: Iterator[pa.RecordBatch], spec: DatasetSpec) -> Iterator[tuple[_Key, list[dict[str, Any]]]]:
    """Each silver batch with what gold tokenizes of it: its records' contents, or their pairs (`_PairUnits`);
    with `input.categories`, its records' category ids too."""
    for batch in read:
        contents = [loads_json(c) for c in batch.column("content").to_pylist()]
        categories = None
        if spec.input.categories is not None:
            categories = np.array([c.get(CATEGORY, NO_CATEGORY) for c in contents], dtype=np.int32)
        if spec.pair_units:
            units = _PairUnits.of(contents)
            yield (batch, units, categories), units.contents
        else:
            yield (batch, None, categories), contents


@dataclass(frozen=True, kw_only=True)
class GoldStats(LayerStats):
    """A drop's gold (`stats.json`): its examples' token counts, its rejects, and what it was tokenized for."""

    examples: int = figure("dagster/row_count")
    rejects: int = figure("num_rejects")
    rejects_by_reason: dict[str, int] = figure("rejects_by_reason", table="counts")
    tokens: int = figure("num_tokens")
    loss_tokens: int = figure("num_loss_tokens")
    prompt_tokens: int = figure("num_prompt_tokens")
    tokens_dropped_by_overflow: int = figure("num_tokens_dropped_by_overflow")
    tokens_dropped_by_overflow_by_split: dict[str, int] = figure()
    # chat: examples whose ids differ from tokenizer(rendering), cut where a trained turn starts or ends
    examples_split_at_turn_boundary: int | None = figure("num_examples_split_at_turn_boundary", optional=True)
    overflow: str = figure()
    example_length: dict[str, Any] = figure("example_length_tokens", table="percentiles")
    tokenizer_fingerprint: str = figure("tokenizer_fingerprint")
    vocab_size: int = figure()
    max_seq_len: int = figure()
    tabular: dict[str, Any] | None = figure(optional=True)  # tables: how rows were assembled into examples
    # with input.domain_key: per domain (DEFAULT_DOMAIN for records naming none) examples, tokens, loss tokens
    domains: dict[str, dict[str, int]] | None = figure("domains", table="domain_counts", optional=True)
    # packing_boundary prompt_completion_pair: pairs rejected inside records kept for their other pairs
    pairs_rejected_by_reason: dict[str, int] | None = figure("pairs_rejected_by_reason", table="counts", optional=True)
    # sequence.keep_prompt_only_sequences (gdp's flag): examples kept although no token of theirs is trained
    examples_without_trained_tokens: int | None = figure("num_examples_without_trained_tokens", optional=True)


def build(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH) -> GoldStats:
    """A drop's gold, from its silver, with the dataset's pinned tokenizer."""
    silver, out = paths.partition_dir("silver", partition), paths.partition_dir("gold", partition)
    return build_tokenized_examples(spec, silver, paths.tokenizer_dir, out, batch_size=batch_size)


def build_tokenized_examples(
    spec: DatasetSpec, silver_dir: Path, tokenizer_dir: Path, out_dir: Path, *, batch_size: int = DEFAULT_BATCH
) -> GoldStats:
    """Gold: one example per record (a preference pair: two) with token ids, loss mask and token types
    (docs/shards.md); for tables, examples assembled from rows (`tabular_gold`)."""
    require_input(silver_dir / RECORDS, SILVER_SCHEMA, remedy="rematerialize silver (clean_records)")
    pt = load_pinned(tokenizer_dir)
    tally = _GoldTally()
    with closing(pt), staged_dir(out_dir) as stage:
        comp = spec.output.compression
        with (
            ParquetSink(
                stage / EXAMPLES,
                gold_schema(spec.input.categories is not None, spec.packing.close_row_at_dropped),
                compression=comp,
                row_group_size=4096,
            ) as ex_sink,
            ParquetSink(stage / REJECTS, GOLD_REJECT_SCHEMA, compression=comp) as rej_sink,
        ):
            tabular: dict[str, Any] | None = None
            if shape_of(spec) == "rows":
                tab = build_tabular_examples(spec, silver_dir / RECORDS, pt, ex_sink, rej_sink)
                tally.lengths.append(tab["lengths"])
                tally.totals.update({k: tab[k] for k in ("tokens", "loss_tokens", "prompt_tokens")})
                tally.reasons.update(tab["rejects_by_reason"])
                tabular = tab["tabular"]
            else:
                chat = ChatTemplate(pt) if shape_of(spec) in ("messages", "pair") else None
                with gc_paused():
                    _record_examples(spec, silver_dir, pt, chat, ex_sink, rej_sink, batch_size, tally)
        lengths_cat = np.concatenate(tally.lengths) if tally.lengths else np.zeros(0, dtype=np.int64)
        totals = tally.totals
        stats = GoldStats(
            examples=ex_sink.rows,
            rejects=rej_sink.rows,
            rejects_by_reason=dict(sorted(tally.reasons.items())),
            tokens=totals["tokens"],
            loss_tokens=totals["loss_tokens"],
            prompt_tokens=totals["prompt_tokens"],
            tokens_dropped_by_overflow=totals["tokens_dropped_by_overflow"],
            tokens_dropped_by_overflow_by_split={s: tally.overflow_by_split[s] for s in SPLITS},
            examples_split_at_turn_boundary=(
                totals["examples_split_at_turn_boundary"] if shape_of(spec) in ("messages", "pair") else None
            ),
            overflow=spec.gold_overflow,
            example_length=percentiles(lengths_cat),
            tokenizer_fingerprint=pt.info.fingerprint,
            vocab_size=pt.info.vocab_size,
            max_seq_len=spec.sequence.max_seq_len,
            tabular=tabular,
            domains=(
                {d: dict(c) for d, c in sorted(tally.by_domain.items())} if spec.input.domain_key is not None else None
            ),
            pairs_rejected_by_reason=dict(sorted(tally.pairs_rejected.items())) if spec.pair_units else None,
            examples_without_trained_tokens=(
                totals["examples_without_trained_tokens"] if spec.sequence.keep_prompt_only_sequences else None
            ),
        )
        write_json_atomic(stage / STATS, stats.as_json())
    return stats
