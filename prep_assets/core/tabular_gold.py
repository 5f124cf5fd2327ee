"""Gold for tabular datasets: rows rendered as JSON lines, tokenized in one batch, assembled into examples.

Each example: [tokenizer BOS if it adds one] + schema prompt (masked, type prompt) + units of
BOS + record lines + EOS (trained; BOS and records type completion, EOS type end-of-record). Records are
encoded as continuations (each line as it reads after the text before it), so an example's tokens are the
concatenation of its pieces and decode back to the rows.

Assembly needs a drop's records at once (groups are ordered and budgets drawn over them), so this reads the
silver partition whole: one drop of a table, not a corpus. A record, or in grouped mode a group, that cannot
fit `max_seq_len` with the schema prompt is not assembled: it becomes a gold reject (`record_over_budget`,
`group_over_budget`) and the blocking budget gate fails before any shard is written. With `order_by`, the
column is typed over the whole drop here (`tabular.order_keys`); a record whose value is empty or outside that
type is a gold reject (`unorderable_value`), never placed at a guessed position.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.arrays import list_array, offsets_from_lengths, percentiles, segment_sums
from prep_assets.core.errors import TokenizerError
from prep_assets.core.parquet_io import ParquetSink
from prep_assets.core.records import GOLD_REJECT_SCHEMA, GOLD_SCHEMA, SPLITS, TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import TabularSpec
from prep_assets.core.tabular import (
    PSEUDO_GROUP,
    UNORDERABLE_VALUE,
    Example,
    OrderKeys,
    elapsed_column_name,
    elapsed_seconds,
    fill_flat,
    fill_grouped,
    group_label,
    group_passes,
    group_records,
    initial_prefill,
    key_columns_first,
    order_keys,
    pandas_float_columns,
    pandas_group_key,
    plan_flat,
    plan_grouped,
    plan_sequential,
    render_values,
    safe_synthesizer_prefill,
    safe_synthesizer_prompt,
    sample_passes,
    schema_prompt,
    sequence_passes,
)
from prep_assets.core.tabular_holdout import holdout_size, split_groups, split_records
from prep_assets.core.time_series_checks import TimeSeriesFacts, validate_time_series
from prep_assets.core.tokenizer import PinnedTokenizer

RECORD_OVER_BUDGET, GROUP_OVER_BUDGET = "record_over_budget", "group_over_budget"
BUDGET_REASONS = (RECORD_OVER_BUDGET, GROUP_OVER_BUDGET)
_PROVENANCE = ["record_id", "drop", "source_file", "source_line", "byte_offset"]


def unit_token_ids(tab: TabularSpec, pt: PinnedTokenizer) -> tuple[int, int]:
    """The (BOS, EOS) ids wrapping each unit: the spec's tokens, else the tokenizer's BOS (its EOS if it has
    none) and EOS."""
    vocab = pt.hf.get_vocab()

    def resolve(name: str, token: str | None, default: int) -> int:
        if token is None:
            return default
        if token not in vocab:
            raise TokenizerError(
                f"tabular.{name} {token!r} is not a token of the pinned tokenizer; name one "
                "token of its vocabulary (e.g. a special token)"
            )
        return int(vocab[token])

    bos_default = pt.info.bos_id if pt.info.bos_id is not None else pt.info.eos_id
    return resolve("bos_token", tab.bos_token, bos_default), resolve("eos_token", tab.eos_token, pt.info.eos_id)


@dataclass(frozen=True)
class _Rows:
    """One drop's silver rows, rendered and tokenized."""

    table: pa.Table  # provenance + split, silver order
    columns: list[str]
    lines: list[str]  # rendered records without their newline
    ids: list[list[int]]  # tokens of each record line (newline included)
    lengths: list[int]
    keys: list[str] | None  # group key per record (`group_label`)
    order: OrderKeys | None  # order_by typed over the drop: a sort key per record, None where unorderable
    order_by: str | None  # the order column: the spec's order_by, or the generated elapsed_seconds column
    time_series: TimeSeriesFacts | None = None  # validate_time_series: what SS's validation settled
    train_order: list[int] | None = None  # tabular.holdout: the training records in SS's order


def _load(spec: DatasetSpec, tab: TabularSpec, silver_records: Path, pt: PinnedTokenizer) -> _Rows:
    table = pq.read_table(str(silver_records), columns=[*_PROVENANCE, "split", "content"])
    contents = [json.loads(c) for c in table.column("content").to_pylist()]
    # no record (a header-only file, every row a reject or a duplicate): the spec's named columns, so the code below
    # that looks them up finds them; no record uses them
    named = [c for c in (tab.group_by, tab.order_by) if c is not None]
    columns = contents[0]["columns"] if contents else list(dict.fromkeys(named))
    for c in contents:
        if c["columns"] != columns:  # one drop has one schema (bronze keeps it); guard the assumption
            raise ValueError(f"records of one drop with different columns: {c['columns']} != {columns}")
    values = [c["values"] for c in contents]
    table, train_order = _hold_out(spec, tab, table, columns, values)
    sequential = tab.resolved_mode == "sequential"
    keys = None
    if tab.group_by is not None:
        gi = columns.index(tab.group_by)
        keys = [group_label(v[gi]) for v in values]
    elif sequential:  # an ungrouped time series: one group, never rendered (SS's pseudo-group)
        keys = [group_label(PSEUDO_GROUP)] * len(values)
    order_by = tab.order_by
    if tab.generates_timestamps:  # SS: a first column counting each group's records (silver keeps input order)
        assert keys is not None and tab.timestamp_interval_seconds is not None
        order_by = elapsed_column_name(columns)
        stamps = elapsed_seconds(keys, tab.timestamp_interval_seconds)
        columns = [order_by, *columns]
        values = [[t, *v] for t, v in zip(stamps, values, strict=True)]
    facts = None
    if tab.validate_time_series:  # SS's validation, on the drop as read (its generated column included)
        assert order_by is not None
        gi = columns.index(tab.group_by) if tab.group_by is not None else None
        facts = validate_time_series(
            columns,
            values,
            None if gi is None or keys is None else [(pandas_group_key(v[gi]), k) for v, k in zip(values, keys)],
            order_by,
            tab.timestamp_format if tab.order_by is not None else "elapsed_seconds",
            tab.timestamp_interval_seconds if tab.order_by is not None else None,
        )
    if tab.key_columns_first and sequential:
        ordered = key_columns_first(columns, tab.group_by, order_by)
        values = [[v[columns.index(c)] for c in ordered] for v in values]
        columns = ordered
    if tab.missing_ints_as_floats:
        floats = pandas_float_columns(values)
        values = [[float(x) if c in floats and x is not None else x for c, x in enumerate(v)] for v in values]
    lines = [render_values(columns, v, tab.float_digits) for v in values]
    standalone = tab.record_encoding == "standalone"  # SS tokenizes each record line on its own
    ids = pt.encode_batch([line + "\n" for line in lines], continuation=not standalone)
    order = None
    if order_by is not None:
        oi = columns.index(order_by)
        order = order_keys([v[oi] for v in values], order_by)
    table = table.drop_columns(["content"])
    return _Rows(table, columns, lines, ids, [len(x) for x in ids], keys, order, order_by, facts, train_order)


def _hold_out(
    spec: DatasetSpec, tab: TabularSpec, table: pa.Table, columns: list[str], values: list[list[Any]]
) -> tuple[pa.Table, list[int] | None]:
    """`tabular.holdout`: the drop's test records drawn as Safe Synthesizer draws them (the rest train, in SS's
    order); silver leaves every record in train under it."""
    size = holdout_size(len(values), tab.holdout, tab.max_holdout)
    if size is None:
        return table, None
    if tab.group_by is not None:
        gi = columns.index(tab.group_by)
        split = split_groups([v[gi] for v in values], size, spec.split.seed)
    else:
        split = split_records(len(values), size, spec.split.seed)
    held = set(split.test)
    names = pa.array(["test" if i in held else "train" for i in range(len(values))], pa.string())
    return table.set_column(table.schema.get_field_index("split"), "split", names), split.train


@dataclass
class _Assembled:
    examples: list[tuple[str, Example]]  # (split, example)
    rejects: list[tuple[int, str, str, int, str | None]]  # (record, reason, detail, tokens, group label)
    prefill: dict[str, list[str]]
    examples_per_group: Counter[str]
    group_tokens: list[int]
    ss_prefill: dict[str, str] = field(default_factory=dict)  # assembly safe_synthesizer: one string per group


def _assemble(spec: DatasetSpec, tab: TabularSpec, rows: _Rows, prompt_tokens: int) -> _Assembled:
    L = spec.sequence.max_seq_len
    budget = L - prompt_tokens  # what records and their BOS/EOS pairs may use
    max_per = spec.max_per_example
    assert max_per is not None  # tables resolve unset/auto to 10
    mode = tab.resolved_mode
    out = _Assembled([], [], {}, Counter(), [])
    splits = rows.table.column("split").to_pylist()
    ss_rng = np.random.default_rng(spec.packing.seed)  # SS: one generator for the train, then the other splits
    for split_no, split in enumerate(SPLITS):
        idx = [i for i, s in enumerate(splits) if s == split]
        if split == "train" and rows.train_order is not None:
            idx = rows.train_order  # SS's training table: the records in its holdout's order
        if not idx:
            continue
        if rows.order is not None:  # no place in its group's order: out before groups and budgets are counted
            assert rows.keys is not None  # order_by comes with groups (sequential: at least the pseudo-group)
            problems = rows.order.problems
            out.rejects += [
                (i, UNORDERABLE_VALUE, problems[i], rows.lengths[i], rows.keys[i]) for i in idx if i in problems
            ]
            idx = [i for i in idx if i not in problems]
        fits = []
        for i in idx:
            need = prompt_tokens + 2 + rows.lengths[i]
            if need > L and mode != "grouped":  # grouped: the record's whole group is left out (below)
                label = rows.keys[i] if rows.keys is not None else None
                out.rejects.append(
                    (
                        i,
                        RECORD_OVER_BUDGET,
                        f"this record alone needs {need} tokens (schema prompt "
                        f"{prompt_tokens} + record {rows.lengths[i]} + BOS/EOS 2) > max_seq_len {L}",
                        need,
                        label,
                    )
                )
            else:
                fits.append(i)
        seed = (spec.packing.seed, split_no)
        if tab.assembly == "safe_synthesizer":
            _assemble_ss(spec, tab, rows, fits, idx, split, ss_rng, budget, out, prompt_tokens)
            continue
        if mode == "flat":
            plan = plan_flat([rows.lengths[i] for i in fits], budget, max_per, seed)
            out.examples += [(split, Example([[fits[k] for k in u] for u in ex.units], ex.budget)) for ex in plan]
            continue
        assert rows.keys is not None
        local = group_records([rows.keys[i] for i in idx], [rows.order.keys[i] for i in idx] if rows.order else None)
        groups = [[idx[k] for k in g] for g in local]
        out.group_tokens += [prompt_tokens + 2 + sum(rows.lengths[i] for i in g) for g in groups]
        if mode == "grouped":
            placeable = _placeable_groups(groups, rows, prompt_tokens, L, out)
            plan = plan_grouped(placeable, rows.lengths, budget, max_per, seed)
        else:
            rng = np.random.default_rng([spec.packing.seed, split_no]) if split == "train" else None
            fitting = set(fits)
            kept = [[i for i in g if i in fitting] for g in groups]
            plan = plan_sequential([g for g in kept if g], rows.lengths, budget, max_per, rng)
            if split == "train":
                for g in kept:
                    if g:
                        out.prefill[rows.keys[g[0]]] = [rows.lines[i] for i in g]  # in order; cut to 3 below
        for ex in plan:
            out.examples.append((split, ex))
            for u in ex.units:
                out.examples_per_group[rows.keys[u[0]]] += 1
    out.rejects.sort()
    return out


def _placeable_groups(
    groups: list[list[int]], rows: _Rows, prompt_tokens: int, L: int, out: _Assembled
) -> list[list[int]]:
    """The groups that fit max_seq_len with the prompt and their BOS/EOS; every record of another is a reject."""
    assert rows.keys is not None
    placeable = []
    for g in groups:
        need = prompt_tokens + 2 + sum(rows.lengths[i] for i in g)
        if need <= L:
            placeable.append(g)
            continue
        detail = (
            f"group {rows.keys[g[0]]!r} needs {need} tokens (schema prompt {prompt_tokens} + "
            f"{len(g)} records {need - prompt_tokens - 2} + BOS/EOS 2) > max_seq_len {L}"
        )
        out.rejects += [(i, GROUP_OVER_BUDGET, detail, need, rows.keys[i]) for i in g]
    return placeable


def _ss_prompt_ids(text: str, pt: PinnedTokenizer) -> list[int]:
    """SS's prompt as its tokenizer call reads it: each `<unk>` is the unknown token (a special token, split off
    before the text between is encoded); elsewhere special-token text stays text."""
    unk = pt.hf.get_vocab().get("<unk>")
    if unk is None:
        return pt.encode_batch([text])[0]
    first, *rest = text.split("<unk>")
    ids = pt.encode_batch([first])[0]
    for piece, seg in zip(rest, pt.encode_batch(rest, continuation=True), strict=True):
        ids += [unk, *(seg if piece else [])]
    return ids


def _assemble_ss(
    spec: DatasetSpec,
    tab: TabularSpec,
    rows: _Rows,
    fits: list[int],
    idx: list[int],
    split: str,
    rng: np.random.Generator,
    budget: int,
    out: _Assembled,
    prompt_tokens: int,
) -> None:
    """Safe Synthesizer's assembly of one split (docs/spec.md, "Safe Synthesizer recipe"): groups in sorted key
    order, one seeded generator, `num_input_records_to_sample` passes over the training split."""
    max_per = spec.max_per_example
    assert max_per is not None
    L = spec.sequence.max_seq_len
    mode = tab.resolved_mode
    sample = tab.num_input_records_to_sample if split == "train" else None
    if mode == "flat":
        order = [fits[k] for p in sample_passes(len(fits), sample, rng) for k in p] if fits else []
        out.examples += [(split, ex) for ex in fill_flat(order, rows.lengths, budget, max_per)]
        return
    assert rows.keys is not None
    gi = rows.columns.index(tab.group_by) if tab.group_by is not None else None
    local = group_records([rows.keys[i] for i in idx], [rows.order.keys[i] for i in idx] if rows.order else None)
    groups = [[idx[k] for k in g] for g in local]
    if gi is not None:
        first_values = {g[0]: json.loads(rows.lines[g[0]])[rows.columns[gi]] for g in groups}
        groups.sort(key=lambda g: pandas_group_key(first_values[g[0]]))
    out.group_tokens += [prompt_tokens + 2 + sum(rows.lengths[i] for i in g) for g in groups]
    if mode == "grouped":
        placeable = _placeable_groups(groups, rows, prompt_tokens, L, out)
        if placeable:
            passes = group_passes([len(g) for g in placeable], sample, rng)
            order = [placeable[k] for p in passes for k in p]
            plan = fill_grouped(order, rows.lengths, budget, max_per)
        else:
            plan = []
    else:
        fitting = set(fits)
        sequence = [i for g in groups for i in g if i in fitting]
        runs: list[list[int]] = []
        for p in sequence_passes(len(sequence), sample) if sequence else []:
            for pos, k in enumerate(p):  # a pass starts a new run: SS's dataset-restart flush
                i = sequence[k]
                if pos and rows.keys[runs[-1][-1]] == rows.keys[i]:
                    runs[-1].append(i)
                else:
                    runs.append([i])
        plan = plan_sequential(runs, rows.lengths, budget, max_per, rng if split == "train" else None)
        if split == "train":
            seen: dict[str, list[str]] = {}
            for i in sequence:
                seen.setdefault(rows.keys[i], []).append(rows.lines[i])
            out.ss_prefill.update({g: safe_synthesizer_prefill(lines) for g, lines in seen.items()})
    for ex in plan:
        out.examples.append((split, ex))
        for u in ex.units:
            out.examples_per_group[rows.keys[u[0]]] += 1


def build_tabular_examples(
    spec: DatasetSpec, silver_records: Path, pt: PinnedTokenizer, ex_sink: ParquetSink, rej_sink: ParquetSink
) -> dict[str, Any]:
    """Write one drop's tabular examples and budget rejects; return the gold stats' figures."""
    tab = spec.tabular or TabularSpec()
    rows = _load(spec, tab, silver_records, pt)
    bos, eos = unit_token_ids(tab, pt)
    if tab.prompt == "safe_synthesizer":  # SS's TinyLlama/Mistral metadata: the prompt between BOS and EOS
        prompt_text = safe_synthesizer_prompt(rows.columns)
        prompt_ids = [bos, *_ss_prompt_ids(prompt_text, pt), eos]
    else:
        head = [pt.info.bos_id] if pt.info.add_bos and pt.info.bos_id is not None else []
        prompt_text = schema_prompt(rows.columns)
        prompt_ids = head + pt.encode_batch([prompt_text])[0]
    asm = _assemble(spec, tab, rows, len(prompt_ids))

    # pieces of every example in order: (token ids, loss mask, token type)
    piece_ids: list[list[int]] = []
    piece_mask: list[int] = []
    piece_type: list[int] = []
    per_example_pieces: list[int] = []
    for _, ex in asm.examples:
        pieces: list[tuple[list[int], int, int]] = [(prompt_ids, 0, TYPE_PROMPT)]
        for unit in ex.units:
            pieces += [
                ([bos], 1, TYPE_COMPLETION),
                *((rows.ids[i], 1, TYPE_COMPLETION) for i in unit),
                ([eos], 1, TYPE_EOS),
            ]
        per_example_pieces.append(len(pieces))
        for ids, m, t in pieces:
            piece_ids.append(ids)
            piece_mask.append(m)
            piece_type.append(t)
    piece_len = np.fromiter((len(p) for p in piece_ids), dtype=np.int64, count=len(piece_ids))
    token_ids = np.fromiter(chain.from_iterable(piece_ids), dtype=np.int32, count=int(piece_len.sum()))
    loss_mask = np.repeat(np.array(piece_mask, dtype=np.uint8), piece_len)
    types = np.repeat(np.array(piece_type, dtype=np.uint8), piece_len)
    owner = np.repeat(np.arange(len(asm.examples)), per_example_pieces)
    lengths = np.bincount(owner, weights=piece_len, minlength=len(asm.examples)).astype(np.int64)
    offsets = offsets_from_lengths(lengths)
    n_loss = segment_sums(loss_mask, offsets)

    firsts = [ex.units[0][0] for _, ex in asm.examples]
    prov = rows.table.select(_PROVENANCE).take(pa.array(firsts, type=pa.int64()))
    drop = rows.table.column("drop")[0].as_py() if rows.table.num_rows else ""
    numbering: Counter[str] = Counter()
    example_ids = []
    for split, _ in asm.examples:
        example_ids.append(f"{drop}:{split}/{numbering[split]}")
        numbering[split] += 1
    record_id = rows.table.column("record_id").to_pylist()
    grouped = rows.keys is not None
    if asm.examples:
        ex_sink.write(
            pa.table(
                {
                    "example_id": pa.array(example_ids, pa.string()),
                    **{c: prov.column(c) for c in _PROVENANCE},
                    "split": pa.array([s for s, _ in asm.examples], pa.string()),
                    "token_ids": list_array(token_ids, offsets, pa.int32()),
                    "loss_mask": list_array(loss_mask, offsets, pa.uint8()),
                    "token_type_ids": list_array(types, offsets, pa.uint8()),
                    "num_tokens": pa.array(lengths.astype(np.int32)),
                    "num_loss_tokens": pa.array(n_loss.astype(np.int32)),
                    "num_prompt_tokens": pa.array(np.full(len(lengths), len(prompt_ids), dtype=np.int32)),
                    "pair_id": pa.nulls(len(lengths), pa.string()),
                    "branch": pa.nulls(len(lengths), pa.string()),
                    "shared_prefix_tokens": pa.nulls(len(lengths), pa.int32()),
                    "record_ids": pa.array(
                        [[record_id[i] for u in ex.units for i in u] for _, ex in asm.examples], pa.list_(pa.string())
                    ),
                    "group_keys": pa.array(
                        [
                            [rows.keys[u[0]] for u in ex.units] if rows.keys is not None else None
                            for _, ex in asm.examples
                        ],
                        pa.list_(pa.string()),
                    ),
                    "domain": pa.nulls(len(lengths), pa.string()),  # an example holds many records: none
                },
                schema=GOLD_SCHEMA,
            )
        )
    if asm.rejects:
        rej = rows.table.select([*_PROVENANCE, "split"]).take(pa.array([r[0] for r in asm.rejects], type=pa.int64()))
        rej_sink.write(
            pa.table(
                {
                    **{c: rej.column(c) for c in rej.column_names},
                    "reason": pa.array([r[1] for r in asm.rejects], pa.string()),
                    "detail": pa.array([r[2] for r in asm.rejects], pa.string()),
                    "num_tokens": pa.array([r[3] for r in asm.rejects], pa.int32()),
                    "group_key": pa.array([r[4] for r in asm.rejects], pa.string()),
                },
                schema=GOLD_REJECT_SCHEMA,
            )
        )

    units = [len(ex.units) for _, ex in asm.examples]
    records = [sum(len(u) for u in ex.units) for _, ex in asm.examples]
    return {
        "lengths": lengths,
        "tokens": int(lengths.sum()),
        "loss_tokens": int(n_loss.sum()),
        "prompt_tokens": len(prompt_ids) * len(lengths),
        "rejects_by_reason": dict(Counter(r[1] for r in asm.rejects)),
        "tabular": {
            "mode": tab.resolved_mode,
            "order_by": rows.order_by,
            "order_by_type": rows.order.type if rows.order is not None else None,
            "order_by_values": rows.order.kinds if rows.order is not None else None,
            "order_by_day_first": rows.order.day_first if rows.order is not None else None,
            "unorderable_records": len(rows.order.problems) if rows.order is not None else 0,
            "time_series_validation": asdict(rows.time_series) if rows.time_series is not None else None,
            "columns": rows.columns,
            "schema_prompt": prompt_text,
            "schema_prompt_tokens": len(prompt_ids),
            "bos_id": bos,
            "eos_id": eos,
            "max_seq_len": spec.sequence.max_seq_len,
            "record_budget": spec.sequence.max_seq_len - len(prompt_ids),
            "max_sequences_per_example": spec.max_per_example,
            "records": len(rows.lengths),
            "records_in_examples": int(sum(records)),
            "groups": len(set(rows.keys)) if rows.keys is not None else None,
            "examples": len(asm.examples),
            "tokens_per_record": percentiles(rows.lengths),
            "tokens_per_group": percentiles(asm.group_tokens) if grouped else None,
            "tokens_per_example": percentiles(lengths),
            "records_per_example": percentiles(records),
            "groups_per_example": percentiles(units) if grouped else None,
            "examples_per_group": percentiles(list(asm.examples_per_group.values())) if grouped else None,
            "over_budget": _largest(asm.rejects),
            "initial_prefill": (
                (asm.ss_prefill if tab.assembly == "safe_synthesizer" else initial_prefill(asm.prefill))
                if tab.resolved_mode == "sequential"
                else None
            ),
        },
    }


def _largest(rejects: list[tuple[int, str, str, int, str | None]], n: int = 5) -> list[dict[str, Any]]:
    """The largest over-budget groups/records (one entry per group), largest first."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for i, reason, detail, tokens, label in rejects:
        if reason not in BUDGET_REASONS:
            continue
        key = (reason, label if reason == GROUP_OVER_BUDGET and label is not None else str(i))
        seen.setdefault(key, {"reason": reason, "group": label, "tokens": tokens, "detail": detail})
    return sorted(seen.values(), key=lambda e: (-e["tokens"], e["detail"]))[:n]
