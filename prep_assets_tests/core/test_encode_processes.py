"""tiktoken in worker processes gives the ids tiktoken gives in this process (and HF gives), in order; gold built with
workers is byte-identical to gold built with HF only, and leaves no worker behind; a worker that dies fails the
batch with a clear error; texts that are not valid UTF-8 are encoded here."""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from prep_assets.core import fast_bpe
from prep_assets.core.encode_processes import PROCESSES_ENV, EncodeProcesses, processes_setting
from prep_assets.core.errors import DropError
from prep_assets.core.fast_bpe import ENGINE_ENV, build_encoding, decide, encode_parallel
from prep_assets_tests.conftest import shared_path
from prep_assets_tests.core.helpers import gpt2_lake


def _workers_of_this_process() -> list[int]:
    """Live `encode_worker` processes whose parent is this process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"prep_assets.core.encode_worker" in cmd and ppid == os.getpid():
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def gpt2() -> tuple[str, str]:
    text = shared_path("tokenizers/gpt2/tokenizer.json").read_text(encoding="utf-8")
    pattern = decide(json.loads(text)).pattern
    assert pattern is not None
    return text, pattern


def _texts() -> list[str]:
    rows = shared_path("datasets/instruction/gdp_generative_tuning.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [v for line in rows[:300] for v in json.loads(line).values() if isinstance(v, str)]
    return [*texts, "", " ", "\r\n", "emoji 😀👍🏽 and \u0301", "<|endoftext|>", "x" * 5000]


def test_workers_give_the_ids_of_tiktoken_in_this_process_in_order(gpt2: tuple[str, str]):
    from concurrent.futures import ThreadPoolExecutor

    texts = _texts()
    encoding = build_encoding(json.loads(gpt2[0]), gpt2[1])
    with ThreadPoolExecutor(2) as pool:
        here = encode_parallel(encoding, texts, pool)
    workers = EncodeProcesses(*gpt2, 3)
    try:
        for batch in (texts, texts[:1], [], texts[::-1]):
            got = workers.encode(batch)
            expected = here if batch is texts else [encoding.encode_ordinary(t) for t in batch]
            assert len(got) == len(batch) and all(g.dtype == np.int32 for g in got)
            assert [g.tolist() for g in got] == expected
    finally:
        workers.close()
    assert _workers_of_this_process() == []


def test_a_text_that_is_not_utf8_is_refused_before_anything_is_sent(gpt2: tuple[str, str]):
    workers = EncodeProcesses(*gpt2, 2)
    try:
        with pytest.raises(UnicodeEncodeError):
            workers.encode(["fine", "lone \ud800 surrogate"])
        assert [a.tolist() for a in workers.encode(["still fine"])] == [
            build_encoding(json.loads(gpt2[0]), gpt2[1]).encode_ordinary("still fine")
        ]
    finally:
        workers.close()


def test_a_worker_that_dies_fails_the_batch_with_its_exit_code(gpt2: tuple[str, str]):
    workers = EncodeProcesses(*gpt2, 2)
    try:
        workers._workers[1].proc.kill()
        workers._workers[1].proc.wait()
        with pytest.raises(DropError, match=f"tiktoken worker process ended before answering.*{PROCESSES_ENV}=0"):
            workers.encode(["a text"] * 10)
    finally:
        workers.close()
    assert _workers_of_this_process() == []


def test_the_number_of_workers_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROCESSES_ENV, "3")
    assert processes_setting() == 3
    monkeypatch.setenv(PROCESSES_ENV, "0")
    assert processes_setting() == 0
    monkeypatch.delenv(PROCESSES_ENV)
    assert processes_setting() == (os.cpu_count() or 1)
    monkeypatch.setenv(PROCESSES_ENV, "two")
    with pytest.raises(DropError, match=PROCESSES_ENV):
        processes_setting()


def test_gold_encoded_by_workers_is_byte_identical_to_gold_with_hf_only_and_leaves_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    started = []
    real = EncodeProcesses.__init__

    def counting(self: EncodeProcesses, *args: object) -> None:
        started.append(args[-1])
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(EncodeProcesses, "__init__", counting)
    monkeypatch.setattr(fast_bpe, "MIN_CHARS", 0)  # every batch to the workers
    monkeypatch.setenv(PROCESSES_ENV, "2")
    by_workers = gpt2_lake(tmp_path / "workers")
    assert started == [2, 2], "each gold build starts its two workers"
    assert _workers_of_this_process() == []
    monkeypatch.setenv(ENGINE_ENV, "hf")
    assert by_workers == gpt2_lake(tmp_path / "hf")


def test_gold_sends_the_workers_the_next_batch_before_it_collects_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With workers, batch k+1 waits in their pipes while they encode batch k, so they never wait between batches:
    the first batch's ids are held back until the second is sent, which only a pipeline two batches deep gets past.
    Gold over many batches is byte-identical to HF's."""
    second_sent = threading.Event()
    sent = itertools.count()
    real = EncodeProcesses.submit

    def submit(self: EncodeProcesses, texts: list[str]) -> Callable[[], list[np.ndarray]]:
        n, collect = next(sent), real(self, texts)
        if n == 1:
            second_sent.set()
        if n != 0:
            return collect

        def first() -> list[np.ndarray]:
            assert second_sent.wait(30), "the second batch was not sent while the workers encoded the first"
            return collect()

        return first

    monkeypatch.setattr(EncodeProcesses, "submit", submit)
    monkeypatch.setattr(fast_bpe, "MIN_CHARS", 0)  # every batch to the workers
    monkeypatch.setenv(PROCESSES_ENV, "2")
    by_workers = gpt2_lake(tmp_path / "workers", batch_size=32)
    assert next(sent) >= 5, "several batches went to the workers"
    assert _workers_of_this_process() == []
    monkeypatch.setenv(ENGINE_ENV, "hf")
    assert by_workers == gpt2_lake(tmp_path / "hf", batch_size=32)


def test_workers_that_cannot_start_leave_the_encoding_to_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    from prep_assets.core.lake import dataset_paths
    from prep_assets.core.tokenizer import load_pinned

    gpt2_lake(tmp_path)  # pins GPT-2 in the lake
    pt = load_pinned(dataset_paths(tmp_path, "inst").tokenizer_dir)
    assert pt.fast is not None
    pt.fast.min_chars = 0
    monkeypatch.setenv(PROCESSES_ENV, "2")
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-python-here"))
    texts = _texts()
    try:
        ids = pt.fast.encode(texts)
    finally:
        pt.close()
    assert ids == [pt.fast.encoding.encode_ordinary(t) for t in texts]
    assert "could not start" in caplog.text and _workers_of_this_process() == []
