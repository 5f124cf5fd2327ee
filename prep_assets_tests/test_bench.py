"""The benchmark script keeps working (its figures are printed, never asserted as timings)."""

import re
from pathlib import Path

import pytest

from prep_assets import bench
from prep_assets.core import shards
from prep_assets_tests.conftest import shared_path


def _bfd_rows(out: str) -> tuple[int, int]:
    found = re.search(r"bfd: ([\d,]+) rows \(lower bound ([\d,]+)", out)
    assert found, out
    rows, bound = (int(x.replace(",", "")) for x in found.groups())
    return rows, bound


def test_packing_benchmark_prints_figures_for_each_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    src = shared_path("datasets/instruction/gdp_generative_tuning.jsonl")
    args = [
        "packing",
        "--source",
        str(src),
        "--tokenizer",
        str(shared_path("tokenizers/gpt2")),
        "--max-seq-len",
        "512",
        "--strategies",
        "bfd,full",
        "--work",
        str(tmp_path / "work"),
    ]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "bfd: " in out and "full: " in out and out.count("M tokens/s") == 3 + 2 * 3
    rows, bound = _bfd_rows(out)
    assert rows > 0 and bound > 0  # (windows without a loss token are dropped: rows may fall below the bound)
    # rows are built a chunk at a time, as the shards layer builds them: 5-row chunks count the same rows
    monkeypatch.setattr(shards, "SHARD_CHUNK_ROWS", 5)
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "building gold" not in out  # gold reused
    assert _bfd_rows(out) == (rows, bound)


def test_packing_benchmark_missing_source_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert bench.main(["packing", "--source", str(tmp_path / "none.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err


def test_dedup_benchmark_prints_throughput_for_exact_and_near(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    shared_path("datasets/text")
    assert bench.main(["dedup", "--mb", "2", "--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert "silver dedup exact" in out and "silver dedup near" in out and out.count("MB/s") == 2
    assert "near_duplicate" in out  # the corpus holds near copies and they are found


def test_e2e_benchmark_prints_both_anchors_ratios_layers_and_peak_rss_of_each_run_and_the_median(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    import json

    shared_path("datasets/bench/bench_pc.jsonl.gz")
    shared_path("tokenizers/gpt2")
    shared_path("tokenizers/tinyllama")
    assert (
        bench.main(["e2e", "--mb", "1", "--max-seq-len", "1024", "--work", str(tmp_path / "work"), "--repeat", "2"])
        == 0
    )
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["runs"] == 2 and len(figures["ratios"]) == 2 and figures["ratio"] == min(figures["ratios"])
    assert out.count("run 1/2: end to end") == out.count("run 2/2: end to end") == 1 and "median" in out
    assert figures["checks_passed"] == figures["checks"] == 20
    assert set(figures["layers_s"]) == {"raw_records", "clean_records", "tokenized_examples", "packed_shards"}
    assert out.count("around gold (every step") == 3
    # the time around gold is the run's wall time less gold's own step (not its gates step)
    first = out[out.index("run 1/2: end to end") :]
    wall = float(re.search(r"tokens in ([\d.]+) s", first).group(1))  # type: ignore[union-attr]
    gold_step = float(re.search(r"bench__tokenized_examples +([\d.]+) s", first).group(1))  # type: ignore[union-attr]
    around = float(re.search(r"around gold \(every step[^:]*: ([\d.]+) s", first).group(1))  # type: ignore[union-attr]
    assert abs(around - (wall - gold_step)) <= 0.02 and 0 < figures["around_gold_s"] < figures["wall_s"]
    # and the CPU its steps used, each step's printed beside its time
    cpu = float(re.search(r"around gold \(every step[^)]*\): [\d.]+ s, ([\d.]+) CPU s", first).group(1))  # type: ignore[union-attr]
    assert 0 < cpu and 0 < figures["around_gold_cpu_s"] and "CPU s" in first.split("bench__raw_records", 1)[1]
    assert set(figures["anchors_tokens_per_s"]) == {"bare HF encode_batch_fast", "bare tiktoken"}
    assert 0 < figures["ratio"] and 0 < figures["ratio_fast"] and figures["peak_rss_mib"] > 0
    assert "end-to-end / bare HF encode_batch_fast" in out and "end-to-end / bare tiktoken" in out
    # then one run on the HF path (TinyLlama: SentencePiece-style, so tiktoken does not apply)
    hf_path = figures["hf_path"]
    assert hf_path["tokenizer"] == "tinyllama" and hf_path["engine"] == "hf" and hf_path["ratio"] > 0
    assert "bare tiktoken: not used for this tokenizer" in out and "tinyllama run 1/1: end to end" in out


def test_e2e_benchmark_skips_the_hf_path_run_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import json

    shared_path("datasets/bench/bench_pc.jsonl.gz")
    shared_path("tokenizers/gpt2")
    work = str(tmp_path / "work")
    assert bench.main(["e2e", "--rows", "50", "--max-seq-len", "1024", "--work", work, "--hf-path", "none"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["hf_path"] == "not asked (--hf-path none)" and figures["runs"] == 1


def test_e2e_benchmark_refuses_fewer_than_one_run(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        bench.main(["e2e", "--repeat", "0"])
    assert "at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_longdoc_benchmark_one_long_document_passes_every_gate_within_bounded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    """~1 MB of text (~240k GPT-2 tokens) in one document, packed `full` into ~940 rows: every gate passes with
    DuckDB held to 128 MB (joining the whole example once per segment asked for more), the run under 1 GiB."""
    from prep_assets.core import sql

    monkeypatch.setenv(sql.MEMORY_ENV, "128MB")  # inherited by the benchmark's child process
    args = [
        "longdoc",
        "--mb",
        "1",
        "--max-seq-len",
        "256",
        "--tokenizer",
        str(shared_path("tokenizers/gpt2")),
        "--work",
        str(tmp_path / "work"),
    ]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"1\.00 MB", out) and "20/20 checks passed" in out
    tokens = int(re.search(r"([\d,]+) tokens in", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert tokens > 200_000
    found = re.search(r"peak RSS of the pipeline process[^:]*: ([\d,]+) MiB", out)
    assert found, out
    assert int(found.group(1).replace(",", "")) < 1024, out


def _resident_mib(pid: int) -> float:
    import os

    return int(Path(f"/proc/{pid}/statm").read_bytes().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or not bench.common.lists_children(),
    reason="reads the child processes /proc lists (Linux)",
)
def test_the_memory_sampled_counts_a_worker_started_from_another_thread():
    """Gold's tiktoken workers are processes of their own, started by a pool thread: a benchmark that read only its
    own RSS left them out."""
    import os
    import subprocess
    import sys
    import threading
    import time

    from prep_assets.bench.common import RssSampler, tree_rss_pages

    page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    holds = "import sys; b = bytearray(64 << 20); sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
    started: list[subprocess.Popen[bytes]] = []
    starter = threading.Thread(
        target=lambda: started.append(
            subprocess.Popen([sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        )
    )
    starter.start()
    starter.join()  # the thread has ended: its child is listed under another thread of this process
    (child,) = started
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        with RssSampler() as sampler:
            before = _resident_mib(os.getpid())
            tree = tree_rss_pages(os.getpid()) * page_mib
            after = _resident_mib(os.getpid())
            worker = _resident_mib(child.pid)
            time.sleep(0.1)
    finally:
        child.communicate()
    assert worker > 64
    assert tree >= min(before, after) + worker - 4, (before, after, worker, tree)
    assert sampler.peak(0, time.time()) >= min(before, after) + worker - 4
    assert tree_rss_pages(2**22 + 12345) == 0  # no such process: nothing, no error


def test_the_cpu_sampled_counts_a_worker_also_after_it_ended():
    """The steps' CPU seconds include gold's worker processes: while they run (their /proc stat) and after they
    ended (the process' reaped children)."""
    import subprocess
    import sys
    import time

    from prep_assets.bench.common import RssSampler

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    with RssSampler() as sampler:
        time.sleep(0.05)
        start = time.time()
        subprocess.run([sys.executable, "-c", burn], check=True)
        time.sleep(0.1)
        end = time.time()
    assert sampler.cpu(end) - sampler.cpu(start) >= 0.4
    assert sampler.cpu(start - 60) == 0.0  # before the first sample
