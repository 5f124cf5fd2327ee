"""Benchmarks that print figures (speed is measured here, never by timed tests).

    python -m prep_assets.bench packing [--source FILE] [--tokenizer DIR] [--max-seq-len N] [--work DIR]
    python -m prep_assets.bench e2e [--mb N | --rows N] [--source FILE] [--tokenizer DIR] [--max-seq-len N]
                                    [--work DIR] [--repeat N] [--hf-path DIR | none]
    python -m prep_assets.bench dedup [--mb N] [--work DIR]
    python -m prep_assets.bench near [--source FILE]
    python -m prep_assets.bench longdoc [--mb N] [--tokenizer DIR] [--max-seq-len N] [--work DIR]

`packing` tokenizes a prompt/completion drop once through the real bronze -> silver -> gold layers (cached in
--work; by default ../shared/datasets/bench/bench_pc.jsonl.gz, 22.8M GPT-2 tokens), then packs that gold with
each strategy, printing tokens/s for planning, for building the rows (SHARD_CHUNK_ROWS at a time, as the
shards layer builds them), and for the whole shards layer
(Parquet written), plus rows against the lower bound ceil(tokens / max_seq_len). Gold keeps long examples
whole (`window` overflow), so `bfd`/`ffd`/`single` window them and `full` cuts them across rows.

`dedup` builds a text drop of about --mb MB from the real text files in ../shared/datasets/text (documents
re-mixed with a seeded generator: distinct documents, plus 5% exact and 5% near copies) and times the silver
layer with `dedup: exact` and with `dedup: near` (MB/s, records/s, what was removed).

`e2e` builds a prompt/completion drop of about --mb MB from --source (by default the shared benchmark
corpus; rows repeated with a variant marker on the prompt beyond one pass, so repeats stay distinct), then
measures on this machine: (a) two anchors on the same prompt and completion texts, right before and right
after each run of (b): the bare HF tokenizer (`encode_batch_fast`, both threads) and the bare fast engine
(tiktoken, both threads, as gold runs it: only for tokenizers `core.fast_bpe` accepts, else it says
why not), a run's ratio against each using the mean of the two timings around it, (b) bronze -> shards of
the drop through Dagster (`materialize` with every blocking check, in a child process, on a fresh lake),
(c) each layer's time (its step and its checks), (d) the child's peak RSS; it prints end-to-end / each
anchor and the figures as JSON. With --repeat N, (b) runs N times and the JSON gives the median run's figures
(the lower middle for an even N), every run's ratio, and the highest peak RSS of all runs. Then one run with
--hf-path's tokenizer (by default TinyLlama's, SentencePiece-style, which tiktoken does not implement), so gold's
HF path is measured in the same invocation against its own bare HF anchor (JSON `hf_path`).

`near` prints near-dedup precision and recall on the labelled set of `prep_assets.near_eval`.

`longdoc` makes a text drop of one document of about --mb MB (seeded words from the tokenizer's vocabulary, so
BPE cannot collapse it: 6 MB is ~1.45M GPT-2 tokens), packs it with `full` at --max-seq-len, and runs bronze ->
shards with every blocking gate through Dagster in a child process; it prints each step's time and RSS and the
child's peak RSS (the gates hold memory bounded however long one example is).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prep_assets.bench.common import DEFAULT_HF_PATH_TOKENIZER, DEFAULT_SOURCE, DEFAULT_TOKENIZER
from prep_assets.bench.dedup import TEXT_DIR, bench_dedup, bench_near
from prep_assets.bench.e2e import _e2e_child, bench_e2e
from prep_assets.bench.longdoc import _longdoc_child, bench_longdoc
from prep_assets.bench.packing import bench_packing


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prep_assets.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    pk = sub.add_parser("packing", help="tokens/s of each packing strategy over ~20M real tokens")
    pk.add_argument("--source", default=str(DEFAULT_SOURCE), help="a prompt/completion JSONL(.gz) drop")
    pk.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="a local tokenizer directory")
    pk.add_argument("--max-seq-len", type=int, default=1024)
    pk.add_argument("--strategies", default="bfd,full,ffd,single")
    pk.add_argument("--work", help="where gold and shards are written (default: $TMPDIR/prep_assets_bench)")
    pk.set_defaults(fn=bench_packing)
    dd = sub.add_parser("dedup", help="exact and near dedup throughput on a ~100 MB text drop")
    dd.add_argument("--mb", type=float, default=100.0)
    dd.add_argument(
        "--work", help="where the corpus and silver are written (default: $TMPDIR/prep_assets_bench_dedup)"
    )
    dd.set_defaults(fn=bench_dedup)
    nr = sub.add_parser("near", help="near-dedup precision and recall on a labelled set from real documents")
    nr.add_argument("--source", default=str(TEXT_DIR / "c4_demo.jsonl"))
    nr.set_defaults(fn=bench_near)
    ee = sub.add_parser("e2e", help="end to end through Dagster against the bare tokenizer, with peak RSS")
    ee.add_argument("--mb", type=float, default=100.0)
    ee.add_argument("--rows", type=int, help="a drop of exactly this many rows instead (e.g. 100: Dagster's overhead)")
    ee.add_argument("--source", default=str(DEFAULT_SOURCE), help="a prompt/completion JSONL(.gz)")
    ee.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    ee.add_argument("--max-seq-len", type=int, default=4096)
    ee.add_argument(
        "--hf-path",
        default=str(DEFAULT_HF_PATH_TOKENIZER),
        help="after the runs, one run with this tokenizer, which gold encodes with HF (default: TinyLlama's; "
        "`none`: no such run)",
    )
    ee.add_argument("--work", help="where the drop and the lake are written (default: $TMPDIR/prep_assets_bench_e2e)")
    ee.add_argument(
        "--repeat",
        type=_at_least_one,
        default=1,
        help="measured runs (the JSON gives the median run's figures; peak RSS is the highest of all)",
    )
    ee.set_defaults(fn=bench_e2e)
    ld = sub.add_parser("longdoc", help="one long document packed `full` through every layer and gate, with peak RSS")
    ld.add_argument("--mb", type=float, default=6.0)
    ld.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    ld.add_argument("--max-seq-len", type=int, default=2048)
    ld.add_argument("--work", help="where the drop and lake are written (default: $TMPDIR/prep_assets_bench_longdoc)")
    ld.set_defaults(fn=bench_longdoc)
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "_longdoc_child":
        return _longdoc_child(Path(sys.argv[2]))
    if argv is None and len(sys.argv) == 5 and sys.argv[1] == "_e2e_child":
        return _e2e_child(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    args = parser.parse_args(argv)
    return int(args.fn(args))
