"""The `gpt_simple` output format: real shards of the shipped sample data built in core, then read back with
GPT-Simple's own code (`gpt-simple-lm`, installed into a scratch folder from the local index): its `.idx` reader,
its windowing as the oracle for long documents, and its training dataset over the files."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep_assets.core.errors import SpecError
from prep_assets.core.lake import read_json
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.core.helpers import gold_documents, gpt_simple_modules, run_core, sample_spec

L_WINDOW, OVERLAP = 28, 8


@pytest.fixture(scope="module")
def gpts(gpt_simple_dir: Path) -> Iterator[Any]:
    """GPT-Simple's `pretokenize` and `data` modules, from gpt-simple-lm installed into a scratch folder."""
    with gpt_simple_modules(gpt_simple_dir, "pretokenize", "data") as modules:
        yield modules


def _build(data_dir: Path, name: str, **changes: Any) -> tuple[Any, list[dict], Path]:
    copy_sample_data(data_dir)
    spec = sample_spec(data_dir, name, **changes)
    results = list(run_core(data_dir, spec).values())
    return spec, results, data_dir / "lake" / spec.name


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory):
    """sample_text as shipped (packed `full` at 256): every note fits, one entry per document."""
    return _build(tmp_path_factory.mktemp("text"), "sample_text", output={"formats": ["parquet", "gpt_simple"]})


@pytest.fixture(scope="module")
def window_run(tmp_path_factory: pytest.TempPathFactory):
    """sample_text (notes of 31 to 46 tokens) at 28 tokens, overflow window, overlap 8: every note becomes windows,
    some with a trailing window inside the one before (as GPT-Simple makes them); files of 8 rows."""
    return _build(
        tmp_path_factory.mktemp("window"),
        "sample_text",
        sequence={"max_seq_len": L_WINDOW, "overflow": "window", "overlap": OVERLAP},
        packing={"strategy": "bfd"},
        output={"formats": ["parquet", "gpt_simple"], "max_tokens_per_shard": L_WINDOW * 8},
    )


def _read_split(gpts: Any, split_dir: Path) -> tuple[list[Path], list[np.ndarray], list[int]]:
    """The split's files in order and their entries and overlap lengths, as GPT-Simple's `read_idx` gives them."""
    pretokenize, _ = gpts
    bins = sorted((split_dir / "gpt_simple").glob("*.bin"))
    entries, overlaps = [], []
    for path in bins:
        code, offsets, ovl = pretokenize.read_idx(path.with_suffix(".idx"))
        assert code == pretokenize.DTYPE_UINT16 and offsets[0] == 0  # a 1,024-id vocabulary
        data = np.memmap(path, dtype=np.uint16, mode="r")
        assert offsets[-1] == len(data)
        entries += [np.asarray(data[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
        overlaps += ovl.tolist()
    return bins, entries, overlaps


def _expected(gpts: Any, docs: list[list[int]], eod: int, max_len: int, overlap: int) -> list[tuple[list[int], int]]:
    """GPT-Simple's own windows of each document's content (its tokens less the one EOS gold appends)."""
    pretokenize, _ = gpts
    out = []
    for doc in docs:
        content = doc[:-1] if doc and doc[-1] == eod else doc
        out += pretokenize.create_windows(content, eod, max_len, overlap, False, 0.7, random.Random(0))
    return out


def _eos(lake: Path) -> int:
    return int(read_json(lake / "tokenizer" / "fingerprint.json")["info"]["eos_id"])


def test_text_documents_read_back_by_gpt_simple_equal_gold_in_order(gpts, text_run):
    spec, results, lake = text_run
    eod, seen = _eos(lake), {"documents": 0, "tokens": 0}
    for result in results:
        shards, gold = result["dirs"][3], gold_documents(result["dirs"][2])
        for split, docs in gold.items():
            _, entries, overlaps = _read_split(gpts, shards / split)
            assert [e.tolist() for e in entries] == docs  # each gold example ends in its one EOS: the EOD
            assert all(d[-1] == eod and eod not in d[:-1] for d in docs) and set(overlaps) == {0}
            assert [(e.tolist(), 0) for e in entries] == [(list(w), o) for w, o in _expected(gpts, docs, eod, 256, 0)]
            export = result["shards"].splits[split]["exports"]["gpt_simple"]
            assert export["documents"] == export["entries"] == len(docs) and export["eod_id"] == eod
            seen["documents"] += len(docs)
            seen["tokens"] += sum(map(len, docs))
    assert seen["documents"] >= 20, seen


def test_long_documents_become_gpt_simples_windows_with_their_overlap_lengths(gpts, window_run):
    spec, results, lake = window_run
    eod, windowed, trailing, files = _eos(lake), 0, 0, 0
    for result in results:
        shards, gold = result["dirs"][3], gold_documents(result["dirs"][2])
        for split, docs in gold.items():
            bins, entries, overlaps = _read_split(gpts, shards / split)
            expected = _expected(gpts, docs, eod, L_WINDOW, OVERLAP)
            assert [(e.tolist(), o) for e, o in zip(entries, overlaps)] == [(list(w), o) for w, o in expected]
            long_docs = [d for d in docs if len(d) - 1 >= L_WINDOW]
            windowed += len(long_docs)
            files += len(bins)
            # a window after a document's first repeats OVERLAP tokens, fewer only when shorter (a trailing one)
            assert all(o in (0, OVERLAP) or o == len(e) - 1 for e, o in zip(entries, overlaps))
            trailing += sum(o == len(e) - 1 for e, o in zip(entries, overlaps) if o)
            export = result["shards"].splits[split]["exports"]["gpt_simple"]
            assert export["windowed_documents"] == len(long_docs) and export["entries"] == len(entries)
            assert export["overlap_tokens"] == sum(overlaps) and export["tokens"] == sum(map(len, entries))
            # files hold whole entries, at most 8 rows' tokens each unless one entry is longer
            assert all(p.stat().st_size <= 2 * L_WINDOW * 8 for p in bins)
    assert windowed >= 100 and trailing >= 5 and files > len(results), (windowed, trailing, files)


def test_gpt_simples_training_dataset_reads_every_entry_and_masks_the_overlaps(gpts, window_run):
    _, data = gpts
    _, results, lake = window_run
    eod = _eos(lake)
    for result in results:
        split_dir = result["dirs"][3] / "train"
        bins, entries, overlaps = _read_split(gpts, split_dir)
        dataset = data.PreTokenizedDataset(bins, max_length=L_WINDOW, seed=0, pad_token_id=0, eod_token_id=eod)
        dataset.pack_sequences = False  # one entry per item: each readable on its own
        items = list(dataset)
        got = sorted(tuple(it["input_ids"][: int(it["attention_mask"].sum())].tolist()) for it in items)
        assert got == sorted(tuple(e[:L_WINDOW].tolist()) for e in entries)  # its reader cuts an entry to max_length
        masked = {}
        for it in items:
            ids = tuple(it["input_ids"][: int(it["attention_mask"].sum())].tolist())
            masked.setdefault(ids, set()).add(int((it["labels"] == -100).long().cumprod(0).sum()))
        for e, o in zip(entries, overlaps):
            assert min(masked[tuple(e[:L_WINDOW].tolist())]) >= min(o, L_WINDOW)  # the overlap prefix is not trained


def test_manifest_lists_every_gpt_simple_file_with_its_sha256(window_run):
    _, results, lake = window_run
    manifest = read_json(lake / "manifest.json")
    listed = 0
    for split, s in manifest["splits"].items():
        named = [f for e in s["exports"] if e["format"] == "gpt_simple" for f in e["files"]]
        on_disk = sorted(p for r in results for p in (r["dirs"][3] / split / "gpt_simple").glob("*"))
        assert sorted(lake / f["path"] for f in named) == on_disk
        for f in named:
            data = (lake / f["path"]).read_bytes()
            assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["bytes"] == len(data), f["path"]
            listed += 1
    assert listed >= 4


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("sample_pref", "preference pairs"),
        ("sample_instruct", "no loss mask: input.type instruction"),
        ("sample_chat", "no loss mask: input.type chat"),
        ("sample_sensors", "no loss mask: input.type tabular"),
    ],
)
def test_datasets_gpt_simple_cannot_represent_are_refused_at_load(tmp_path: Path, name: str, why: str):
    copy_sample_data(tmp_path)
    with pytest.raises(SpecError, match=rf"output\.formats gpt_simple: .*{why}"):
        sample_spec(tmp_path, name, output={"formats": ["parquet", "gpt_simple"]})
