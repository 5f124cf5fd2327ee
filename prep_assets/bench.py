"""Benchmarks that print figures (speed is measured here, never by timed tests).

    python -m prep_assets.bench packing [--source FILE] [--tokenizer DIR] [--max-seq-len N] [--work DIR]
    python -m prep_assets.bench e2e [--mb N | --rows N] [--source FILE] [--tokenizer DIR] [--max-seq-len N]
                                    [--work DIR] [--repeat N]
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
measures on this machine: (a) the bare Rust tokenizer (`encode_batch_fast`, both threads) on the same
prompt and completion texts, right before and right after each run of (b) (a run's ratio uses the mean of the
two timings around it), (b) bronze -> shards of the drop through Dagster (`materialize` with every blocking
check, in a child process, on a fresh lake), (c) each layer's time (its step and its checks), (d) the child's
peak RSS; it prints end-to-end / bare tokenizer and the figures as JSON. With --repeat N, (b) runs N times and
the JSON gives the median run's figures (the lower middle for an even N), every run's ratio, and the
highest peak RSS of all runs.

`near` prints near-dedup precision and recall on the labelled set of `prep_assets.near_eval`.

`longdoc` makes a text drop of one document of about --mb MB (seeded words from the tokenizer's vocabulary, so
BPE cannot collapse it: 6 MB is ~1.45M GPT-2 tokens), packs it with `full` at --max-seq-len, and runs bronze ->
shards with every blocking gate through Dagster in a child process; it prints each step's time and RSS and the
child's peak RSS (the gates hold memory bounded however long one example is).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from prep_assets.core import layers
from prep_assets.core import shards as shards_layer
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.lake import STATS as STATS_FILE
from prep_assets.core.lake import dataset_paths, read_json
from prep_assets.core.packing import plan_rows
from prep_assets.core.rows import materialize_rows
from prep_assets.core.shards import GoldArrays, build_packed_shards
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import DatasetSpec, parse_spec
from prep_assets.core.tokenizer import load_pinned_info

SHARED = Path(__file__).resolve().parents[2] / "shared"
DEFAULT_SOURCE = SHARED / "datasets" / "bench" / "bench_pc.jsonl.gz"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "gpt2"


def _spec(tokenizer: Path, max_seq_len: int, strategy: str = "bfd") -> DatasetSpec:
    raw = {
        "input": {"type": "instruction"},
        "tokenizer": {"path": str(tokenizer)},
        "sequence": {"max_seq_len": max_seq_len, "overflow": "window", "overlap": 0},
        "packing": {"strategy": strategy},
        "checks": {"max_reject_rate": 0.2},
    }
    return parse_spec(raw, path=Path("bench.yaml"), default_name="bench")


def _line(label: str, seconds: float, tokens: int) -> str:
    return f"  {label:<34} {seconds:8.2f} s  {tokens / seconds / 1e6:8.2f} M tokens/s"


def build_gold(source: Path, tokenizer: Path, max_seq_len: int, work: Path) -> tuple[Path, Path, dict]:
    """Bronze, silver and gold of `source` under `work` (reused when already built for the same inputs)."""
    data = work / "data"
    paths = dataset_paths(data, "bench")
    marker = work / "gold.json"
    want = {"source": str(source), "size": source.stat().st_size, "tokenizer": str(tokenizer), "L": max_seq_len}
    spec = _spec(tokenizer, max_seq_len)
    if marker.is_file() and read_json(marker)["want"] == want:
        done = read_json(marker)
        return Path(done["gold"]), paths.tokenizer_dir, done["stats"]
    shutil.rmtree(work, ignore_errors=True)
    paths.raw_dir.mkdir(parents=True)
    shutil.copyfile(source, paths.raw_dir / source.name)  # drops are regular files (symlinks are skipped)
    register_drops(paths)
    layers.build_tokenizer(spec, paths, data)
    key = sorted(p.stem for p in paths.drops_dir.glob("*.json"))[0]
    drop, src = resolve_drop(paths, key)
    b, s, g = (paths.partition_dir(x, key) for x in ("bronze", "silver", "gold"))
    print(f"building gold of {source.name} once (cached in {work})", flush=True)
    t = time.perf_counter()
    bronze = build_raw_records(spec, drop, src, b)
    t_b = time.perf_counter() - t
    silver = build_clean_records(spec, b, s)
    t_s = time.perf_counter() - t - t_b
    gold = layers.build_tokenized_examples(spec, s, paths.tokenizer_dir, g)
    t_g = time.perf_counter() - t - t_b - t_s
    stats = {
        "records": bronze["records"],
        "kept": silver["records"],
        "examples": gold["examples"],
        "tokens": gold["tokens"],
        "seconds": {"bronze": t_b, "silver": t_s, "gold": t_g},
    }
    marker.write_text(json.dumps({"want": want, "gold": str(g), "stats": stats}), encoding="utf-8")
    return g, paths.tokenizer_dir, stats


def _missing(*paths: Path) -> bool:
    for p in paths:
        if not p.exists():
            print(f"error: {p} not found (pass --source / --tokenizer)", file=sys.stderr)
            return True
    return False


def bench_packing(args: argparse.Namespace) -> int:
    source, tokenizer = Path(args.source), Path(args.tokenizer)
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
        m = st["totals"]
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


TEXT_DIR = SHARED / "datasets" / "text"


def dedup_corpus(target_mb: float, out: Path, seed: int = 0) -> int:
    """A text JSONL drop of about `target_mb` MB from the shared text files: each document is a source paragraph
    run with 10% of its words re-drawn (distinct), and 5% exact and 5% near copies (2% of words re-drawn) of
    earlier ones. Returns the number of records."""
    import random

    paragraphs: list[str] = []
    for path in sorted(TEXT_DIR.iterdir()):
        if path.suffix == ".jsonl":
            rows = (json.loads(line) for line in path.open(encoding="utf-8"))
            paragraphs += [t for r in rows if isinstance(t := r.get("text") or r.get("completion"), str)]
        else:
            text = path.read_text(encoding="utf-8")
            paragraphs += [p for p in text.split("\n\n") if len(p.split()) > 20]
    vocab = sorted({w for p in paragraphs[:2000] for w in p.split()})
    rng = random.Random(seed)

    def redraw(text: str, share: float) -> str:
        words = text.split()
        for i in rng.sample(range(len(words)), max(1, int(len(words) * share))):
            words[i] = rng.choice(vocab)
        return " ".join(words)

    docs: list[str] = []
    size, target = 0, int(target_mb * 1e6)
    with out.open("w", encoding="utf-8") as f:
        while size < target:
            roll = rng.random()
            if docs and roll < 0.05:
                doc = rng.choice(docs)
            elif docs and roll < 0.10:
                doc = redraw(rng.choice(docs), 0.02)
            else:
                doc = redraw(rng.choice(paragraphs), 0.10)
                if len(docs) < 20000:
                    docs.append(doc)
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            size += len(line.encode("utf-8"))
            f.write(line)
    return sum(1 for _ in out.open(encoding="utf-8"))


def bench_dedup(args: argparse.Namespace) -> int:
    if not TEXT_DIR.is_dir():
        print(f"error: {TEXT_DIR} not found", file=sys.stderr)
        return 2
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "prep_assets_bench_dedup"
    shutil.rmtree(work, ignore_errors=True)
    raw = work / "data" / "raw" / "dedup"
    raw.mkdir(parents=True)
    t = time.perf_counter()
    n = dedup_corpus(args.mb, raw / "corpus.jsonl")
    mb = (raw / "corpus.jsonl").stat().st_size / 1e6
    print(f"corpus: {n:,} records, {mb:.1f} MB, built in {time.perf_counter() - t:.1f} s")
    paths = dataset_paths(work / "data", "dedup")
    (drop,), _ = register_drops(paths)
    _, src = resolve_drop(paths, drop.partition)
    figures = {}
    for mode in ("exact", "near"):
        spec = parse_spec(
            {"input": {"type": "text"}, "tokenizer": {"path": "/unused"}, "clean": {"dedup": mode}},
            path=Path("dedup.yaml"),
            default_name="dedup",
        )
        bronze, silver = paths.partition_dir("bronze", drop.partition), work / f"silver_{mode}"
        if mode == "exact":
            t = time.perf_counter()
            build_raw_records(spec, drop, src, bronze)
            print(f"  bronze                 {time.perf_counter() - t:8.2f} s")
        t = time.perf_counter()
        st = build_clean_records(spec, bronze, silver)
        sec = time.perf_counter() - t
        figures[mode] = {
            "seconds": round(sec, 2),
            "mb_per_s": round(mb / sec, 2),
            "records_per_s": round(n / sec),
            "kept": st["records"],
            "removed": st["rejects_by_reason"],
        }
        print(
            f"  silver dedup {mode:<6}    {sec:8.2f} s  {mb / sec:8.2f} MB/s  {n / sec:10,.0f} records/s  "
            f"kept {st['records']:,}  removed {st['rejects_by_reason']}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:,.0f} MiB")
    print(json.dumps({"corpus_mb": round(mb, 1), "records": n, **figures, "peak_rss_mib": round(peak)}))
    return 0


def bench_near(args: argparse.Namespace) -> int:
    from prep_assets.near_eval import evaluate_near

    source = Path(args.source)
    if not source.is_file():
        print(f"error: {source} not found", file=sys.stderr)
        return 2
    r = evaluate_near(source)
    print(
        f"{source.name}: {r.documents} documents + {r.copies} near copies; removed {r.removed} "
        f"({r.removed_copies} copies): precision {r.precision:.3f}, recall {r.recall:.3f}, {r.seconds:.2f} s"
    )
    return 0


def pc_corpus(source: Path, target_mb: float, out: Path, max_rows: int | None = None) -> int:
    """A prompt/completion JSONL of about `target_mb` MB (or `max_rows` rows): the rows of `source` in order, then
    again with " (variant k)" appended to the prompt (distinct records, nearly the same tokens). Returns the row
    count."""
    import gzip

    target, size, rows, k = int(target_mb * 1e6), 0, 0, 0
    limit = max_rows if max_rows is not None else float("inf")
    with out.open("w", encoding="utf-8") as f:
        while size < target and rows < limit:
            opener = gzip.open if source.suffix == ".gz" else open
            with opener(source, "rt", encoding="utf-8") as src:
                for line in src:
                    if size >= target or rows >= limit:
                        break
                    if k:
                        row = json.loads(line)
                        row["prompt"] = f"{row['prompt']} (variant {k})"
                        line = json.dumps(row, ensure_ascii=False) + "\n"
                    f.write(line)
                    size += len(line.encode("utf-8"))
                    rows += 1
            k += 1
    return rows


def bare_tokenizer(corpus: Path, tokenizer: Path, batch: int = 4096) -> tuple[int, float]:
    """(tokens, seconds) of the Rust tokenizer's `encode_batch_fast` over the corpus' prompts and completions
    (read and parsed beforehand: only encoding is timed)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    texts = []
    with corpus.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts += [row.get("prompt") or "", row.get("completion") or ""]
    tokens, start = 0, time.perf_counter()
    for lo in range(0, len(texts), batch):
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[lo : lo + batch], add_special_tokens=False))
    return tokens, time.perf_counter() - start


class RssSampler:
    """This process' resident memory every 20 ms in a thread (/proc/self/statm), to tell which step peaked."""

    def __init__(self) -> None:
        import os
        import threading

        self.samples: list[tuple[float, float]] = []
        self._page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with open("/proc/self/statm", "rb") as f:
            while not self._stop.is_set():
                f.seek(0)
                self.samples.append((time.time(), int(f.read().split()[1]) * self._page_mib))
                self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float, end: float) -> float:
        return max((rss for t, rss in self.samples if start <= t <= end), default=0.0)


def _step_peaks(instance: Any, run_id: str, rss: RssSampler) -> dict[str, dict[str, float]]:
    """Per step: its time span and the process' RSS when it started and at its peak (MiB)."""
    from dagster import DagsterEventType

    spans: dict[str, list[float]] = {}
    for entry in instance.all_logs(run_id):
        ev = entry.dagster_event
        if ev is None or not entry.step_key:
            continue
        if ev.event_type == DagsterEventType.STEP_START:
            spans[entry.step_key] = [entry.timestamp, entry.timestamp]
        elif (
            ev.event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE) and entry.step_key in spans
        ):
            spans[entry.step_key][1] = entry.timestamp
    return {
        k: {
            "s": round(b - a, 2),
            "rss_start_mib": round(rss.peak(a - 0.05, a + 0.05)),
            "peak_mib": round(rss.peak(a, b)),
        }
        for k, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0])
    }


def _e2e_child(work: Path, tokenizer: Path, max_seq_len: int) -> int:
    """In a fresh process: tokenizer, then bronze -> shards of the one drop through Dagster; prints JSON."""
    from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

    from prep_assets.definitions import dataset_assets
    from prep_assets.defs.keys import PARTITIONED, TOKENIZER
    from prep_assets.defs.resources import LakeResource

    data = work / "data"
    spec = _spec(tokenizer, max_seq_len)
    paths = dataset_paths(data, "bench")
    (drop,), _ = register_drops(paths)
    assets = dataset_assets(spec)
    resources = {"lake": LakeResource(data_dir=str(data))}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("bench_drops", [drop.partition])
        tok = materialize(assets, selection=[AssetKey(["bench", TOKENIZER])], instance=instance, resources=resources)
        start = time.perf_counter()
        with RssSampler() as rss:
            result = materialize(
                assets,
                selection=AssetSelection.assets(*(AssetKey(["bench", n]) for n in PARTITIONED)),
                partition_key=drop.partition,
                instance=instance,
                resources=resources,
                raise_on_error=False,
            )
        wall = time.perf_counter() - start
        peaks = _step_peaks(instance, result.run_id, rss)
    steps: dict[str, float] = {}
    for event in result.get_step_success_events():
        layer = next((n for n in PARTITIONED if n in (event.step_key or "")), "other")
        steps[layer] = steps.get(layer, 0.0) + event.event_specific_data.duration_ms / 1000  # type: ignore[union-attr]
    checks = result.get_asset_check_evaluations()
    gold = read_json(paths.partition_dir("gold", drop.partition) / STATS_FILE)
    print(
        json.dumps(
            {
                "success": result.success and tok.success,
                "wall_s": wall,
                "layers_s": steps,
                "steps": peaks,
                "checks": len(checks),
                "checks_passed": sum(c.passed for c in checks),
                "tokens": gold["tokens"],
                "examples": gold["examples"],
            }
        )
    )
    return 0 if result.success else 1


def _e2e_run(work: Path, tokenizer: Path, max_seq_len: int) -> dict[str, Any] | None:
    """One measured pipeline run in a fresh process on a fresh lake (the drop stays); None if it failed."""
    import subprocess

    shutil.rmtree(work / "data" / "lake", ignore_errors=True)
    child = subprocess.run(
        [sys.executable, "-m", "prep_assets.bench", "_e2e_child", str(work), str(tokenizer), str(max_seq_len)],
        capture_output=True,
        text=True,
    )
    if child.returncode != 0 or not child.stdout.strip():
        print(child.stdout[-2000:], child.stderr[-4000:], file=sys.stderr)
        return None
    return dict(json.loads(child.stdout.strip().splitlines()[-1]))


def bench_e2e(args: argparse.Namespace) -> int:
    source, tokenizer = Path(args.source), Path(args.tokenizer)
    if _missing(source, tokenizer):
        return 2
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "prep_assets_bench_e2e"
    shutil.rmtree(work, ignore_errors=True)
    raw = work / "data" / "raw" / "bench"
    raw.mkdir(parents=True)
    corpus = raw / "corpus.jsonl"
    rows = pc_corpus(source, args.rows and 1e6 or args.mb, corpus, max_rows=args.rows)
    mb = corpus.stat().st_size / 1e6
    print(f"corpus: {rows:,} prompt/completion rows, {mb:.1f} MB (from {source.name})", flush=True)
    # This machine's speed drifts by +-10% within minutes, so the bare tokenizer is timed before the first run,
    # between runs and after the last, and each run is held against the mean of the two timings around it.
    bare_tokens, bare_s = bare_tokenizer(corpus, tokenizer)
    print(
        f"bare tokenizer (encode_batch_fast): {bare_tokens:,} tokens in {bare_s:.2f} s = "
        f"{bare_tokens / bare_s / 1e6:.3f} M tokens/s",
        flush=True,
    )
    results = []
    for k in range(args.repeat):
        run = _e2e_run(work, tokenizer, args.max_seq_len)
        if run is None:
            return 1
        before_s, (_, bare_s) = bare_s, bare_tokenizer(corpus, tokenizer)
        mean_s = (before_s + bare_s) / 2
        e2e = run["tokens"] / run["wall_s"]
        ratio = e2e * mean_s / bare_tokens
        results.append(
            {**run, "e2e": e2e, "bare": bare_tokens / mean_s, "ratio": ratio, "before_s": before_s, "after_s": bare_s}
        )
        print(
            f"run {k + 1}/{args.repeat}: end to end through Dagster (bronze -> shards, {run['checks_passed']}/"
            f"{run['checks']} checks passed): {run['tokens']:,} tokens in {run['wall_s']:.2f} s = "
            f"{e2e / 1e6:.3f} M tokens/s"
        )
        print(
            f"  bare tokenizer after it: {bare_s:.2f} s = {bare_tokens / bare_s / 1e6:.3f} M tokens/s; the mean "
            f"around the run {mean_s:.2f} s = {bare_tokens / mean_s / 1e6:.3f} M tokens/s"
        )
        for layer, sec in run["layers_s"].items():
            print(f"  {layer:<20} {sec:8.2f} s")
        print("  steps (time; the process' RSS when the step started -> its peak during the step):")
        for step, st in run["steps"].items():
            print(f"    {step:<58} {st['s']:7.2f} s  {st['rss_start_mib']:6,} -> {st['peak_mib']:6,} MiB")
        print(
            f"  end-to-end / bare tokenizer: {ratio:.3f} (against the timing before alone: "
            f"{e2e * before_s / bare_tokens:.3f}, after alone: {e2e * bare_s / bare_tokens:.3f})",
            flush=True,
        )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    ratios = sorted(r["ratio"] for r in results)
    mid = sorted(results, key=lambda r: r["ratio"])[(len(results) - 1) // 2]  # the median run (the lower middle)
    if len(results) > 1:
        print(
            f"end-to-end / bare tokenizer over {len(results)} runs: median {mid['ratio']:.3f}, "
            f"min {ratios[0]:.3f}, max {ratios[-1]:.3f} "
            f"({', '.join(f'{r:.3f}' for r in (x['ratio'] for x in results))})"
        )
    print(f"peak RSS of the pipeline process: {peak:,.0f} MiB")
    print(
        json.dumps(
            {
                "corpus_mb": round(mb, 1),
                "rows": rows,
                "max_seq_len": args.max_seq_len,
                "strategy": "bfd",
                "runs": len(results),
                "ratio": round(mid["ratio"], 3),
                "ratios": [round(r["ratio"], 3) for r in results],
                "bare_tokens_per_s": round(mid["bare"]),
                "bare_tokens_per_s_before": round(bare_tokens / mid["before_s"]),
                "bare_tokens_per_s_after": round(bare_tokens / mid["after_s"]),
                "e2e_tokens_per_s": round(mid["e2e"]),
                "wall_s": round(mid["wall_s"], 2),
                "layers_s": {k: round(v, 2) for k, v in mid["layers_s"].items()},
                "peak_rss_mib": round(peak),
                "checks_passed": mid["checks_passed"],
                "checks": mid["checks"],
            }
        )
    )
    return 0 if all(r["success"] for r in results) else 1


def long_document(n_bytes: int, tokenizer: Path, seed: int = 0) -> str:
    """About `n_bytes` of text: seeded lowercase words of the tokenizer's vocabulary, some with punctuation."""
    import random

    vocab = json.loads((tokenizer / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    words = sorted(
        w[1:] for w in vocab if w.startswith("\u0120") and w[1:].isalpha() and w[1:].islower() and 2 <= len(w) - 1 <= 5
    )
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_bytes:
        word = rng.choice(words) + (rng.choice(".,;") if rng.random() < 0.3 else "")
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def longdoc_spec(tokenizer: Path, max_seq_len: int) -> dict[str, Any]:
    return {
        "input": {"type": "text", "text_key": "text"},
        "clean": {"max_chars": 1 << 40},
        "tokenizer": {"path": str(tokenizer)},
        "sequence": {"max_seq_len": max_seq_len},
        "packing": {"strategy": "full"},
    }


def _longdoc_child(work: Path) -> int:
    """In a fresh process: tokenizer, then bronze -> shards of the drop under `work` through Dagster; prints JSON."""
    from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

    from prep_assets.core.spec import load_spec
    from prep_assets.definitions import dataset_assets
    from prep_assets.defs.keys import PARTITIONED, TOKENIZER
    from prep_assets.defs.resources import LakeResource

    data = work / "data"
    spec = load_spec(data / "datasets" / "longdoc.yaml")
    paths = dataset_paths(data, spec.name)
    (drop,), _ = register_drops(paths)
    assets = dataset_assets(spec)
    resources = {"lake": LakeResource(data_dir=str(data))}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{spec.name}_drops", [drop.partition])
        with RssSampler() as rss:
            tok = materialize(
                assets, selection=[AssetKey([spec.name, TOKENIZER])], instance=instance, resources=resources
            )
            start = time.perf_counter()
            result = materialize(
                assets,
                selection=AssetSelection.assets(*(AssetKey([spec.name, n]) for n in PARTITIONED)),
                partition_key=drop.partition,
                instance=instance,
                resources=resources,
                raise_on_error=False,
            )
            wall = time.perf_counter() - start
        peaks = _step_peaks(instance, result.run_id, rss)
    checks = result.get_asset_check_evaluations()
    gold = read_json(paths.partition_dir("gold", drop.partition) / STATS_FILE)
    print(
        json.dumps(
            {
                "success": result.success and tok.success,
                "wall_s": wall,
                "steps": peaks,
                "checks": len(checks),
                "checks_passed": sum(c.passed for c in checks),
                "failed": [c.check_name for c in checks if not c.passed],
                "tokens": gold["tokens"],
                "failed_steps": [e.step_key for e in result.all_events if e.is_step_failure],
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            }
        )
    )
    return 0 if result.success else 1


def bench_longdoc(args: argparse.Namespace) -> int:
    import subprocess

    import yaml

    tokenizer = Path(args.tokenizer)
    if _missing(tokenizer):
        return 2
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "prep_assets_bench_longdoc"
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    (data / "datasets").mkdir(parents=True)
    (data / "raw" / "longdoc").mkdir(parents=True)
    (data / "datasets" / "longdoc.yaml").write_text(
        yaml.safe_dump(longdoc_spec(tokenizer, args.max_seq_len)), encoding="utf-8"
    )
    doc = long_document(int(args.mb * 1e6), tokenizer)
    (data / "raw" / "longdoc" / "doc.jsonl").write_text(json.dumps({"text": doc}) + "\n", encoding="utf-8")
    print(f"one document of {len(doc) / 1e6:.2f} MB, packing full at max_seq_len {args.max_seq_len}", flush=True)
    child = subprocess.run(
        [sys.executable, "-m", "prep_assets.bench", "_longdoc_child", str(work)], capture_output=True, text=True
    )
    if not child.stdout.strip():
        print(child.stderr[-4000:], file=sys.stderr)
        return 1
    run = json.loads(child.stdout.strip().splitlines()[-1])
    failed = f" (failed: {', '.join(run['failed'])})" if run["failed"] else ""
    failed += f"; FAILED steps (a gate raised?): {', '.join(run['failed_steps'])}" if run["failed_steps"] else ""
    print(
        f"bronze -> shards through Dagster: {run['tokens']:,} tokens in {run['wall_s']:.2f} s, "
        f"{run['checks_passed']}/{run['checks']} checks passed{failed}"
    )
    print("  steps (time; the process' RSS when the step started -> its peak during the step):")
    for step, st in run["steps"].items():
        print(f"    {step:<58} {st['s']:7.2f} s  {st['rss_start_mib']:6,} -> {st['peak_mib']:6,} MiB")
    print(f"peak RSS of the pipeline process: {run['peak_rss_mib']:,} MiB")
    print(json.dumps({"document_mb": round(len(doc) / 1e6, 2), "max_seq_len": args.max_seq_len, **run}))
    return 0 if run["success"] and child.returncode == 0 else 1


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


if __name__ == "__main__":
    sys.exit(main())
