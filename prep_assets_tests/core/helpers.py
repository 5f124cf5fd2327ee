"""Helpers the core test modules share: the layers run in core (no Dagster), a pinned tokenizer, silver of rows
built here, bronze built in a child process, a Megatron index reader, GPT-Simple's own modules."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import random
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from prep_assets.core import gates
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.build import build_partition
from prep_assets.core.drops import register_drops, registered_drops, resolve_drop
from prep_assets.core.gold import build_tokenizer
from prep_assets.core.lake import DatasetPaths, dataset_paths
from prep_assets.core.manifest import build_manifest
from prep_assets.core.masking import TokenizedBatch
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import DatasetSpec, load_spec
from prep_assets.core.tokenizer import PinnedTokenizer, load_pinned, pin_tokenizer
from prep_assets_tests.conftest import SAMPLE_DATA, make_spec, shared_path, tree_digests, write_head

# ---------------------------------------------------------------- every layer in core


def run_core(data_dir: Path, spec: DatasetSpec, batch_size: int = 4096) -> dict:
    """Register the drops under `data_dir/raw/<name>`, pin the tokenizer, build every layer of every drop and the
    manifest; per drop key: each layer's stats, its four partition dirs ("dirs") and the drop's source file."""
    paths = dataset_paths(data_dir, spec.name)
    register_drops(paths)
    build_tokenizer(spec, paths, data_dir)
    out = {}
    for key in sorted(p.stem for p in paths.drops_dir.glob("*.json")):
        out[key] = {
            **build_partition(spec, paths, key, batch_size=batch_size),
            "dirs": tuple(paths.partition_dir(x, key) for x in ("bronze", "silver", "gold", "shards")),
            "source": resolve_drop(paths, key)[1],
        }
    build_manifest(spec, paths, list(out))
    return out


def write_raw(data_dir: Path, name: str, files: dict[str, str]) -> Path:
    """Drops written as text under `data_dir/raw/<name>` (file name -> contents); returns `data_dir`."""
    raw = data_dir / "raw" / name
    raw.mkdir(parents=True)
    for fname, text in files.items():
        (raw / fname).write_text(text, encoding="utf-8")
    return data_dir


def run_one_file(data_dir: Path, spec: DatasetSpec, src: Path) -> tuple[str, dict]:
    """`src` copied in as the one drop of the spec's dataset, then `run_core`: its drop key and result."""
    raw = data_dir / "raw" / spec.name
    raw.mkdir(parents=True)
    shutil.copyfile(src, raw / src.name)
    ((key, result),) = run_core(data_dir, spec).items()
    return key, result


def failed_gates(spec: DatasetSpec, data_dir: Path, key: str) -> list[tuple[str, list]]:
    """Every gate of the drop that fails, with its first two offending rows ([] when all pass)."""
    return [
        (o.name, o.offending[:2])
        for o in gates.evaluate(spec, dataset_paths(data_dir, spec.name), key)
        if not o.passed
    ]


def read_records(path: Path) -> list[Any]:
    """A raw file's values: a JSON array (.json) or JSON lines, gzipped or not (.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if path.suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- tokenizers and masks


def pin_and_load(spec: DatasetSpec, tmp_path: Path) -> PinnedTokenizer:
    """The spec's tokenizer pinned under `tmp_path/tok` and loaded back as the gold layer loads it."""
    dest = tmp_path / "tok"
    dest.mkdir(parents=True, exist_ok=True)
    pin_tokenizer(spec.tokenizer, base=tmp_path, dest=dest)
    return load_pinned(dest)


def batch_examples(tb: TokenizedBatch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A tokenized batch cut into its examples: (token ids, loss mask, token types) of each."""
    return [
        (tb.token_ids[a:b], tb.loss_mask[a:b], tb.token_type_ids[a:b]) for a, b in zip(tb.offsets[:-1], tb.offsets[1:])
    ]


def mask_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) index runs where `mask` is non-zero."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


# ---------------------------------------------------------------- silver of rows built here

WORDS = (
    "river gauge station report morning evening rain wind north south bridge valley meadow forest "
    "stone harbor tide signal lamp engine crew ferry market square bakery mill"
).split()


def random_doc(rng: random.Random, n: int = 120) -> str:
    """`n` numbered words drawn from WORDS: documents that are distinct unless copied."""
    return " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(n))


def silver_of(tmp: Path, rows: list[dict], **clean: Any) -> tuple[list[dict], list[dict], dict]:
    """Bronze then silver of `rows` (one JSONL drop of dataset "ds" under `tmp`): kept rows, rejects, stats."""
    spec = make_spec("ds", input={"type": "chat"} if "messages" in rows[0] else {"type": "text"}, clean=clean)
    paths = dataset_paths(tmp, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (drop,), _ = register_drops(paths)
    _, src = resolve_drop(paths, drop.partition)
    b, s = paths.partition_dir("bronze", drop.partition), paths.partition_dir("silver", drop.partition)
    build_raw_records(spec, drop, src, b)
    stats = build_clean_records(spec, b, s)
    return pq.read_table(s / "records.parquet").to_pylist(), pq.read_table(s / "rejects.parquet").to_pylist(), stats


# ---------------------------------------------------------------- bronze, in this process or a child

BRONZE_FILES = ("records.parquet", "rejects.parquet", "accounting.json")


def build_bronze(spec: DatasetSpec, paths: DatasetPaths) -> dict[str, dict[str, str]]:
    """Bronze of every registered drop, in registration order, with the real builder; returns the sha256 of each
    partition's bronze files right after its build (a later drop must not change them)."""
    snapshots: dict[str, dict[str, str]] = {}
    for drop in sorted(registered_drops(paths).values(), key=lambda d: d.seq):
        registered, source = resolve_drop(paths, drop.partition)
        build_raw_records(spec, registered, source, paths.partition_dir("bronze", drop.partition))
        snapshots[drop.partition] = bronze_digests(paths, drop.partition)
    return snapshots


def bronze_digests(paths: DatasetPaths, partition: str) -> dict[str, str]:
    out = paths.partition_dir("bronze", partition)
    return {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in BRONZE_FILES}


def proc_status_kb(field_name: str) -> int:
    for row in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if row.startswith(field_name + ":"):
            return int(row.split()[1])
    raise KeyError(field_name)


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return proc_status_kb("VmHWM") <= proc_status_kb("VmRSS") + 1024


def child_build_main(argv: list[str]) -> None:
    """Subprocess entry: build bronze of a prepared data dir; print its RSS before, its peak RSS while building
    (VmHWM after a reset, else the rusage high-water mark) and the time taken."""
    import resource

    data_dir, name, sections = Path(argv[0]), argv[1], json.loads(argv[2])
    spec = make_spec(name, **sections)
    paths = dataset_paths(data_dir, name)
    reset = reset_peak_rss()  # every import done: what follows is the build alone
    baseline_kb = proc_status_kb("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    snapshots = build_bronze(spec, paths)
    seconds = time.perf_counter() - start
    peak_kb = proc_status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "baseline_kb": baseline_kb,
                "peak_kb": peak_kb,
                "peak_from": "VmHWM" if reset else "ru_maxrss",
                "seconds": seconds,
                "snapshots": snapshots,
            }
        )
    )


# ---------------------------------------------------------------- Megatron's indexed dataset


def read_mmidx(prefix: Path) -> dict:
    """A reader written from Megatron-LM's published MMIDIDX layout (megatron/core/datasets/indexed_dataset.py)."""
    idx = prefix.with_suffix(".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx[9:17])
    (code,) = struct.unpack("<B", idx[17:18])
    seqs, docs = struct.unpack("<QQ", idx[18:34])
    at = 34
    sizes = np.frombuffer(idx, dtype="<i4", count=seqs, offset=at)
    at += 4 * seqs
    pointers = np.frombuffer(idx, dtype="<i8", count=seqs, offset=at)
    at += 8 * seqs
    doc_idx = np.frombuffer(idx, dtype="<i8", count=docs, offset=at)
    at += 8 * docs
    dtype = {8: np.uint16, 4: np.int32}[code]
    data = np.memmap(prefix.with_suffix(".bin"), dtype=dtype, mode="r")
    return {
        "version": version,
        "code": code,
        "sizes": sizes,
        "pointers": pointers,
        "doc_idx": doc_idx,
        "rest": len(idx) - at,
        "data": data,
        "itemsize": np.dtype(dtype).itemsize,
    }


# ---------------------------------------------------------------- shipped sample specs, changed


def sample_spec(data_dir: Path, name: str, **changes: Any) -> DatasetSpec:
    """The shipped sample spec `name` with top-level sections updated, written into `data_dir` and loaded."""
    raw = yaml.safe_load((SAMPLE_DATA / "datasets" / f"{name}.yaml").read_text(encoding="utf-8"))
    for section, values in changes.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = data_dir / "datasets" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return load_spec(path, data_dir)


def gold_documents(gold_dir: Path) -> dict[str, list[list[int]]]:
    """Per split, the token ids of its gold examples in gold order."""
    out: dict[str, list[list[int]]] = {}
    for row in pq.read_table(gold_dir / "examples.parquet", columns=["split", "token_ids"]).to_pylist():
        out.setdefault(row["split"], []).append(row["token_ids"])
    return out


# ---------------------------------------------------------------- GPT-Simple's own modules


@contextmanager
def gpt_simple_modules(package_dir: Path, *names: str) -> Iterator[tuple[Any, ...]]:
    """GPT-Simple's modules `names` (e.g. "validate"), imported without the package's `__init__` (it imports the
    trainer: torch, accelerate); within the block only: every gpt_simple module leaves `sys.modules` after it."""
    before = set(sys.modules)
    package = ModuleType("gpt_simple")
    package.__path__ = [str(package_dir)]
    sys.modules["gpt_simple"] = package
    try:
        try:
            modules = tuple(importlib.import_module(f"gpt_simple.{n}") for n in names)
        except ImportError as exc:
            pytest.skip(f"gpt_simple's modules {names} do not import here: {exc}")
        yield modules
    finally:
        for name in set(sys.modules) - before:
            if name.split(".")[0] == "gpt_simple":
                del sys.modules[name]


def gpt2_lake(data_dir: Path, long_chars: int = 0, batch_size: int = 4096) -> dict[str, str]:
    """A small lake over real data with GPT-2: instructions and documents, with one long document (encoded in
    pieces) of `long_chars` characters of Shakespeare if asked, built `batch_size` records at a time; the digest of
    every file."""
    write_head(shared_path("datasets/instruction/gdp_generative_tuning.jsonl"), data_dir / "raw" / "inst", 150)
    write_head(shared_path("datasets/text/c4_demo.jsonl"), data_dir / "raw" / "text", 40)
    if long_chars:
        long = shared_path("datasets/text/tinyshakespeare.txt").read_text(encoding="utf-8")[:long_chars]
        (data_dir / "raw" / "text" / "long.jsonl").write_text(json.dumps({"text": long}) + "\n", encoding="utf-8")
    tok = {"path": str(shared_path("tokenizers/gpt2"))}
    seq = {"max_seq_len": 256, "overflow": "window"}
    for name, inp in (("inst", {"type": "instruction"}), ("text", {"type": "text"})):
        run_core(data_dir, make_spec(name, input=inp, tokenizer=tok, sequence=seq), batch_size)
    return tree_digests(data_dir / "lake", skip_hidden_names=True)
