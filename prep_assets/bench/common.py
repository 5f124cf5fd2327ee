"""Shared pieces of the benchmarks: paths to the shared corpus, specs, corpora, timing and RSS."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prep_assets.core import bronze, gold, silver
from prep_assets.core.drops import register_drops
from prep_assets.core.gold import build_tokenizer
from prep_assets.core.lake import dataset_paths, read_json
from prep_assets.core.spec import DatasetSpec, parse_spec

SHARED = Path(__file__).resolve().parents[3] / "shared"  # beside the project folder
DEFAULT_SOURCE = SHARED / "datasets" / "bench" / "bench_pc.jsonl.gz"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "gpt2"
DEFAULT_HF_PATH_TOKENIZER = SHARED / "tokenizers" / "tinyllama"  # SentencePiece-style: gold encodes with HF


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
    build_tokenizer(spec, paths, data)
    key = sorted(p.stem for p in paths.drops_dir.glob("*.json"))[0]
    print(f"building gold of {source.name} once (cached in {work})", flush=True)
    t = time.perf_counter()
    b = bronze.build(spec, paths, key)
    t_b = time.perf_counter() - t
    s = silver.build(spec, paths, key)
    t_s = time.perf_counter() - t - t_b
    g = gold.build(spec, paths, key)
    t_g = time.perf_counter() - t - t_b - t_s
    stats = {
        "records": b.records,
        "kept": s.records,
        "examples": g.examples,
        "tokens": g.tokens,
        "seconds": {"bronze": t_b, "silver": t_s, "gold": t_g},
    }
    gold_dir = paths.partition_dir("gold", key)
    marker.write_text(json.dumps({"want": want, "gold": str(gold_dir), "stats": stats}), encoding="utf-8")
    return gold_dir, paths.tokenizer_dir, stats


def _missing(*paths: Path) -> bool:
    for p in paths:
        if not p.exists():
            print(f"error: {p} not found (pass --source / --tokenizer)", file=sys.stderr)
            return True
    return False


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


def _corpus_texts(corpus: Path) -> list[str]:
    texts = []
    with corpus.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts += [row.get("prompt") or "", row.get("completion") or ""]
    return texts


def bare_tokenizer(corpus: Path, tokenizer: Path, batch: int = 4096) -> tuple[int, float]:
    """(tokens, seconds) of the Rust tokenizer's `encode_batch_fast` over the corpus' prompts and completions
    (read and parsed beforehand: only encoding is timed)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    texts = _corpus_texts(corpus)
    tokens, start = 0, time.perf_counter()
    for lo in range(0, len(texts), batch):
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[lo : lo + batch], add_special_tokens=False))
    return tokens, time.perf_counter() - start


def bare_fast(corpus: Path, tokenizer: Path, batch: int = 4096) -> tuple[int, float] | str:
    """(tokens, seconds) of the bare fast engine over the same texts, as gold runs it (tiktoken in its worker
    processes, `encode_processes`; in two threads where the setting asks for none), or why `fast_bpe.decide`
    refuses this tokenizer (then gold encodes with HF). The workers' start is timed too, as gold pays it."""
    from concurrent.futures import ThreadPoolExecutor

    from prep_assets.core.encode_processes import EncodeProcesses, processes_setting
    from prep_assets.core.fast_bpe import THREADS, build_encoding, decide, encode_parallel

    text = (tokenizer / "tokenizer.json").read_text(encoding="utf-8")
    tj = json.loads(text)
    decision = decide(tj)
    if decision.pattern is None:
        return decision.reason
    texts = _corpus_texts(corpus)
    tokens, start = 0, time.perf_counter()
    if processes_setting() >= 2:
        workers = EncodeProcesses(text, decision.pattern, processes_setting())
        try:
            for lo in range(0, len(texts), batch):
                tokens += sum(map(len, workers.encode(texts[lo : lo + batch])))
        finally:
            workers.close()
        return tokens, time.perf_counter() - start
    enc = build_encoding(tj, decision.pattern)
    with ThreadPoolExecutor(THREADS) as pool:
        for lo in range(0, len(texts), batch):
            tokens += sum(map(len, encode_parallel(enc, texts[lo : lo + batch], pool)))
    return tokens, time.perf_counter() - start


def lists_children() -> bool:
    """Whether this kernel lists a thread's child processes (/proc/PID/task/TID/children): without it
    `tree_rss_pages` sees the process alone."""
    return Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def peak_label() -> str:
    """What the benchmarks' peak RSS measures here."""
    if lists_children():
        return "peak RSS of the pipeline process and its workers"
    return "peak RSS of the pipeline process (its workers unseen: this kernel lists no child processes)"


def _tree_totals(pid: int) -> tuple[int, int]:
    """(resident pages, CPU clock ticks: user + system) of process `pid` and of every process below it."""
    pages, ticks, todo = 0, 0, [pid]
    while todo:
        proc = Path(f"/proc/{todo.pop()}")
        try:
            pages += int((proc / "statm").read_bytes().split()[1])
            fields = (proc / "stat").read_bytes().rsplit(b")", 1)[1].split()  # after the command's name
            ticks += int(fields[11]) + int(fields[12])  # utime, stime: the stat file's 14th and 15th fields
            tasks = list((proc / "task").iterdir())
        except (OSError, ValueError, IndexError):  # the process has ended
            continue
        for task in tasks:  # a child is listed under the thread that started it
            try:
                todo += [int(child) for child in (task / "children").read_bytes().split()]
            except (OSError, ValueError):  # the thread has ended (its children are listed under another one)
                continue
    return pages, ticks


def tree_rss_pages(pid: int) -> int:
    """Resident pages of process `pid` and of every process below it (gold's tiktoken workers): each one's RSS,
    summed, so pages two of them share (their libraries) count twice: an upper bound."""
    return _tree_totals(pid)[0]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and the processes below it that still run."""
    return _tree_totals(pid)[1] / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """The resident memory of this process and its worker processes every 20 ms in a thread (`tree_rss_pages`), to
    tell which step peaked; and the CPU seconds they used so far, ended workers included (`cpu`)."""

    def __init__(self) -> None:
        import threading

        self.samples: list[tuple[float, float]] = []
        self.cpu_samples: list[tuple[float, float]] = []
        self._page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
        self._tick_s = 1 / os.sysconf("SC_CLK_TCK")
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pages, ticks = _tree_totals(self._pid)
            ended = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers that have ended and been waited for
            now = time.time()
            self.samples.append((now, pages * self._page_mib))
            self.cpu_samples.append((now, ticks * self._tick_s + ended.ru_utime + ended.ru_stime))
            self._stop.wait(0.02)

    def cpu(self, at: float) -> float:
        """The CPU seconds used by the time of the last sample at or before `at` (0 before the first)."""
        return max((cpu for t, cpu in self.cpu_samples if t <= at), default=0.0)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float, end: float) -> float:
        return max((rss for t, rss in self.samples if start <= t <= end), default=0.0)


def _step_peaks(instance: Any, run_id: str, rss: RssSampler) -> dict[str, dict[str, float]]:
    """Per step: its time span and the RSS of the process and its workers when it started and at their peak (MiB)."""
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
            "cpu_s": round(rss.cpu(b) - rss.cpu(a), 2),
            "rss_start_mib": round(rss.peak(a - 0.05, a + 0.05)),
            "peak_mib": round(rss.peak(a, b)),
        }
        for k, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0])
    }


def print_steps(steps: dict[str, dict[str, float]]) -> None:
    """A run's steps as `DropRun.summary` gives them: time, RSS at the start and the peak."""
    print("  steps (time; CPU seconds of the process and its workers; their RSS when the step started -> their peak):")
    for step, st in steps.items():
        print(
            f"    {step:<58} {st['s']:7.2f} s  {st.get('cpu_s', 0):6.2f} CPU s  "
            f"{st['rss_start_mib']:6,} -> {st['peak_mib']:6,} MiB"
        )


@dataclass(frozen=True)
class DropRun:
    """One drop's layers materialized through Dagster in this process, as the benchmark children run them."""

    tokenizer_ok: bool
    result: Any  # the layers' ExecuteInProcessResult
    wall: float  # seconds for the layers and their gates
    peaks: dict[str, dict[str, float]]  # RSS per step
    gold: gold.GoldStats

    def summary(self) -> dict[str, Any]:
        """What every benchmark child prints of a run: success, wall time, RSS per step and the highest of them (the
        process with its workers), the gates."""
        checks = self.result.get_asset_check_evaluations()
        return {
            "success": self.result.success and self.tokenizer_ok,
            "wall_s": self.wall,
            "steps": self.peaks,
            "sampled_peak_mib": max((st["peak_mib"] for st in self.peaks.values()), default=0),
            "checks": len(checks),
            "checks_passed": sum(c.passed for c in checks),
            "tokens": self.gold.tokens,
        }


def run_drop(data: Path, spec: DatasetSpec, *, sample_tokenizer: bool = False) -> DropRun:
    """Pin the tokenizer, then bronze -> shards with every gate of the data dir's one drop, on an ephemeral
    instance; RSS is sampled over the layers (and the tokenizer too, with `sample_tokenizer`)."""
    from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

    from prep_assets.core.drops import register_drops
    from prep_assets.core.lake import STATS, dataset_paths, read_json
    from prep_assets.definitions import dataset_assets
    from prep_assets.defs.keys import PARTITIONED, TOKENIZER
    from prep_assets.defs.resources import LakeResource

    paths = dataset_paths(data, spec.name)
    (drop,), _ = register_drops(paths)
    assets = dataset_assets(spec)
    resources = {"lake": LakeResource(data_dir=str(data))}
    layers = AssetSelection.assets(*(AssetKey([spec.name, n]) for n in PARTITIONED))
    rss = RssSampler()
    with DagsterInstance.ephemeral() as instance, ExitStack() as sampling:
        instance.add_dynamic_partitions(f"{spec.name}_drops", [drop.partition])
        if sample_tokenizer:
            sampling.enter_context(rss)
        tok = materialize(assets, selection=[AssetKey([spec.name, TOKENIZER])], instance=instance, resources=resources)
        if not sample_tokenizer:
            sampling.enter_context(rss)
        start = time.perf_counter()
        result = materialize(
            assets,
            selection=layers,
            partition_key=drop.partition,
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
        wall = time.perf_counter() - start
        sampling.close()
        peaks = _step_peaks(instance, result.run_id, rss)
    stats = gold.GoldStats.from_json(read_json(paths.partition_dir("gold", drop.partition) / STATS))
    return DropRun(tok.success, result, wall, peaks, stats)
