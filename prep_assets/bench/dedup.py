"""`bench dedup` and `bench near`: silver's dedup throughput and near-dedup precision/recall."""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from prep_assets.bench.common import (
    SHARED,
)
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.lake import dataset_paths
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import parse_spec

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
            "kept": st.records,
            "removed": st.rejects_by_reason,
        }
        print(
            f"  silver dedup {mode:<6}    {sec:8.2f} s  {mb / sec:8.2f} MB/s  {n / sec:10,.0f} records/s  "
            f"kept {st.records:,}  removed {st.rejects_by_reason}"
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
