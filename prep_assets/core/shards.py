"""Packed shards: gold examples planned into fixed-length rows, written in chunks, with exports and metrics."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prep_assets.core.arrays import flat_values, offsets_from_lengths, percentiles, segment_sums
from prep_assets.core.errors import DropError
from prep_assets.core.formats import (
    FORMATS,
    PARQUET,
    DocumentFormat,
    Documents,
    PartitionTarget,
    RowFormat,
    SplitTarget,
)
from prep_assets.core.gold import GoldStats
from prep_assets.core.invariants.common import require_input
from prep_assets.core.lake import (
    EXAMPLES,
    RECORDS,
    STATS,
    DatasetPaths,
    partition_lock,
    read_json,
    staged_dir,
    withdraw_manifest,
    write_json_atomic,
)
from prep_assets.core.packing import RowPlan, drop_rows_without, plan_rows, unit_offsets
from prep_assets.core.parquet_io import DEFAULT_BATCH, iter_batches
from prep_assets.core.progress import Progress, note
from prep_assets.core.record_types import record_type
from prep_assets.core.records import (
    AFTER_DROPPED,
    CATEGORY,
    DEFAULT_DOMAIN,
    SPLITS,
    TYPE_COMPLETION,
    gold_schema,
)
from prep_assets.core.rows import GridMemory, RowCounts, rows_from_values, segment_sources
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spill import TOKEN, TokenSpill
from prep_assets.core.stats import LayerStats, figure
from prep_assets.core.tokenizer import load_pinned_info


@dataclass(frozen=True)
class GoldArrays:
    """Gold examples as flat arrays with offsets (the columnar form packing and the exports work on)."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    token_type_ids: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, table: pa.Table) -> GoldArrays:
        ids, offsets = flat_values(table.column("token_ids"), np.int32)
        mask, _ = flat_values(table.column("loss_mask"), np.uint8)
        types, _ = flat_values(table.column("token_type_ids"), np.uint8)
        return cls(ids, mask, types, offsets)


def plan_split(
    spec: DatasetSpec,
    pair_ids: list[str | None],
    offsets: np.ndarray,
    loss_mask: Any,
    seed: tuple[int, ...] | None,
    example_loss: np.ndarray | None = None,
    domains: Sequence[str | None] | None = None,
    after_dropped: np.ndarray | None = None,
) -> RowPlan:
    """The row plan of one split's gold examples (`pair_ids` in gold order keep preference pairs together);
    `loss_mask` is the split's flat mask, or anything that slices into it (`FrontToBack`); `example_loss` the
    examples' loss token counts, where known. With `input.domain_key`, each domain (`domains`: per example) is
    packed apart, in sorted order, so a row is domain-pure and a domain's rows are contiguous (a mix can take them
    as row ranges). `after_dropped` (gold's marks, packing.close_row_at_dropped) closes greedy's open row."""
    groups = None
    if spec.input.domain_key is not None and domains is not None:
        groups = domain_groups(domains)[1]
    return plan_rows(
        np.diff(offsets),
        capacity=spec.sequence.max_seq_len,
        strategy=spec.packing.strategy,
        overflow=spec.sequence.overflow,
        overlap=spec.sequence.overlap,
        loss_mask=loss_mask,
        example_loss=example_loss,
        units=unit_offsets(pair_ids) if record_type(spec.input.type).paired else None,
        max_per_bin=spec.max_per_example,
        shuffle_seed=seed,
        groups=groups,
        closes=after_dropped if spec.packing.strategy == "greedy" and spec.sequence.overflow == "drop" else None,
    )


def drops_prompt_only_rows(spec: DatasetSpec) -> bool:
    """Whether `full` rows holding no completion token are left out (gdp's removal of prompt-only sequences, for
    `sequence.keep_prompt_only_sequences: false`). Other strategies place whole examples or windows that keep a
    loss token: a row of them always holds one, since gold rejects an example without a trained token."""
    return spec.packing.strategy == "full" and not spec.sequence.keep_prompt_only_sequences


def domain_groups(domains: Sequence[str | None]) -> tuple[list[str], np.ndarray]:
    """The sorted domain names (`DEFAULT_DOMAIN` for none) and each example's index among them."""
    named = [d if d is not None else DEFAULT_DOMAIN for d in domains]
    names = sorted(set(named))
    index = {d: i for i, d in enumerate(names)}
    return names, np.fromiter((index[d] for d in named), dtype=np.int64, count=len(named))


TABULAR_MANIFEST_KEYS = (
    "mode",
    "columns",
    "schema_prompt",
    "bos_id",
    "eos_id",
    "order_by",
    "order_by_type",
    "initial_prefill",
)


SHARD_CHUNK_ROWS = 1024  # rows materialized at once: bounds memory; the bytes never depend on it
_SPILL = "_gold_spill"


@dataclass
class _SplitGold:
    """One split of gold, spilled to a flat file in the staging dir (memory stays bounded): planning reads it
    mapped front to back, rows read their pieces from it."""

    spill: TokenSpill
    offsets: np.ndarray
    example_ids: pa.Array
    pair_ids: list[str | None]
    loss: np.ndarray  # loss tokens per example (summed as it was spilled)
    domains: list[str | None]
    categories: list[int] | None = None  # gdp's category id per example (`input.categories`)
    after_dropped: np.ndarray | None = None  # per example: gold dropped one before it (packing.close_row_at_dropped)

    def id_chunks(self, tokens: int = 1 << 22) -> Iterator[np.ndarray]:
        """The token ids front to back, a chunk at a time (the pages of the one before dropped)."""
        ids = self.spill.front_to_back("id")
        for lo in range(0, len(ids), tokens):
            yield ids[lo : lo + tokens]
        self.spill.release()

    def documents(self) -> Documents:
        starts, lengths = self.offsets[:-1], np.diff(self.offsets)
        return Documents(
            self.offsets,
            self.example_ids,
            self.domains,
            self.id_chunks,
            lambda idx: self.spill.read(starts[idx], lengths[idx]),
        )


def _spill_gold(gold_path: Path, spill: Path, batch_size: int) -> dict[str, _SplitGold]:
    """Stream gold once: per split, its tokens appended to a spill file, its example ids kept."""
    spill.mkdir()
    out: dict[str, dict[str, Any]] = {
        s: {
            "spill": TokenSpill(spill / f"{s}.tokens"),
            **{k: [] for k in ("lengths", "loss", "ids", "pairs", "domains", "categories", "after_dropped")},
        }
        for s in SPLITS
    }
    try:
        cols = ["example_id", "split", "token_ids", "loss_mask", "token_type_ids", "pair_id", "domain"]
        categorized = CATEGORY in pq.read_schema(gold_path).names
        cols += [CATEGORY] if categorized else []
        marked = AFTER_DROPPED in pq.read_schema(gold_path).names
        cols += [AFTER_DROPPED] if marked else []
        for batch in iter_batches(gold_path, batch_size=batch_size, columns=cols):
            splits = batch.column("split")
            for split in SPLITS:
                rows = pc.equal(splits, split)
                n = pc.sum(rows).as_py() or 0
                if n == 0:
                    continue
                sub = batch if n == batch.num_rows else batch.filter(rows)  # a batch of one split is not copied
                acc = out[split]
                ids, offsets = flat_values(sub.column("token_ids"), np.int32)
                mask, _ = flat_values(sub.column("loss_mask"), np.uint8)
                types, _ = flat_values(sub.column("token_type_ids"), np.uint8)
                acc["spill"].append(ids, mask, types)
                acc["lengths"].append(np.diff(offsets))
                acc["loss"].append(segment_sums(mask, offsets))
                acc["ids"].append(sub.column("example_id"))
                acc["pairs"] += sub.column("pair_id").to_pylist()
                acc["domains"] += sub.column("domain").to_pylist()
                acc["categories"] += sub.column(CATEGORY).to_pylist() if categorized else []
                acc["after_dropped"] += sub.column(AFTER_DROPPED).to_pylist() if marked else []
        result = {}
        for split, acc in out.items():
            acc["spill"].seal()
            lengths = np.concatenate(acc["lengths"]) if acc["lengths"] else np.zeros(0, dtype=np.int64)
            loss = np.concatenate(acc["loss"]) if acc["loss"] else np.zeros(0, dtype=np.int64)
            ids = pa.concat_arrays(acc["ids"]) if acc["ids"] else pa.array([], pa.string())
            offsets = offsets_from_lengths(lengths)
            categories = acc["categories"] if categorized else None
            after = np.array(acc["after_dropped"], dtype=bool) if marked else None
            result[split] = _SplitGold(
                acc["spill"], offsets, ids, acc["pairs"], loss, acc["domains"], categories, after
            )
        return result
    except BaseException:
        for acc in out.values():
            acc["spill"].close()
        raise


@dataclass(frozen=True, kw_only=True)
class ShardStats(LayerStats):
    """A drop's shards (`stats.json`): per split its metrics, files and exports; the partition's totals."""

    tokenizer_fingerprint: str = figure("tokenizer_fingerprint")
    max_seq_len: int = figure()
    strategy: str = figure()
    overflow: str = figure()
    overlap: int = figure()
    splits: dict[str, Any] = figure()  # per split: `split_metrics`, max_batch_size, files, exports
    totals: dict[str, Any] = figure()  # `totals` of the splits
    tabular: dict[str, Any] | None = figure(optional=True)
    domains: dict[str, dict[str, int]] | None = figure(optional=True)  # gold's, for the manifest
    exports: dict[str, Any] | None = figure(optional=True)  # partition-level entries of formats (`finish`)


def build_packed_shards(
    spec: DatasetSpec,
    gold_dir: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    *,
    batch_size: int = DEFAULT_BATCH,
    silver_records: Path | None = None,
    before_publish: Callable[[dict[str, Any]], AbstractContextManager[object]] | None = None,
) -> ShardStats:
    """Shards: fixed-length packed rows per split, in Parquet files of at most max_tokens_per_shard tokens,
    plus the optional memmap and Megatron exports. Streams: gold is read once in batches and spilled per split
    to flat files (mapped back), rows are planned from the lengths and materialized SHARD_CHUNK_ROWS at a time.
    `before_publish` gets the new files' checksums just before they replace the old (`staged_dir`)."""
    schema = gold_schema(spec.input.categories is not None, spec.packing.close_row_at_dropped)
    require_input(gold_dir / EXAMPLES, schema, remedy="rematerialize gold (tokenized_examples)")
    info = load_pinned_info(tokenizer_dir)  # ids and fingerprint only: packing never encodes
    gold = GoldStats.from_json(read_json(gold_dir / STATS))
    if gold.tokenizer_fingerprint != info.fingerprint:
        raise DropError(
            "gold was tokenized with another tokenizer than the pinned one "
            f"({gold.tokenizer_fingerprint[:12]} != {info.fingerprint[:12]}); rematerialize gold"
        )
    if gold.overflow != spec.gold_overflow:
        raise DropError(
            f"gold was built for overflow {gold.overflow!r}, the spec now needs "
            f"{spec.gold_overflow!r}; rematerialize gold"
        )
    L = spec.sequence.max_seq_len
    rows_per_shard = max(1, spec.output.max_tokens_per_shard // L)
    split_stats: dict[str, Any] = {}
    named = [FORMATS[name] for name in spec.output.formats]
    with staged_dir(out_dir, before_publish) as stage:
        spilled = _spill_gold(gold_dir / EXAMPLES, stage / _SPILL, batch_size)
        try:
            for split_no, split in enumerate(SPLITS):
                sg = spilled[split]
                seed = (spec.packing.seed, split_no) if spec.shuffles_rows else None
                plan = plan_split(
                    spec,
                    sg.pair_ids,
                    sg.offsets,
                    sg.spill.front_to_back("mask"),
                    seed,
                    sg.loss,
                    sg.domains,
                    sg.after_dropped,
                )
                sg.spill.release()
                if drops_prompt_only_rows(spec):
                    completion = sg.spill.front_to_back("type", equals=TYPE_COMPLETION)
                    plan = drop_rows_without(plan, np.diff(sg.offsets), completion)
                    sg.spill.release()
                examples = len(sg.offsets) - 1
                if plan.num_rows or examples:
                    (stage / split).mkdir()
                target = SplitTarget(
                    stage / split,
                    split,
                    L,
                    info.vocab_size,
                    spec.output.compression,
                    rows_per_shard,
                    max_tokens_per_file=spec.output.max_tokens_per_shard,
                    overlap=spec.sequence.overlap,
                    eos_id=info.eos_id,
                    partition=out_dir.name,
                    spec=spec,
                    domains=sg.domains,
                    categories=sg.categories,
                )
                sinks = {
                    f.name: f.open(target)
                    for f in named
                    if isinstance(f, RowFormat) and (f is PARQUET or plan.num_rows)
                }
                counts = RowCounts()
                progress = Progress(f"shards {out_dir.name}: writing {split}", plan.num_rows)
                chunks = list(_chunks(plan.num_rows, rows_per_shard))
                # one buffer for every chunk's tokens, faulted in once (rows copy them out before the next read)
                ends = offsets_from_lengths(plan.length)[plan.row_offsets]
                buffer = np.empty(max((int(ends[hi] - ends[lo]) for lo, hi in chunks), default=0), dtype=TOKEN)
                grids = GridMemory()  # a chunk's grids reuse those the writer is done with
                try:
                    for c_lo, c_hi in chunks:
                        part = plan.rows(c_lo, c_hi)
                        values = sg.spill.records(segment_sources(part, sg.offsets), part.length, buffer)
                        rows = rows_from_values(
                            part,
                            values["id"],
                            values["mask"],
                            values["type"],
                            row_len=L,
                            pad_id=info.pad_id,
                            grids=grids,
                        )
                        del values
                        example_ids = sg.example_ids.take(pa.array(part.example, type=pa.int64()))
                        for sink in sinks.values():
                            sink.append(rows, example_ids)
                        counts.add(rows)
                        del rows
                        progress.advance(c_hi - c_lo)
                except BaseException:
                    for sink in sinks.values():  # their files and threads closed; the staging dir goes anyway
                        with contextlib.suppress(Exception):
                            sink.close()
                    raise
                del buffer
                grids.release()
                files = sinks.pop(PARQUET.name).close()["files"]
                exports: dict[str, Any] = {name: sink.close() for name, sink in sinks.items()}
                for f in named:
                    if isinstance(f, DocumentFormat) and examples:
                        exports[f.name] = f.write(target, sg.documents())
                overflow = gold.tokens_dropped_by_overflow_by_split.get(split, 0)
                split_stats[split] = {
                    **split_metrics(sg.offsets, plan, counts, L, overflow),
                    "max_batch_size": min((f["sequences"] for f in files), default=0),
                    "files": files,
                    "exports": exports,
                }
        finally:
            for sg in spilled.values():
                sg.spill.close()
        shutil.rmtree(stage / _SPILL)
        whole = PartitionTarget(stage, spec, tokenizer_dir, L, info.vocab_size, silver_records)
        finished: dict[str, Any] = {}
        for f in named:  # formats' partition-level steps, given the entries their sinks returned per split
            if isinstance(f, RowFormat) and f.finish is not None:
                entries = {s: m["exports"][f.name] for s, m in split_stats.items() if f.name in m["exports"]}
                finished[f.name] = f.finish(whole, entries)
        stats = ShardStats(
            tokenizer_fingerprint=info.fingerprint,
            max_seq_len=L,
            strategy=spec.packing.strategy,
            overflow=spec.sequence.overflow,
            overlap=spec.sequence.overlap,
            splits=split_stats,
            totals=totals(split_stats.values(), L),
            # what a generator needs beside the shards (the manifest collects it)
            tabular={k: gold.tabular[k] for k in TABULAR_MANIFEST_KEYS} if gold.tabular is not None else None,
            domains=gold.domains,
            exports=finished or None,
        )
        write_json_atomic(stage / STATS, stats.as_json())
    return stats


def build(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH) -> ShardStats:
    """A drop's packed shards and exports, from its gold. A published manifest naming the drop's files is removed
    before new bytes replace them (`withdraw_manifest`); the manifest job publishes the next one."""
    gold, out = paths.partition_dir("gold", partition), paths.partition_dir("shards", partition)
    silver = paths.partition_dir("silver", partition) / RECORDS
    folder = out.relative_to(paths.root).as_posix()
    return build_packed_shards(
        spec,
        gold,
        paths.tokenizer_dir,
        out,
        batch_size=batch_size,
        silver_records=silver,
        before_publish=lambda sums: _manifest_withdrawn(paths, folder, sums),
    )


@contextmanager
def _manifest_withdrawn(paths: DatasetPaths, folder: str, sums: dict[str, Any]) -> Iterator[None]:
    """The manifest's lock held while it is withdrawn and the shards replace what it named: a manifest job
    checking the old files cannot publish them after the new bytes land (it takes the same lock)."""
    with partition_lock(paths.manifest_path):
        if withdraw_manifest(paths.manifest_path, folder, sums):
            note(
                f"{paths.manifest_path} withdrawn: it named {folder}'s previous files, which these shards replace; "
                "the manifest job publishes the next one"
            )
        yield


def _chunks(num_rows: int, rows_per_file: int) -> Iterator[tuple[int, int]]:
    """Row ranges of at most SHARD_CHUNK_ROWS rows that never straddle a file boundary of `rows_per_file`."""
    for lo in range(0, num_rows, rows_per_file):
        hi = min(lo + rows_per_file, num_rows)
        for c_lo in range(lo, hi, SHARD_CHUNK_ROWS):
            yield c_lo, min(c_lo + SHARD_CHUNK_ROWS, hi)


def _ratio(a: int, b: int, empty: float) -> float:
    return round(a / b, 6) if b else empty


@dataclass(frozen=True)
class Metrics:
    """The shard metrics of a split, a partition or a dataset (docs/shards.md): counts, summed across splits and
    drops, and the utilizations derived from them. The one list of metric names (stats, metadata, manifest)."""

    examples: int = 0  # gold examples packed
    examples_split: int = 0  # examples in more than one segment (windows, `full` cuts)
    sequences: int = 0  # rows
    segments: int = 0
    input_tokens: int = 0  # gold tokens plus what overflow cut or dropped in gold
    gold_tokens: int = 0
    output_tokens: int = 0  # tokens in rows, not counting padding
    loss_tokens: int = 0
    prompt_tokens: int = 0
    padding_tokens: int = 0
    tokens_dropped_by_overflow: int = 0
    tokens_dropped_by_packing: int = 0
    windows_dropped: int = 0  # windows without a loss token
    rows_dropped: int = 0  # rows of `full` without a completion token (sequence.keep_prompt_only_sequences false)
    overlap_tokens: int = 0  # tokens a window repeats from the one before

    @classmethod
    def summed(cls, parts: Iterable[dict[str, Any]]) -> Metrics:
        parts = list(parts)
        return cls(**{name: sum(p.get(name, 0) for p in parts) for name in COUNTS})

    def with_utilizations(self, row_len: int) -> dict[str, Any]:
        capacity = self.sequences * row_len
        return {
            **asdict(self),
            "data_utilization": _ratio(self.output_tokens - self.overlap_tokens, self.input_tokens, 1.0),
            "sequence_utilization": _ratio(self.output_tokens, capacity, 0.0),
            "loss_token_utilization": _ratio(self.loss_tokens, capacity, 0.0),
        }


COUNTS = tuple(f.name for f in fields(Metrics))
UTILIZATIONS = ("data_utilization", "sequence_utilization", "loss_token_utilization")

# What each shard metric means: the one source of docs/shards.md's table and the `metrics` entry in the UI
METRIC_DEFINITIONS = {
    "examples": "gold examples packed",
    "examples_split": "examples in more than one segment (windows, `full` cuts)",
    "sequences": "rows, each of exactly L = `sequence.max_seq_len` tokens",
    "segments": "example pieces in rows (a row holds one or more)",
    "windows_dropped": "windows without a loss token, left out",
    "rows_dropped": "rows of `full` holding no completion token (only prompt), left out unless "
    "`sequence.keep_prompt_only_sequences`",
    "input_tokens": "gold tokens + tokens lost to overflow in gold",
    "gold_tokens": "tokens of the gold examples",
    "output_tokens": "non-padding tokens in rows",
    "loss_tokens": "tokens trained on (loss mask 1)",
    "prompt_tokens": "prompt tokens in rows (masked)",
    "padding_tokens": "pad tokens filling rows (mask 0, segment 0)",
    "tokens_dropped_by_overflow": "tokens gold's `sequence.overflow` cut or dropped",
    "tokens_dropped_by_packing": "tokens of windows with no loss token, and of dropped rows",
    "overlap_tokens": "tokens a window repeats from the one before",
    "data_utilization": "(output − overlap) / input: the share of the input that reaches rows",
    "sequence_utilization": "output / (rows × L): how full rows are",
    "loss_token_utilization": "loss / (rows × L): the share of row positions trained on",
    "max_batch_size": "rows in the smallest Parquet file: the largest batch every file can serve whole",
}
# The per-split metrics as tables narrow enough to read (each ≤ 8 columns with the split)
SPLIT_TABLES = {
    "splits_counts": ("sequences", "examples", "examples_split", "segments", "windows_dropped", "rows_dropped"),
    "splits_tokens": (
        *("input_tokens", "gold_tokens", "output_tokens"),
        *("loss_tokens", "prompt_tokens", "padding_tokens"),
    ),
    "splits_tokens_lost": ("tokens_dropped_by_overflow", "tokens_dropped_by_packing", "overlap_tokens"),
    "splits_utilization": (*UTILIZATIONS, "max_batch_size"),
}


def metrics_markdown() -> str:
    """The shard metrics and their meaning as a markdown table."""
    lines = ["| metric | meaning |", "|---|---|"]
    return "\n".join(lines + [f"| `{k}` | {v} |" for k, v in METRIC_DEFINITIONS.items()])


def split_metrics(
    gold_offsets: np.ndarray, plan: RowPlan, counts: RowCounts, row_len: int, dropped_by_overflow: int
) -> dict[str, Any]:
    """The shard metrics of one split (docs/shards.md), with its length distributions."""
    capacity = plan.num_rows * row_len
    examples = len(gold_offsets) - 1
    gold_tokens = int(gold_offsets[-1])
    pieces = np.bincount(plan.example, minlength=examples)
    metrics = Metrics(
        examples=examples,
        examples_split=int(np.count_nonzero(pieces > 1)),
        sequences=plan.num_rows,
        segments=int(len(plan.example)),
        input_tokens=gold_tokens + dropped_by_overflow,
        gold_tokens=gold_tokens,
        output_tokens=counts.output,
        loss_tokens=counts.loss,
        prompt_tokens=counts.prompt,
        padding_tokens=capacity - counts.output,
        tokens_dropped_by_overflow=dropped_by_overflow,
        tokens_dropped_by_packing=plan.dropped_tokens,
        windows_dropped=plan.dropped_pieces,
        rows_dropped=plan.dropped_rows,
        overlap_tokens=plan.overlap_tokens,
    )
    distributions = {
        "segment_length": percentiles(plan.length),
        "segments_per_row": percentiles(np.diff(plan.row_offsets)),
    }
    return {**metrics.with_utilizations(row_len), "distributions": distributions}


def totals(splits: Iterable[dict[str, Any]], row_len: int) -> dict[str, Any]:
    """Partition (or dataset) totals of split metrics; ratios recomputed, max_batch_size the smallest file's rows."""
    splits = list(splits)
    sizes = [f["sequences"] for s in splits for f in s.get("files", [])]
    return {**Metrics.summed(splits).with_utilizations(row_len), "max_batch_size": min(sizes, default=0)}


# ---------------------------------------------------------------- manifest
