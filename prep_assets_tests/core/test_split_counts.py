"""Held-out splits by counts (`split.validation_count` / `test_count`): exact, deterministic, checked by a gate."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import gates
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.clean import splits_by_count
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.errors import DropError, SpecError
from prep_assets.core.lake import dataset_paths
from prep_assets.core.silver import build, build_clean_records
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import SplitSpec
from prep_assets_tests.conftest import make_spec

SPLIT_GATE = next(g for g in gates.GATES if g.name == "clean_records_split_drawn")


def texts(n: int) -> list[str]:
    return [f"record number {i} says {i * i}" for i in range(n)]


def silver(tmp: Path, lines: list[str], batch_size: int = 4096, **split: object) -> tuple[DatasetSpec, Path, str]:
    """Bronze then silver of `lines` as one text drop with the given `split`: the spec, silver dir and partition."""
    spec = make_spec("ds", split=split)
    paths = dataset_paths(tmp, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    (drop,), _ = register_drops(paths)
    _, src = resolve_drop(paths, drop.partition)
    b, s = paths.partition_dir("bronze", drop.partition), paths.partition_dir("silver", drop.partition)
    build_raw_records(spec, drop, src, b)
    build_clean_records(spec, b, s, batch_size=batch_size)
    return spec, s, drop.partition


def splits_of(silver_dir: Path) -> dict[str, str]:
    rows = pq.read_table(silver_dir / "records.parquet", columns=["content", "split"]).to_pylist()
    return {json.loads(r["content"])["text"]: r["split"] for r in rows}


def test_splits_by_count_holds_out_the_smallest_hashes_ties_in_drop_order():
    hashes = np.array([5, 3, 3, 9, 1, 3], dtype=np.uint64)
    codes = splits_by_count(hashes, SplitSpec(validation_count=2, test_count=2))
    # ranks: 1 (index 4), 3 (index 1), 3 (index 2), 3 (index 5), 5, 9
    assert codes.tolist() == [0, 1, 2, 0, 1, 2]
    assert splits_by_count(hashes, SplitSpec(validation_count=0, test_count=0)).tolist() == [0] * 6


def test_exact_counts_held_out_and_every_record_accounted(tmp_path: Path):
    spec, s, part = silver(tmp_path, texts(200), validation_count=7, test_count=3)
    got = list(splits_of(s).values())
    assert (got.count("validation"), got.count("test"), got.count("train")) == (7, 3, 190)
    stats = json.loads((s / "stats.json").read_text())
    assert stats["records_by_split"] == {"train": 190, "validation": 7, "test": 3}
    assert SPLIT_GATE.probe(spec, dataset_paths(tmp_path, "ds"), part).passed


def test_counts_are_deterministic_across_reruns_and_batch_sizes(tmp_path: Path):
    _, a, _ = silver(tmp_path / "a", texts(120), validation_count=10, test_count=5)
    _, b, _ = silver(tmp_path / "b", texts(120), batch_size=7, validation_count=10, test_count=5)
    _, c, _ = silver(tmp_path / "c", texts(120), validation_count=10, test_count=5)
    assert splits_of(a) == splits_of(b)
    digest = [hashlib.sha256((d / "records.parquet").read_bytes()).hexdigest() for d in (a, c)]
    assert digest[0] == digest[1]


def test_a_record_keeps_its_split_when_other_records_join_the_drop_beyond_the_counts(tmp_path: Path):
    """The held-out records are the smallest hashes: a record added later takes a place only if its hash is smaller."""
    _, a, _ = silver(tmp_path / "a", texts(50), validation_count=5)
    _, b, _ = silver(tmp_path / "b", texts(50)[::-1], validation_count=5)
    assert splits_of(a) == splits_of(b)  # the order of the drop does not choose (distinct hashes)


def test_counts_exclusive_with_ratios_and_refused_with_group_by():
    with pytest.raises(SpecError, match="not both"):
        make_spec(split={"validation_ratio": 0.1, "test_count": 3})
    with pytest.raises(SpecError, match="split.test_count: Input should be greater than or equal to 0"):
        make_spec(split={"test_count": -1})
    with pytest.raises(SpecError, match="whole groups"):
        make_spec(
            input={"type": "tabular"},
            tabular={"group_by": "g"},
            split={"validation_count": 2},
        )


def test_counts_leaving_nothing_to_train_fail_the_drop_naming_the_numbers(tmp_path: Path):
    with pytest.raises(DropError, match=r"keeps 10 records, but split.validation_count \+ test_count = 10"):
        silver(tmp_path, texts(10), validation_count=6, test_count=4)


def test_the_gate_catches_a_tampered_split(tmp_path: Path):
    spec, s, part = silver(tmp_path, texts(60), validation_count=4, test_count=4)
    table = pq.read_table(s / "records.parquet")
    split = table.column("split").to_pylist()
    i, j = split.index("validation"), split.index("train")
    split[i], split[j] = "train", "validation"  # same counts, wrong records
    pq.write_table(
        table.set_column(table.schema.get_field_index("split"), "split", pa.array(split)), s / "records.parquet"
    )
    outcome = SPLIT_GATE.probe(spec, dataset_paths(tmp_path, "ds"), part)
    assert outcome.violations == 2
    assert {(r["split"], r["drawn_split"]) for r in outcome.offending} == {
        ("train", "validation"),
        ("validation", "train"),
    }


def test_the_gate_rederives_ratio_splits_too(tmp_path: Path):
    spec, s, part = silver(tmp_path, texts(200), validation_ratio=0.2, test_ratio=0.1)
    got = list(splits_of(s).values())
    assert got.count("validation") > 0 and got.count("test") > 0
    assert SPLIT_GATE.probe(spec, dataset_paths(tmp_path, "ds"), part).passed
    table = pq.read_table(s / "records.parquet")
    flipped = ["test" if x == "train" else x for x in table.column("split").to_pylist()]
    pq.write_table(
        table.set_column(table.schema.get_field_index("split"), "split", pa.array(flipped)), s / "records.parquet"
    )
    assert SPLIT_GATE.probe(spec, dataset_paths(tmp_path, "ds"), part).violations == got.count("train")


def test_counts_per_drop_with_dataset_dedup_scope(tmp_path: Path):
    """Each drop holds out exactly its counts among the records it keeps after the earlier drops' copies go."""
    spec = make_spec("ds", clean={"dedup_scope": "dataset"}, split={"validation_count": 3, "test_count": 2})
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    for name, lines in (("a.jsonl", texts(30)), ("b.jsonl", texts(40)[20:])):
        (paths.raw_dir / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    drops, _ = register_drops(paths)
    for drop in drops:
        build_raw_records(
            spec, drop, resolve_drop(paths, drop.partition)[1], paths.partition_dir("bronze", drop.partition)
        )
    by_drop = [build(spec, paths, drop.partition) for drop in drops]
    assert [s.records for s in by_drop] == [30, 10]  # b's first 10 are a's
    assert [s.records_by_split for s in by_drop] == [
        {"train": 25, "validation": 3, "test": 2},
        {"train": 5, "validation": 3, "test": 2},
    ]
    assert all(SPLIT_GATE.probe(spec, paths, d.partition).passed for d in drops)
