"""Domains (`input.domain_key`): a record's domain travels from bronze to gold, is counted in the manifest, and
routes examples in the `astrai_bin` format (AstrAI's bin storage, read back here as its loader reads it)."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from prep_assets.core.errors import SpecError
from prep_assets.core.format_astrai import folder_of, shard_bounds
from prep_assets.core.lake import read_json
from prep_assets.core.mix import MixError, parse_mix, plan_mix, write_mix
from prep_assets.core.mix_gates import judge_mix
from prep_assets.core.reading import MixRows
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


def test_packed_rows_are_domain_pure_and_the_manifest_names_each_domains_row_range_per_file(run):
    spec, result, lake = run
    gold = {
        g["example_id"]: g["domain"] or "__default__"
        for g in pq.read_table(result["dirs"][2] / "examples.parquet").to_pylist()
    }
    manifest = read_json(lake / "manifest.json")
    assert manifest["schema"]["domain"] == "string"
    seen_rows = 0
    for entry in manifest["splits"].values():
        for f in entry["files"]:
            table = pq.read_table(lake / f["path"], columns=["example_ids", "domain"]).to_pylist()
            for row in table:  # every segment of a row is of the row's domain
                assert {gold[e] for e in row["example_ids"]} == {row["domain"]}
            column = [r["domain"] for r in table]
            expected = {d: [column.index(d), len(column) - column[::-1].index(d)] for d in set(column)}
            assert f["domain_rows"] == dict(sorted(expected.items()))
            for d, (a, b) in f["domain_rows"].items():  # contiguous: the range holds only that domain
                assert set(column[a:b]) == {d}
            seen_rows += len(column)
        domains_in_order = [d for f in entry["files"] for d in f["domain_rows"]]
        assert sorted(domains_in_order) == domains_in_order  # packed in sorted domain order across files
    assert seen_rows == sum(s["sequences"] for s in manifest["splits"].values())


def _domain_mix(**sources: Any):
    weights = dict.fromkeys(sources, 1.0)
    doc = {"sources": sources, "weights": weights, "duration_tokens": 10**6, "allow_bucket_exhaustion": True}
    return parse_mix(doc, path=Path("dm.yaml"), default_name="dm", datasets={"domains", "sample_instruct"})


def test_a_mix_bucket_narrowed_to_domains_takes_only_their_rows(run):
    spec, result, lake = run
    m = _domain_mix(
        wiki={"dataset": "domains", "domains": ["wiki"]}, rest={"dataset": "domains", "domains": ["web", "news"]}
    )
    plan = plan_mix(m, lake.parent)
    path = write_mix(m, lake.parent, plan)
    manifest = read_json(lake / "manifest.json")
    train = manifest["splits"]["train"]["files"]
    for bucket in ("wiki", "rest"):
        src = plan["sources"][bucket]
        expected = [[fi, *f["domain_rows"][d]] for fi, f in enumerate(train) for d in m.sources[bucket].domains or []
                    if d in f["domain_rows"]]  # fmt: skip
        assert src["ranges"] == expected and src["domains"] == m.sources[bucket].domains
        assert src["rows"] == plan["buckets"][bucket]["inventory_rows"] == sum(b - a for _, a, b in expected) > 0
        # the demand is above the inventory: the bucket gives each of its rows once, and only those
        assert plan["buckets"][bucket]["rows"] == src["rows"]
    gold = pq.read_table(result["dirs"][2] / "examples.parquet").to_pylist()
    domain_of = {g["example_id"]: g["domain"] for g in gold}
    rows = list(MixRows(path))
    pairs = {(r["bucket"], domain_of[e]) for r in rows for e in r["example_ids"]}
    assert pairs == {("wiki", "wiki"), ("rest", "web"), ("rest", "news")}
    assert len(rows) == len({(r["bucket"], r["row_index"]) for r in rows})  # no row twice (max_epochs 1)
    assert not [o.name for o in judge_mix(m, lake.parent) if not o.passed]

    tampered = copy.deepcopy(plan)
    wiki_files = {fi for fi, _, _ in tampered["sources"]["wiki"]["ranges"]}
    other = next(fi for fi, f in enumerate(train) if "wiki" not in f["domain_rows"])
    assert other not in wiki_files
    tampered["phases"][0]["buckets"]["wiki"]["slices"].append([other, 0, 1])  # a row of another domain
    bad = {o.name: o for o in judge_mix(m, lake.parent, tampered) if not o.passed}
    assert "outside the domains ['wiki']" in str(bad["training_mix_rows_in_manifest"].offending)


def test_a_mix_naming_an_unknown_domain_or_a_dataset_without_domains_is_an_error_naming_the_key(run):
    spec, result, lake = run
    with pytest.raises(MixError, match=r"mixes/dm.yaml: sources.code.domains: dataset 'domains' has no domain "
                       r"\['code'\]; its domains: \['__default__', 'a/b c', 'news', 'web', 'wiki'\]"):  # fmt: skip
        plan_mix(_domain_mix(code={"dataset": "domains", "domains": ["code"]}), lake.parent)
    shutil.copytree(lake.parent / "domains", lake.parent / "sample_instruct", dirs_exist_ok=True)
    plain = read_json(lake / "manifest.json")
    plain.pop("domains")
    (lake.parent / "sample_instruct" / "manifest.json").write_text(json.dumps(plain), encoding="utf-8")
    with pytest.raises(
        MixError, match="sources.x.domains: dataset 'sample_instruct' has no domains .set input.domain_key"
    ):
        plan_mix(_domain_mix(x={"dataset": "sample_instruct", "domains": ["wiki"]}), lake.parent)


def test_a_record_naming_the_default_domain_is_a_reject_never_merged_with_records_naming_none():
    from prep_assets.core.bronze import record_domain
    from prep_assets.core.records import DEFAULT_DOMAIN

    domain, problem = record_domain({"source": DEFAULT_DOMAIN}, "source")
    assert domain is None and problem is not None and "rename the domain" in problem
    assert record_domain({"text": "x"}, "source") == (None, None) and record_domain({"source": "w"}, "source") == (
        "w",
        None,
    )
