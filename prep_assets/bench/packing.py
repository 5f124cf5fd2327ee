"""`bench packing`: tokens/s of each packing strategy over a real gold drop."""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prep_assets.bench.common import (
    _line,
    _missing,
    _spec,
    build_gold,
)
from prep_assets.core import shards as shards_layer
from prep_assets.core.packing import plan_rows
from prep_assets.core.rows import materialize_rows
from prep_assets.core.shards import GoldArrays, build_packed_shards
from prep_assets.core.tokenizer import load_pinned_info


def bench_packing(args: argparse.Namespace) -> int:
    source, tokenizer = Path(args.source), Path(args.tokenizer).resolve()  # the spec reads it from the data dir
    if _missing(source, tokenizer):
        return 2
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "prep_assets_bench"
    L = args.max_seq_len
    gold_dir, tok_dir, gs = build_gold(source, tokenizer, L, work)
    tokens = gs["tokens"]
    print(
        f"\n{source.name}: {gs['records']:,} records, {gs['kept']:,} kept, {gs['examples']:,} examples, "
        f"{tokens:,} tokens; max_seq_len {L}"
    )
    for layer, sec in gs["seconds"].items():
        print(_line(f"{layer} layer (when cached)", sec, tokens))
    gold = GoldArrays.of(
        pq.read_table(str(gold_dir / "examples.parquet"), columns=["token_ids", "loss_mask", "token_type_ids"])
    )
    lengths = np.diff(gold.offsets)
    pad = load_pinned_info(tok_dir).pad_id
    bound = -(-int(lengths.sum()) // L)
    for strategy in args.strategies.split(","):
        spec = _spec(tokenizer, L, strategy)
        t = time.perf_counter()
        plan = plan_rows(
            lengths, capacity=L, strategy=strategy, overflow="window", loss_mask=gold.loss_mask, shuffle_seed=(0, 0)
        )
        t_plan = time.perf_counter() - t
        # rows built as the shards layer builds them, SHARD_CHUNK_ROWS at a time (0.29-0.37 s for the 100 MB
        # drop's 5,545 rows); all at once, the first touch of ~600 MB of fresh row grids made it 0.35-1.76 s
        num_rows = 0
        chunk = shards_layer.SHARD_CHUNK_ROWS
        for lo in range(0, plan.num_rows, chunk):
            num_rows += materialize_rows(
                plan.rows(lo, min(lo + chunk, plan.num_rows)),
                token_ids=gold.token_ids,
                loss_mask=gold.loss_mask,
                token_type_ids=gold.token_type_ids,
                offsets=gold.offsets,
                row_len=L,
                pad_id=pad,
            ).num_rows
        t_rows = time.perf_counter() - t - t_plan
        out = work / f"shards_{strategy}"
        t = time.perf_counter()
        st = build_packed_shards(spec, gold_dir, tok_dir, out)
        t_layer = time.perf_counter() - t
        m = st.totals
        print(
            f"\n{strategy}: {num_rows:,} rows (lower bound {bound:,}, x{num_rows / bound:.5f}), "
            f"sequence utilization {m['sequence_utilization']:.4f}, {m['examples_split']:,} examples split"
        )
        print(_line("plan", t_plan, tokens))
        print(_line("plan + materialize rows", t_plan + t_rows, tokens))
        print(_line("shards layer (read, pack, write)", t_layer, tokens))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {peak:,.0f} MiB")
    return 0
