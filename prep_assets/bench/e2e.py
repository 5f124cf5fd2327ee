"""`bench e2e`: the whole pipeline through Dagster against the bare tokenizer, with peak RSS."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from prep_assets import NO_TORCH_ENV
from prep_assets.bench.common import (
    _missing,
    _spec,
    bare_fast,
    bare_tokenizer,
    pc_corpus,
    peak_label,
    print_steps,
    run_drop,
)

CORES = os.cpu_count() or 1


def _e2e_child(work: Path, tokenizer: Path, max_seq_len: int) -> int:
    """In a fresh process: tokenizer, then bronze -> shards of the one drop through Dagster; prints JSON."""
    from prep_assets.defs.keys import PARTITIONED, TOKENIZED_EXAMPLES

    run = run_drop(work / "data", _spec(tokenizer, max_seq_len))
    steps: dict[str, float] = {}
    for event in run.result.get_step_success_events():
        layer = next((n for n in PARTITIONED if n in (event.step_key or "")), "other")
        steps[layer] = steps.get(layer, 0.0) + event.event_specific_data.duration_ms / 1000  # type: ignore[union-attr]
    # the time around gold: the run but gold's own step (every gate, and Dagster's time between steps)
    is_gold = {key: key.endswith(f"__{TOKENIZED_EXAMPLES}") for key in run.peaks}
    gold_step = next((st["s"] for key, st in run.peaks.items() if is_gold[key]), 0.0)
    around = run.wall - gold_step
    # the CPU the steps around gold used (their processes and workers): on N cores they take at least this / N
    around_cpu = sum(st.get("cpu_s", 0.0) for key, st in run.peaks.items() if not is_gold[key])
    print(
        json.dumps(
            {
                **run.summary(),
                "layers_s": steps,
                "around_gold_s": around,
                "around_gold_cpu_s": round(around_cpu, 2),
                "examples": run.gold.examples,
            }
        )
    )
    return 0 if run.result.success else 1


def _e2e_run(work: Path, tokenizer: Path, max_seq_len: int) -> dict[str, Any] | None:
    """One measured pipeline run in a fresh process on a fresh lake (the drop stays); None if it failed."""
    import subprocess

    shutil.rmtree(work / "data" / "lake", ignore_errors=True)
    child = subprocess.run(
        [sys.executable, "-m", "prep_assets.bench", "_e2e_child", str(work), str(tokenizer), str(max_seq_len)],
        capture_output=True,
        text=True,
        env={**os.environ, NO_TORCH_ENV: "1"},  # measured as the pipeline's own processes run
    )
    if child.returncode != 0 or not child.stdout.strip():
        print(child.stdout[-2000:], child.stderr[-4000:], file=sys.stderr)
        return None
    return dict(json.loads(child.stdout.strip().splitlines()[-1]))


HF_ANCHOR, FAST_ANCHOR = "bare HF encode_batch_fast", "bare tiktoken"


def _anchors(corpus: Path, tokenizer: Path) -> dict[str, tuple[int, float]]:
    """Each anchor's (tokens, seconds) over the corpus' prompts and completions, timed now, and printed (the fast
    engine's only if `fast_bpe.decide` accepts the tokenizer, else why not)."""
    out = {HF_ANCHOR: bare_tokenizer(corpus, tokenizer)}
    timed = bare_fast(corpus, tokenizer)
    if isinstance(timed, str):
        print(f"{FAST_ANCHOR}: not used for this tokenizer ({timed}); gold encodes with HF")
    else:
        out[FAST_ANCHOR] = timed
    for name, (tokens, sec) in out.items():
        print(f"{name}: {tokens:,} tokens in {sec:.2f} s = {tokens / sec / 1e6:.3f} M tokens/s", flush=True)
    return out


def _measured_runs(
    work: Path, corpus: Path, tokenizer: Path, max_seq_len: int, repeat: int, label: str = ""
) -> tuple[list[dict[str, Any]], dict[str, tuple[int, float]]] | None:
    """`repeat` pipeline runs with `tokenizer`, each held against the anchors timed right before and after it (this
    machine's speed drifts by +-10% within minutes); printed as they go. None if a run failed."""
    anchors = _anchors(corpus, tokenizer)
    results = []
    for k in range(repeat):
        run = _e2e_run(work, tokenizer, max_seq_len)
        if run is None:
            return None
        before, anchors = anchors, _anchors(corpus, tokenizer)
        e2e = run["tokens"] / run["wall_s"]
        ratios = {name: e2e * (before[name][1] + anchors[name][1]) / 2 / anchors[name][0] for name in anchors}
        results.append({**run, "e2e": e2e, "ratio": ratios[HF_ANCHOR], "ratios": ratios})
        print(
            f"{label}run {k + 1}/{repeat}: end to end through Dagster (bronze -> shards, {run['checks_passed']}/"
            f"{run['checks']} checks passed): {run['tokens']:,} tokens in {run['wall_s']:.2f} s = "
            f"{e2e / 1e6:.3f} M tokens/s"
        )
        for layer, sec in run["layers_s"].items():
            print(f"  {layer:<20} {sec:8.2f} s")
        print(
            f"  around gold (every step but gold's own, all gates included): {run['around_gold_s']:.2f} s, "
            f"{run['around_gold_cpu_s']:.2f} CPU s over its steps (at least {run['around_gold_cpu_s'] / CORES:.2f} s "
            f"on {CORES} cores)"
        )
        print_steps(run["steps"])
        for name, ratio in ratios.items():
            print(
                f"  end-to-end / {name}: {ratio:.3f} (the anchor before the run {before[name][1]:.2f} s, "
                f"after it {anchors[name][1]:.2f} s)",
                flush=True,
            )
    return results, anchors


def _hf_path_run(work: Path, corpus: Path, args: argparse.Namespace) -> dict[str, Any] | None | str:
    """One run with `--hf-path`'s tokenizer (one tiktoken does not implement, e.g. SentencePiece-style TinyLlama),
    so gold's HF path is measured in the same invocation: its figures, None if it failed, or why it was skipped."""
    if args.hf_path in (None, "", "none"):
        return "not asked (--hf-path none)"
    tokenizer = Path(args.hf_path).resolve()
    if not tokenizer.is_dir():
        return f"{tokenizer} not found"
    print(f"the HF path: {tokenizer.name}", flush=True)
    measured = _measured_runs(work, corpus, tokenizer, args.max_seq_len, 1, label=f"{tokenizer.name} ")
    if measured is None:
        return None
    (run,), anchors = measured
    return {
        "tokenizer": tokenizer.name,
        "engine": "tiktoken" if FAST_ANCHOR in anchors else "hf",
        "ratio": round(run["ratio"], 3),
        "e2e_tokens_per_s": round(run["e2e"]),
        "anchor_tokens_per_s": round(anchors[HF_ANCHOR][0] / anchors[HF_ANCHOR][1]),
        "wall_s": round(run["wall_s"], 2),
        "around_gold_s": round(run["around_gold_s"], 2),
        "around_gold_cpu_s": run["around_gold_cpu_s"],
        "layers_s": {k: round(v, 2) for k, v in run["layers_s"].items()},
        "peak_rss_mib": run["sampled_peak_mib"],
    }


def bench_e2e(args: argparse.Namespace) -> int:
    source, tokenizer = Path(args.source), Path(args.tokenizer).resolve()  # the spec reads it from the data dir
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
    measured = _measured_runs(work, corpus, tokenizer, args.max_seq_len, args.repeat)
    if measured is None:
        return 1
    results, anchors = measured
    # the largest single process (its whole life), or the layers' process with its workers summed, if larger
    sampled = max((r["sampled_peak_mib"] for r in results), default=0)
    peak = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, sampled)
    mid = sorted(results, key=lambda r: r["ratio"])[(len(results) - 1) // 2]  # the median run (the lower middle)
    for name in anchors:
        ratios = sorted(r["ratios"][name] for r in results)
        print(
            f"end-to-end / {name} over {len(results)} runs: median {ratios[(len(ratios) - 1) // 2]:.3f}, "
            f"min {ratios[0]:.3f}, max {ratios[-1]:.3f}"
        )
    print(f"{peak_label()}: {peak:,.0f} MiB")
    hf_path = _hf_path_run(work, corpus, args)
    if hf_path is None:
        return 1
    if isinstance(hf_path, dict):
        print(
            f"{hf_path['tokenizer']} (gold on {hf_path['engine']}): end-to-end / {HF_ANCHOR} {hf_path['ratio']:.3f}, "
            f"peak RSS {hf_path['peak_rss_mib']:,} MiB"
        )
    else:
        print(f"the HF path: {hf_path}")
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
                "ratio_fast": round(mid["ratios"][FAST_ANCHOR], 3) if FAST_ANCHOR in mid["ratios"] else None,
                "anchors_tokens_per_s": {name: round(t / sec) for name, (t, sec) in anchors.items()},
                "e2e_tokens_per_s": round(mid["e2e"]),
                "wall_s": round(mid["wall_s"], 2),
                "around_gold_s": round(mid["around_gold_s"], 2),
                "around_gold_cpu_s": mid["around_gold_cpu_s"],
                "layers_s": {k: round(v, 2) for k, v in mid["layers_s"].items()},
                "peak_rss_mib": round(peak),
                "checks_passed": mid["checks_passed"],
                "checks": mid["checks"],
                "hf_path": hf_path,
            }
        )
    )
    return 0 if all(r["success"] for r in results) else 1
