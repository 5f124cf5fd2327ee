"""Near-duplicate precision and recall on a labelled set built from real documents.

Each source document is kept once; a share of them also get a programmatic near copy: a few words replaced,
paragraphs reordered, or boilerplate appended. Near dedup (the silver layer's, with the spec's settings)
should remove exactly the copies: precision = removed copies / removed, recall = removed copies / copies.
Used by `python -m prep_assets.bench near` and by the tests.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.lake import REJECTS, dataset_paths
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import parse_spec

BOILERPLATE = (
    "Subscribe to our newsletter for weekly updates. All rights reserved. Terms of use and privacy "
    "policy apply to this page."
)
EDITS = ("words", "paragraphs", "boilerplate")


def near_copy(text: str, kind: str, rng: random.Random) -> str:
    if kind == "words":  # about 2% of the words (at least 2) replaced
        words = text.split(" ")
        for i in rng.sample(range(len(words)), max(2, len(words) // 50)):
            words[i] = rng.choice(["alpha", "delta", "omega", "sigma", "kappa"])
        return " ".join(words)
    if kind == "paragraphs":
        paras = text.split("\n")
        if len(paras) < 2:
            return text + "\n"
        shuffled = paras[:]
        while shuffled == paras:
            rng.shuffle(shuffled)
        return "\n".join(shuffled)
    return text + "\n" + BOILERPLATE


@dataclass(frozen=True)
class NearEval:
    documents: int
    copies: int
    removed: int
    removed_copies: int  # the later record of a pair, removed naming its partner
    seconds: float

    @property
    def precision(self) -> float:
        return self.removed_copies / self.removed if self.removed else 1.0

    @property
    def recall(self) -> float:
        return self.removed_copies / self.copies if self.copies else 1.0


def labelled_rows(
    source: Path, *, min_words: int = 80, copy_share: float = 0.5, seed: int = 0
) -> tuple[list[str], dict[int, int]]:
    """Distinct documents of at least `min_words` words plus near copies of a share of them, shuffled together.
    Returns the rows and, for each pair, the later line (1-based) -> the earlier one: what should be removed,
    naming what."""
    docs = []
    seen = set()
    with source.open(encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            if len(text.split()) >= min_words and text not in seen:
                seen.add(text)
                docs.append(text)
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(docs)), int(len(docs) * copy_share)))
    items = [(i, t) for i, t in enumerate(docs)] + [
        (i, near_copy(docs[i], EDITS[n % len(EDITS)], rng)) for n, i in enumerate(picked)
    ]
    rng.shuffle(items)
    first: dict[int, int] = {}
    pairs: dict[int, int] = {}
    for line, (doc, _) in enumerate(items, start=1):
        if doc in first:
            pairs[line] = first[doc]
        else:
            first[doc] = line
    return [t for _, t in items], pairs


def evaluate_near(source: Path, near: dict | None = None, work: Path | None = None) -> NearEval:
    """Run the silver layer with `dedup: near` over the labelled set and score what it removed."""
    rows, pairs = labelled_rows(source)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        data = Path(tmp)
        spec = parse_spec(
            {
                "input": {"type": "text"},
                "tokenizer": {"path": "/unused"},
                "clean": {"dedup": "near", **({"near": near} if near else {})},
            },
            path=Path("near.yaml"),
            default_name="near",
        )
        paths = dataset_paths(data, "near")
        paths.raw_dir.mkdir(parents=True)
        (paths.raw_dir / "labelled.jsonl").write_text(
            "".join(json.dumps({"text": r}) + "\n" for r in rows), encoding="utf-8"
        )
        (drop,), _ = register_drops(paths)
        _, src = resolve_drop(paths, drop.partition)
        bronze, silver = paths.partition_dir("bronze", drop.partition), paths.partition_dir("silver", drop.partition)
        build_raw_records(spec, drop, src, bronze)
        start = time.perf_counter()
        build_clean_records(spec, bronze, silver)
        seconds = time.perf_counter() - start
        rejects = pq.read_table(silver / REJECTS, columns=["source_line", "duplicate_of"]).to_pylist()
    removed = {r["source_line"]: int(r["duplicate_of"].rsplit(":", 1)[1]) for r in rejects if r["duplicate_of"]}
    right = sum(1 for line, of in removed.items() if pairs.get(line) == of)
    return NearEval(len(rows) - len(pairs), len(pairs), len(removed), right, seconds)
