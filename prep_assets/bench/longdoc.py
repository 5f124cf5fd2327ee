"""`bench longdoc`: one long document through every layer and gate, with peak RSS."""

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
    peak_label,
    print_steps,
    run_drop,
)


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
    from prep_assets.core.spec import load_spec

    data = work / "data"
    run = run_drop(data, load_spec(data / "datasets" / "longdoc.yaml"), sample_tokenizer=True)
    checks = run.result.get_asset_check_evaluations()
    summary = {
        **run.summary(),
        "failed": [c.check_name for c in checks if not c.passed],
        "failed_steps": [e.step_key for e in run.result.all_events if e.is_step_failure],
    }
    # this process' whole life, or the layers with their workers summed, if larger
    summary["peak_rss_mib"] = max(round(_own_peak_kib() / 1024), summary["sampled_peak_mib"])
    print(json.dumps(summary))
    return 0 if run.result.success else 1


def bench_longdoc(args: argparse.Namespace) -> int:
    import subprocess

    import yaml

    tokenizer = Path(args.tokenizer).resolve()  # the spec reads it from the data dir
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
        [sys.executable, "-m", "prep_assets.bench", "_longdoc_child", str(work)],
        capture_output=True,
        text=True,
        env={**os.environ, NO_TORCH_ENV: "1"},  # measured as the pipeline's own processes run
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
    print_steps(run["steps"])
    print(f"{peak_label()}: {run['peak_rss_mib']:,} MiB")
    print(json.dumps({"document_mb": round(len(doc) / 1e6, 2), "max_seq_len": args.max_seq_len, **run}))
    return 0 if run["success"] and child.returncode == 0 else 1


def _own_peak_kib() -> int:
    """This process' peak RSS since it started (VmHWM): `ru_maxrss` would also count what the process that
    forked it held, as Linux carries that high-water mark across exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
