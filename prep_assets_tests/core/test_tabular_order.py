"""Records that have no place in a group: empty group keys are bronze rejects, never a group named "null".

The end-to-end cases run drops through bronze, silver and gold with GPT-2 and check, besides the groups, that
every data row is kept or rejected once: rows = bronze records + bronze rejects, silver records = records in gold
examples + gold rejects (and the gold accounting gate agrees)."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from prep_assets.core import invariants as inv
from prep_assets_tests.conftest import make_spec
from prep_assets_tests.core.test_layers import run_core

SEQUENTIAL = {"group_by": "dev", "order_by": "t", "time_series": True}


def _run(tmp_path: Path, gpt2: Path, drops: dict[str, str], tabular: dict, **extra) -> dict:
    data = tmp_path / "data"
    (data / "raw" / "tab").mkdir(parents=True)
    for name, text in drops.items():
        (data / "raw" / "tab" / name).write_text(text, encoding="utf-8")
    sections = {"input": {"type": "tabular"}, "tokenizer": {"path": str(gpt2)}, "clean": {"dedup": "none"},
                "sequence": {"max_seq_len": 1024}, "split": {"test_ratio": 0.0}, "tabular": tabular,
                "packing": {"max_sequences_per_example": 50},
                "checks": {"min_sequence_utilization": 0.0, "max_reject_rate": 1.0}}
    spec = make_spec("tab", **{**sections, **extra})
    out = {}
    for key, r in run_core(data, spec).items():
        bronze, silver, gold, _ = r["dirs"]
        examples = pq.read_table(gold / "examples.parquet").to_pylist()
        rejects = pq.read_table(gold / "rejects.parquet").to_pylist()
        # every data row kept or rejected once, in the layer that knew why
        assert r["bronze"]["lines_in"] == r["bronze"]["records"] + r["bronze"]["rejects"] + r["bronze"]["blank_lines"]
        in_examples = [rid for e in examples for rid in e["record_ids"]]
        assert r["silver"]["records"] == len(in_examples) + len(rejects) == len(set(in_examples) | {
            x["record_id"] for x in rejects})
        assert inv.gold_accounted(gold, silver).passed
        bronze_rejects = pq.read_table(bronze / "rejects.parquet").to_pylist()
        out[key] = {"examples": examples, "rejects": rejects, "bronze_rejects": bronze_rejects, "stats": r}
    return out


def _one(runs: dict) -> dict:
    (r,) = runs.values()
    return r


def _ordered_lines(r: dict) -> dict[str, list[int]]:
    """Source lines of each group's records in the order the examples hold them (one group per example)."""
    out: dict[str, list[int]] = {}
    for e in r["examples"]:
        (g,) = e["group_keys"]
        out.setdefault(g, []).extend(int(rid.rsplit(":", 1)[1]) for rid in e["record_ids"])
    return out


def test_an_empty_group_cell_is_a_bronze_reject_and_the_text_null_its_own_group(tmp_path: Path, gpt2_dir: Path):
    csv = ("dev,t\n"
           "null,2\n"  # line 2: the text "null" names a group
           ",1\n"  # line 3: no group
           "null,1\n"
           "  ,3\n"  # line 5: blank
           "a,1\n")
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, SEQUENTIAL))
    assert _ordered_lines(r) == {"null": [4, 2], "a": [6]} and r["rejects"] == []
    got = [(x["source_line"], x["reason"]) for x in r["bronze_rejects"]]
    assert got == [(3, "empty_group_key"), (5, "empty_group_key")]
    assert r["bronze_rejects"][0]["detail"].startswith("group_by column 'dev' is empty")
    assert all(x["byte_offset"] > 0 and x["source_file"] == "t.csv" for x in r["bronze_rejects"])


def test_null_values_can_make_the_text_null_missing_on_purpose(tmp_path: Path, gpt2_dir: Path):
    csv = "dev,t\nnull,2\n,1\na,1\n"
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, {**SEQUENTIAL, "null_values": ["", "null"]}))
    assert _ordered_lines(r) == {"a": [4]}
    assert [(x["source_line"], x["reason"]) for x in r["bronze_rejects"]] == [(2, "empty_group_key"),
                                                                               (3, "empty_group_key")]


def test_json_rows_null_and_absent_group_keys_are_rejects_the_text_null_a_group(tmp_path: Path, gpt2_dir: Path):
    rows = [{"dev": "null", "t": 1}, {"dev": None, "t": 1}, {"t": 2}, {"dev": "", "t": 3}, {"dev": "null", "t": 0}]
    text = "".join(json.dumps(x) + "\n" for x in rows)
    r = _one(_run(tmp_path, gpt2_dir, {"t.jsonl": text}, SEQUENTIAL))
    assert _ordered_lines(r) == {"null": [5, 1]}
    assert [(x["source_line"], x["reason"]) for x in r["bronze_rejects"]] == [
        (2, "empty_group_key"), (3, "empty_group_key"), (4, "empty_group_key")]
    assert "(absent)" in r["bronze_rejects"][1]["detail"]
