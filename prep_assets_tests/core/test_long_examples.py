"""Gates over examples longer than many rows: gold meets the shard segments a chunk at a time, so a gate's memory
does not grow with the length of one example."""

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import invariants as inv
from prep_assets.core import sql
from prep_assets.core import tokenizer as tk
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.gold import build_tokenized_examples, build_tokenizer
from prep_assets.core.invariants import shards_gold
from prep_assets.core.lake import dataset_paths
from prep_assets.core.records import GOLD_SCHEMA, SHARD_SCHEMA
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import make_spec, shared_path


def _gold_example(dir_: Path, n: int, seed: int = 0) -> tuple[Path, np.ndarray]:
    """One text example of `n` tokens (every token trains but the first, type completion; the last EOS)."""
    dir_.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(3, 50_000, n).astype(np.int32)
    mask = np.ones(n, np.uint8)
    mask[0] = 0
    types = np.ones(n, np.uint8)
    types[-1] = 3
    row = {
        "example_id": "d:1",
        "record_id": "d:1",
        "drop": "d",
        "source_file": "f.jsonl",
        "source_line": 1,
        "byte_offset": 0,
        "split": "train",
        "token_ids": ids,
        "loss_mask": mask,
        "token_type_ids": types,
        "num_tokens": n,
        "num_loss_tokens": int(mask.sum()),
        "num_prompt_tokens": 0,
    }
    pq.write_table(pa.Table.from_pylist([row], schema=GOLD_SCHEMA), dir_ / "examples.parquet")
    return dir_, ids


def _full_rows(path: Path, ids: np.ndarray, row_len: int, corrupt: dict[int, int] | None = None) -> list[Path]:
    """The example packed `full` into rows of `row_len`: segment k holds tokens [k * row_len, (k + 1) * row_len),
    its first token masked; the last row padded with id 0. `corrupt`: token index -> id written instead."""
    ids = ids.copy()
    for at, value in (corrupt or {}).items():
        ids[at] = value
    rows = []
    for off in range(0, len(ids), row_len):
        n = min(row_len, len(ids) - off)
        pad = row_len - n
        mask = [0] + [1] * (n - 1) + [0] * pad
        types = [1] * n + [2] * pad
        if off + n == len(ids):
            types[n - 1] = 3
        rows.append(
            {
                "input_ids": ids[off : off + n].tolist() + [0] * pad,
                "loss_mask": mask,
                "position_ids": list(range(n)) + [0] * pad,
                "segment_ids": [1] * n + [0] * pad,
                "token_type_ids": types,
                "seq_lengths": [n],
                "example_ids": ["d:1"],
                "example_offsets": [off],
                "num_loss_tokens": n - 1,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), path, row_group_size=256)
    return [path]


@pytest.mark.parametrize("chunk", [1, 5, 8, 64], ids=["chunk_1", "chunk_5", "chunk_8", "chunk_over_the_example"])
def test_match_gold_over_a_long_example_is_the_same_whatever_the_chunk(tmp_path: Path, monkeypatch, chunk):
    monkeypatch.setattr(shards_gold, "GOLD_CHUNK", chunk)
    g, ids = _gold_example(tmp_path / "g", 50)
    assert inv.shards_match_gold(_full_rows(tmp_path / "ok" / "train" / "part-00000.parquet", ids, 12), g).passed
    # token 29 (0-based) sits in row 2 (offset 24) at row position 6 (1-based)
    bad = _full_rows(tmp_path / "bad" / "train" / "part-00000.parquet", ids, 12, {29: 1})
    out = inv.shards_match_gold(bad, g)
    assert out.violations == 1
    assert [(r["row"], r["off"], r["token"]) for r in out.offending] == [(2, 24, 6)]


def test_the_screen_passes_a_long_example_in_full_rows(tmp_path: Path):
    """The screen's gold side lays each segment of a long example at its place in its row: a good packing passes
    it; one changed token sends the gates to their exact pass."""
    g, ids = _gold_example(tmp_path / "g", 50)
    parts = ["fixed", "layout", "checksum", "padding"]
    ok = _full_rows(tmp_path / "ok" / "train" / "part-00000.parquet", ids, 12)
    assert shards_gold.SCREENED in inv.screened_rows(ok, g, 0, 12, 0, parts).column_names
    bad = _full_rows(tmp_path / "bad" / "train" / "part-00000.parquet", ids, 12, {29: 1})
    assert inv.screened_rows(bad, g, 0, 12, 0, parts).equals(inv.shard_rows(bad, parts, 12, 0))


def test_match_gold_windows_overlapping_in_gold_check_each_window(tmp_path: Path, monkeypatch):
    """Windows of 8 tokens with an overlap of 3 (stride 5) read gold chunks of 4 tokens in several segments."""
    monkeypatch.setattr(shards_gold, "GOLD_CHUNK", 4)
    g, ids = _gold_example(tmp_path / "g", 18)
    rows = []
    for off in (0, 5, 10):
        n = min(8, 18 - off)
        masked = 1 if off == 0 else 3
        types = [1] * n
        if off + n == 18:
            types[-1] = 3
        rows.append(
            {
                "input_ids": ids[off : off + n].tolist(),
                "loss_mask": [0] * masked + [1] * (n - masked),
                "position_ids": list(range(n)),
                "segment_ids": [1] * n,
                "token_type_ids": types,
                "seq_lengths": [n],
                "example_ids": ["d:1"],
                "example_offsets": [off],
                "num_loss_tokens": n - masked,
            }
        )
    f = tmp_path / "train" / "part-00000.parquet"
    f.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), f)
    assert inv.shards_match_gold([f], g, overlap=3).passed
    parts = ["fixed", "layout", "checksum", "padding"]
    assert shards_gold.SCREENED in inv.screened_rows([f], g, 3, 8, 0, parts).column_names  # the overlap masked
    rows[1]["loss_mask"] = [0, 0, 1, 1, 1, 1, 1, 1]  # the overlap's last token trained
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), f)
    assert shards_gold.SCREENED not in inv.screened_rows([f], g, 3, 8, 0, parts).column_names
    out = inv.shards_match_gold([f], g, overlap=3)
    assert [(r["row"], r["token"]) for r in out.offending] == [(1, 3)]


def test_shard_gates_on_a_long_example_stay_within_a_small_duckdb_budget(tmp_path: Path, monkeypatch):
    """300k tokens in 586 rows of 512: joining the whole example per segment asked DuckDB for ~1 GB; in chunks
    the gates keep within 64 MB, passing and failing alike."""
    monkeypatch.setenv(sql.MEMORY_ENV, "64MB")
    g, ids = _gold_example(tmp_path / "g", 300_000)
    ok = _full_rows(tmp_path / "ok" / "train" / "part-00000.parquet", ids, 512)
    assert inv.shards_match_gold(ok, g).passed
    screened = inv.screened_rows(ok, g, 0, 512, 0, ["fixed", "layout", "checksum", "padding"])
    assert shards_gold.SCREENED in screened.column_names  # the screen too, not its fallback
    assert inv.shards_tokens_conserved(ok, g, inv.Layout(512, "full")).passed
    bad = _full_rows(
        tmp_path / "bad" / "train" / "part-00000.parquet", ids, 512, {k * 512 + 7: 1 for k in range(0, 586, 10)}
    )
    out = inv.shards_match_gold(bad, g)
    assert out.violations == 59 and out.offending[0] == {
        "file": str(bad[0]),
        "row": 0,
        "seg": 1,
        "example_id": "d:1",
        "off": 0,
        "len": 512,
        "token": 8,
    }


# ---------------------------------------------------------------- gold of one long text, encoded in pieces

_WORDS = [
    "the",
    "Hello",
    "world",
    "naïve",
    "日本語",
    "😀",
    "3.14159",
    "1,000",
    "don't",
    "It's",
    "<|endoftext|>",
    "<s>",
    "[INST]",
    "\r\n",
    "\n\n",
    "\t",
    "--",
    ",",
    ".",
    "!?",
    "▁",
    "Ġ",
    "  ",
    " " * 12,
]


def _document(n_chars: int, seed: int) -> str:
    """Mostly words between single spaces, with CRLF, emoji, runs of spaces and special-token strings among them."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        word = rng.choice(_WORDS) if rng.random() < 0.3 else "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def _silver(tmp_path: Path, tokenizer: str, records: list[dict], input_: dict) -> tuple[DatasetSpec, Path, Path]:
    """Bronze and silver of a one-file drop of `records`: (spec, silver dir, pinned tokenizer dir)."""
    data = tmp_path / "data"
    (data / "raw" / "longdoc").mkdir(parents=True)
    (data / "raw" / "longdoc" / "doc.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8"
    )
    spec = make_spec(
        "longdoc",
        input=input_,
        clean={"max_chars": 1 << 40},
        tokenizer={"path": str(shared_path(f"tokenizers/{tokenizer}"))},
        sequence={"max_seq_len": 2048},
        packing={"strategy": "full"},
    )
    paths = dataset_paths(data, spec.name)
    (drop,), _ = register_drops(paths)
    build_tokenizer(spec, paths, data)
    drop, src = resolve_drop(paths, drop.partition)
    bronze, silver = paths.partition_dir("bronze", drop.partition), paths.partition_dir("silver", drop.partition)
    build_raw_records(spec, drop, src, bronze)
    build_clean_records(spec, bronze, silver)
    return spec, silver, paths.tokenizer_dir


@pytest.mark.parametrize(
    ("tokenizer", "kind"), [("gpt2", "text"), ("tinyllama", "text"), ("mistral7b", "instruction")]
)
def test_gold_of_long_texts_in_pieces_is_byte_identical_to_encoding_them_whole(
    tmp_path: Path, monkeypatch, tokenizer: str, kind: str
):
    """A 1.2 MB text among short ones (instruction: a long prompt and a long completion, the continuation)."""
    if kind == "text":
        records = [{"text": "a short one."}, {"text": _document(1_200_000, 0)}, {"text": _document(3_000, 1)}]
        input_ = {"type": "text"}
    else:
        records = [
            {"prompt": _document(400_000, 2), "completion": _document(700_000, 3)},
            {"prompt": "2+2?", "completion": " 4"},
        ]
        input_ = {"type": "instruction"}
    spec, silver, tok = _silver(tmp_path, tokenizer, records, input_)
    digests = {}
    for name, long_chars, piece_chars in [
        ("whole", 1 << 62, tk.PIECE_CHARS),
        ("default", tk.LONG_TEXT_CHARS, tk.PIECE_CHARS),
        ("small_pieces", 8192, 4096),
    ]:
        monkeypatch.setattr(tk, "LONG_TEXT_CHARS", long_chars)
        monkeypatch.setattr(tk, "PIECE_CHARS", piece_chars)
        out = tmp_path / name
        stats = build_tokenized_examples(spec, silver, tok, out)
        digests[name] = hashlib.sha256((out / "examples.parquet").read_bytes()).hexdigest()
        assert stats.examples == len(records)
    assert digests["default"] == digests["whole"] and digests["small_pieces"] == digests["whole"]


_GOLD_CHILD = """
import json, sys
from pathlib import Path
from prep_assets.core import tokenizer
from prep_assets.core.gold import build_tokenized_examples, build_tokenizer
from prep_assets_tests.conftest import make_spec

args = json.loads(sys.argv[1])
spec = make_spec("longdoc", **args["spec"])
tokenizer.LONG_TEXT_CHARS = args["long_chars"]
tokenizer.load_pinned(Path(args["tok"]))  # imports and the tokenizer itself are in the baseline


def status(key):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) // 1024


try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak to the current RSS
except OSError:
    pass
base = status("VmRSS:")
build_tokenized_examples(spec, Path(args["silver"]), Path(args["tok"]), Path(args["out"]))
print(json.dumps({"base_mib": base, "peak_mib": status("VmHWM:")}))
"""


def _gold_rss(tmp_path: Path, spec_args: dict, silver: Path, tok: Path, long_chars: int) -> int:
    """The gold step's peak RSS above the process' RSS before it, in a fresh process (MiB)."""
    args = {
        "spec": spec_args,
        "silver": str(silver),
        "tok": str(tok),
        "out": str(tmp_path / f"gold-{long_chars}"),
        "long_chars": long_chars,
    }
    path = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", _GOLD_CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
    )
    out = json.loads(child.stdout.strip().splitlines()[-1])
    return out["peak_mib"] - out["base_mib"]


def test_gold_of_a_2_mb_document_stays_within_150_mib_of_its_start(tmp_path: Path):
    """~1.1M GPT-2 tokens: ~105 MiB in pieces (a second tokenizer, Parquet's buffers); ~395 MiB encoded whole."""
    doc = _document(2_000_000, 4)
    spec_args = {
        "input": {"type": "text"},
        "clean": {"max_chars": 1 << 40},
        "tokenizer": {"path": str(shared_path("tokenizers/gpt2"))},
        "sequence": {"max_seq_len": 2048},
        "packing": {"strategy": "full"},
    }
    _, silver, tok = _silver(tmp_path, "gpt2", [{"text": doc}], spec_args["input"])
    grown = _gold_rss(tmp_path, spec_args, silver, tok, tk.LONG_TEXT_CHARS)
    assert grown < 150, f"gold grew by {grown} MiB"
