"""Domains (`input.domain_key`): a record's domain travels from bronze to gold, is counted in the manifest, and
routes examples in the `astrai_bin` format (AstrAI's bin storage, read back here as its loader reads it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from prep_assets.core.errors import SpecError
from prep_assets.core.format_astrai import folder_of, shard_bounds
from prep_assets.core.lake import read_json
from prep_assets.core.spec import load_spec
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.core.helpers import run_core

SOURCES = ("wiki", "web", "news", "a/b c")  # the last is no plain folder name


def _records() -> list[dict[str, Any]]:
    out = []
    for i in range(60):
        a, b = 10 + i, 3 + i % 7
        out.append(
            {
                "prompt": f"What is {a} plus {b}?",
                "completion": f"{a} + {b} = {a + b}. The answer is {a + b}.",
                "source": SOURCES[i % len(SOURCES)],
            }
        )
    out.append({"prompt": "What is 1 plus 1?", "completion": "1 + 1 = 2. The answer is 2."})  # names no domain
    out.append({"prompt": "What is 2 plus 2?", "completion": "2 + 2 = 4.", "source": 7})  # not a string
    out.append({"prompt": "What is 3 plus 3?", "completion": "3 + 3 = 6.", "source": ""})  # empty
    return out


def _spec(data_dir: Path, **changes: Any) -> Path:
    raw = yaml.safe_load((data_dir / "datasets" / "sample_instruct.yaml").read_text(encoding="utf-8"))
    raw["input"]["domain_key"] = "source"
    raw["output"] = {"formats": ["parquet", "astrai_bin"], "max_tokens_per_shard": 300}
    raw["checks"]["max_reject_rate"] = 0.1
    raw.update(changes)
    path = data_dir / "datasets" / "domains.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    data = copy_sample_data(tmp_path_factory.mktemp("domains"))
    raw = data / "raw" / "domains"
    raw.mkdir()
    (raw / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()), encoding="utf-8")
    spec = load_spec(_spec(data), data)
    ((key, result),) = run_core(data, spec).items()
    return spec, result, data / "lake" / "domains"


def test_a_domain_travels_from_bronze_to_gold_and_a_bad_one_is_a_reject(run):
    spec, result, lake = run
    names = ("records.parquet", "records.parquet", "examples.parquet")
    bronze, silver, gold = (pq.read_table(d / f) for d, f in zip(result["dirs"], names, strict=False))
    rejects = pq.read_table(result["dirs"][0] / "rejects.parquet").to_pylist()
    assert [(r["source_line"], r["reason"]) for r in rejects] == [(62, "invalid_domain"), (63, "invalid_domain")]
    assert "'source' must be a non-empty string" in rejects[0]["detail"]
    by_line = dict(zip(bronze.column("source_line").to_pylist(), bronze.column("domain").to_pylist(), strict=True))
    assert by_line[61] is None and by_line[1] == "wiki" and by_line[4] == "a/b c"
    for table in (silver, gold):  # the same domain at every layer, by record
        lines, domains = table.column("source_line").to_pylist(), table.column("domain").to_pylist()
        assert all(domain == by_line[line] for line, domain in zip(lines, domains, strict=True))


def test_the_manifest_counts_examples_and_tokens_per_domain(run):
    spec, result, lake = run
    gold = pq.read_table(result["dirs"][2] / "examples.parquet").to_pylist()
    manifest = read_json(lake / "manifest.json")
    expected: dict[str, dict[str, int]] = {}
    for g in gold:
        c = expected.setdefault(g["domain"] or "__default__", {"examples": 0, "loss_tokens": 0, "tokens": 0})
        c["examples"] += 1
        c["tokens"] += g["num_tokens"]
        c["loss_tokens"] += g["num_loss_tokens"]
    assert manifest["domains"] == dict(sorted(expected.items()))
    assert set(manifest["domains"]) == {"__default__", *SOURCES}


def _read_astrai(shard: Path) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A shard as AstrAI's MmapStore reads it: meta.json's shape and dtype over each key's .bin, its offsets."""
    meta = json.loads((shard / "meta.json").read_text(encoding="utf-8"))
    arrays = [
        np.memmap(shard / f"{k}.bin", dtype=meta[k]["dtype"], mode="r", shape=tuple(meta[k]["shape"]))
        for k in ("sequence", "loss_mask")
    ]
    assert meta["sequence"]["offsets"] == meta["loss_mask"]["offsets"]
    return np.asarray(arrays[0]), np.asarray(arrays[1]), meta["sequence"]["offsets"]


def test_astrai_bin_holds_each_domains_examples_in_gold_order_within_the_shard_budget(run):
    spec, result, lake = run
    gold = pq.read_table(result["dirs"][2] / "examples.parquet").to_pylist()
    stats = read_json(result["dirs"][3] / "stats.json")
    seen = 0
    for split, m in stats["splits"].items():
        entry = m["exports"].get("astrai_bin")
        examples = [g for g in gold if g["split"] == split]
        if not examples:
            assert entry is None
            continue
        assert entry["domains"] == {d: folder_of(d) for d in entry["domains"]}
        assert folder_of("a/b c").startswith("domain-") and folder_of("wiki") == "wiki"
        for domain, folder in entry["domains"].items():
            want = [g for g in examples if (g["domain"] or "__default__") == domain]
            shards = sorted((result["dirs"][3] / split / "astrai" / folder).glob("shard_*"))
            ids, mask, lengths = [], [], []
            for shard in shards:
                seq, loss, offsets = _read_astrai(shard)
                assert seq.dtype == np.int64 and offsets[-1] == len(seq)
                n = np.diff(offsets)
                assert offsets[-1] <= spec.output.max_tokens_per_shard or len(n) == 1
                ids.append(seq)
                mask.append(loss)
                lengths += n.tolist()
            assert np.concatenate(ids).tolist() == [t for g in want for t in g["token_ids"]]
            assert np.concatenate(mask).tolist() == [t for g in want for t in g["loss_mask"]]
            assert lengths == [g["num_tokens"] for g in want]
            seen += len(want)
        for f in entry["files"]:  # listed with the bytes they hold
            path = result["dirs"][3] / f["path"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"] and path.stat().st_size == f["bytes"]
    assert seen == len(gold) and len({g["domain"] for g in gold}) == 5


def test_shard_bounds_keep_the_budget_and_give_a_long_example_a_shard_of_its_own():
    assert shard_bounds(np.array([5, 5, 5, 20, 1]), 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert shard_bounds(np.array([], dtype=np.int64), 10) == []


def test_astrai_bin_refuses_preference_pairs_at_spec_load(tmp_path: Path):
    data = copy_sample_data(tmp_path)
    raw = yaml.safe_load((data / "datasets" / "sample_pref.yaml").read_text(encoding="utf-8"))
    raw["output"] = {"formats": ["parquet", "astrai_bin"]}
    path = data / "datasets" / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    with pytest.raises(SpecError, match="chosen/rejected pair has no layout"):
        load_spec(path, data)


def test_a_tabular_dataset_cannot_name_a_domain_key(tmp_path: Path):
    data = copy_sample_data(tmp_path)
    raw = yaml.safe_load((data / "datasets" / "sample_sensors.yaml").read_text(encoding="utf-8"))
    raw["input"]["domain_key"] = "device"
    path = data / "datasets" / "t.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    with pytest.raises(SpecError, match="a tabular example assembles many records"):
        load_spec(path, data)
