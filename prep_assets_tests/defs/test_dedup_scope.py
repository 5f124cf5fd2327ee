"""`clean.dedup_scope: dataset` through Dagster: partitions materialized in two orders give the same silver."""

import hashlib
from pathlib import Path

from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

from prep_assets.cli import format_summary
from prep_assets.core.drops import register_drops
from prep_assets.core.lake import dataset_paths, read_json
from prep_assets.core.spec import load_spec
from prep_assets.defs.keys import CLEAN_RECORDS, RAW_RECORDS
from prep_assets.defs.resources import LakeResource
from prep_assets.orchestrate import summary_row
from prep_assets_tests.conftest import write_dataset
from prep_assets_tests.defs.helpers import dataset_defs, metadata

NOTES = [f"Drop note {i}: the gauge at station {i % 7} read {i * 3} centimetres." for i in range(40)]
FILES = {  # each later drop repeats lines of the earlier ones (and itself)
    "notes_2026-11-01.jsonl": NOTES[:20],
    "notes_2026-11-02.jsonl": NOTES[10:30] + NOTES[25:27],
    "notes_2026-11-03.jsonl": NOTES[5:8] + NOTES[28:40],
}
SPEC = {
    "input": {"type": "text"},
    "tokenizer": {"path": "."},
    "clean": {"dedup": "exact", "dedup_scope": "dataset"},
    "split": {"validation_ratio": 0.2},
}


def _run(data: Path, order: list[int], home: Path, scope: str = "dataset") -> tuple[dict[str, str], dict[str, dict]]:
    """Bronze + silver (with their checks) one partition at a time in `order`; sha256 of every silver file."""
    files = {n: "".join(f'{{"text": "{t}"}}\n' for t in ts).encode() for n, ts in FILES.items()}
    write_dataset(data, "notes", {**SPEC, "clean": {"dedup": "exact", "dedup_scope": scope}}, files)
    paths = dataset_paths(data, "notes")
    new, _ = register_drops(paths)
    keys = [d.partition for d in new]
    assets = dataset_defs(data, "notes")
    selection = AssetSelection.assets(*(AssetKey(["notes", n]) for n in (RAW_RECORDS, CLEAN_RECORDS)))
    meta = {}
    home.mkdir()
    with DagsterInstance.local_temp(str(home)) as instance:
        instance.add_dynamic_partitions("notes_drops", keys)
        for i in order:
            result = materialize(
                assets,
                selection=selection,
                partition_key=keys[i],
                instance=instance,
                resources={"lake": LakeResource(data_dir=str(data))},
            )
            checks = result.get_asset_check_evaluations()  # dataset scope: unique_across_drops; drop: duplicates_kept
            assert result.success and len(checks) == 9 and all(c.passed for c in checks)
            meta[keys[i]] = metadata(result, "notes", CLEAN_RECORDS)
    digests = {
        str(p.relative_to(paths.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((paths.root / "silver").rglob("*"))
        if p.is_file()
    }
    return digests, meta


def test_two_materialization_orders_give_the_same_silver(tmp_path: Path):
    forward, meta = _run(tmp_path / "forward", [0, 1, 2], tmp_path / "home1")
    backward, meta_back = _run(tmp_path / "backward", [2, 0, 1], tmp_path / "home2")
    assert len(forward) == 12 and forward == backward  # 3 drops x (records, rejects, stats, checksums)
    counts = [(m["dagster/row_count"], m["duplicates_of_earlier_drops"]) for m in meta.values()]
    # drop 1: 20 kept; drop 2: 10 new of 22 (10 seen in drop 1, 2 repeated in itself); drop 3: 10 new of 15
    assert counts == [(20, 0), (10, 10), (10, 5)]
    assert {k: (m["dagster/row_count"], m["duplicates_of_earlier_drops"]) for k, m in meta_back.items()} == dict(
        zip(meta, counts)
    )


def test_drop_scope_keeps_repeats_of_earlier_drops_and_says_so(tmp_path: Path):
    data = tmp_path / "data"
    _, meta = _run(data, [0, 1, 2], tmp_path / "home", scope="drop")
    _run(tmp_path / "other", [0], tmp_path / "home2")
    # drop 2 keeps its 20 distinct notes, 10 of them drop 1's; drop 3 keeps 15, 3 of drop 1's and 2 of drop 2's
    got = [
        (m["dagster/row_count"], m["duplicates_of_earlier_drops"], m["repeats_of_earlier_drops"])
        for m in meta.values()
    ]
    assert got == [(20, 0, 0), (20, 0, 10), (15, 0, 5)]
    spec, paths = load_spec(data / "datasets" / "notes.yaml"), dataset_paths(data, "notes")
    summary = format_summary([summary_row(spec, paths, key, None) for key in meta])
    assert summary.count("repeat earlier drops") == 2
    assert "5 records of this drop repeat earlier drops; set clean.dedup_scope: dataset to remove them" in summary
    dataset_scope = read_json(tmp_path / "other" / "lake" / "notes" / "silver" / next(iter(meta)) / "stats.json")
    assert "repeats_of_earlier_drops" not in dataset_scope
    drop_scope = read_json(data / "lake" / "notes" / "silver" / list(meta)[2] / "stats.json")
    assert "repeats_of_earlier_drops" not in drop_scope  # a report: no published file depends on build order
