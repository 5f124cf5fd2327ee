"""Exact dedup across drops (`clean.dedup_scope: dataset`): the earliest drop, then the first line, keeps a record."""

import json
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prep_assets.core import silver
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.dedup import earlier_indexes, index_dir, remove_other_indexes
from prep_assets.core.drops import earlier_drops, register_drops, registered_drops, resolve_drop
from prep_assets.core.errors import DropError, SpecError
from prep_assets.core.gates import evaluate
from prep_assets.core.lake import dataset_paths
from prep_assets.core.silver import build_clean_records
from prep_assets_tests.conftest import make_spec

A = "Café notes: the river rose two feet overnight."
B, C, D, E, F = (
    f"Field note {w}: nothing else to report today." for w in ("bravo", "charlie", "delta", "echo", "fox")
)
DROPS = {  # registered in name order: a (seq 1), b (seq 2), c (seq 3)
    "a_2026-01.jsonl": [A, B, A, C],
    "b_2026-02.jsonl": [B, D, E],
    "c_2026-03.jsonl": [unicodedata.normalize("NFD", A), D, F, F],  # NFD: the same record after NFC
}
SPEC = make_spec("ds", clean={"dedup": "exact", "dedup_scope": "dataset"})


def _write(raw: Path, name: str, texts: list[str]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")


def _lake(tmp: Path):
    paths = dataset_paths(tmp, "ds")
    for name, texts in DROPS.items():
        _write(paths.raw_dir, name, texts)
    register_drops(paths)
    return paths, {d.file: d.partition for d in registered_drops(paths).values()}


def _silver(paths, keys: list[str], spec=SPEC) -> dict[str, silver.SilverStats]:
    out = {}
    for key in keys:
        drop, src = resolve_drop(paths, key)
        build_raw_records(spec, drop, src, paths.partition_dir("bronze", key))
        out[key] = silver.build(spec, paths, key)
    return out


def _kept(paths, key: str) -> list[str]:
    return [
        json.loads(c)["text"]
        for c in pq.read_table(paths.partition_dir("silver", key) / "records.parquet").column("content").to_pylist()
    ]


def _files(paths, keys) -> dict[str, bytes]:
    return {
        f"{k}/{f}": (paths.partition_dir("silver", k) / f).read_bytes()
        for k in keys
        for f in ("records.parquet", "rejects.parquet", "stats.json")
    }


def test_registration_order_is_the_drop_order(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    seqs = {d.file: d.seq for d in registered_drops(paths).values()}
    assert seqs == {"a_2026-01.jsonl": 1, "b_2026-02.jsonl": 2, "c_2026-03.jsonl": 3}
    assert [d.file for d in earlier_drops(paths, keys["c_2026-03.jsonl"])] == ["a_2026-01.jsonl", "b_2026-02.jsonl"]
    assert earlier_drops(paths, keys["a_2026-01.jsonl"]) == []


def test_earliest_drop_then_first_line_keeps_the_record(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    stats = _silver(paths, [a, b, c])
    assert _kept(paths, a) == [A, B, C] and _kept(paths, b) == [D, E] and _kept(paths, c) == [F]
    assert [s.duplicates_of_earlier_drops for s in stats.values()] == [0, 1, 2]
    rejects = {
        r["record_id"]: r["duplicate_of"]
        for r in pq.read_table(paths.partition_dir("silver", c) / "rejects.parquet").to_pylist()
    }
    assert rejects == {f"{c}:1": f"{a}:1", f"{c}:2": f"{b}:2", f"{c}:4": f"{c}:3"}
    assert all(o.passed for o in evaluate(SPEC, paths, c, "silver"))


def test_same_silver_bytes_whatever_the_materialization_order(tmp_path: Path):
    first, keys = _lake(tmp_path / "in_order")
    order = [keys[n] for n in DROPS]
    _silver(first, order)
    second, _ = _lake(tmp_path / "reversed")
    _silver(second, order[::-1])  # the last drop first: the earlier drops' hashes come from their raw files
    assert _files(first, order) == _files(second, order)
    # the scratch bronze/silver used for those hashes is gone; only the indexes stay
    assert not list(second.root.glob(".dedup_scratch.tmp-*"))
    assert sorted(p.parent.name for p in second.root.glob("dedup_index/*/*/hashes.parquet")) == sorted(order)


def test_drop_scope_keeps_copies_across_drops(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    spec = make_spec("ds", clean={"dedup": "exact"})
    stats = _silver(paths, [keys[n] for n in DROPS], spec=spec)
    assert [s.records for s in stats.values()] == [3, 3, 3]
    assert not (paths.root / "dedup_index").exists()


def test_superseded_drop_no_longer_counts_as_earlier(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [a, b, c])
    _write(paths.raw_dir, "a_2026-01.jsonl", [C])  # corrected file: a new drop, registered last
    (a2,), _ = register_drops(paths)
    assert [d.partition for d in earlier_drops(paths, c)] == [b]
    _silver(paths, [c, a2.partition])
    assert _kept(paths, c) == [unicodedata.normalize("NFC", A), F]  # A is no longer held by an earlier drop
    assert _kept(paths, a2.partition) == [C]  # C was only in the replaced drop


def test_earlier_drop_without_file_or_index_is_a_clear_error(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    (paths.raw_dir / "a_2026-01.jsonl").unlink()
    drop, src = resolve_drop(paths, keys["b_2026-02.jsonl"])
    build_raw_records(SPEC, drop, src, paths.partition_dir("bronze", drop.partition))
    with pytest.raises(DropError, match="missing"):
        silver.build(SPEC, paths, drop.partition)


def test_gate_fails_when_a_kept_record_repeats_an_earlier_drop(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a, b = keys["a_2026-01.jsonl"], keys["b_2026-02.jsonl"]
    _silver(paths, [a])
    drop, src = resolve_drop(paths, b)
    build_raw_records(SPEC, drop, src, paths.partition_dir("bronze", b))
    build_clean_records(SPEC, paths.partition_dir("bronze", b), paths.partition_dir("silver", b))  # drop-only
    (gate,) = [o for o in evaluate(SPEC, paths, b, "silver") if o.name == "clean_records_unique_across_drops"]
    assert not gate.passed and gate.violations == 1
    assert gate.offending == [{"record_id": f"{b}:1", "location": "b_2026-02.jsonl:1", "earlier_record_id": f"{a}:2"}]
    assert gate.facts == {"earlier_drops": 1}
    assert [p.parent.name for _, p in earlier_indexes(SPEC, paths, b)] == [a]


def test_a_hash_held_by_two_earlier_drops_names_the_earliest(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [c, b, a])  # c first: a and b indexed from raw; D is in b and c, A in a and c
    d = "d_2026-04.jsonl"
    _write(paths.raw_dir, d, [D, A])
    (new,), _ = register_drops(paths)
    _silver(paths, [new.partition])
    rejects = [
        (r["record_id"], r["duplicate_of"])
        for r in pq.read_table(paths.partition_dir("silver", new.partition) / "rejects.parquet").to_pylist()
    ]
    assert rejects == [(f"{new.partition}:1", f"{b}:2"), (f"{new.partition}:2", f"{a}:1")]


def test_a_spec_change_gets_new_indexes(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [a, b, c])
    stricter = make_spec("ds", clean={"dedup": "exact", "dedup_scope": "dataset", "min_chars": 46})  # A is 46
    _silver(paths, [c], spec=stricter)  # a and b re-indexed under the new spec: only A passes the filter there
    assert _kept(paths, c) == []  # A: a copy of a:1; D and F: too short
    assert len([p for p in paths.root.glob("dedup_index/*") if not p.name.startswith(".")]) == 2  # .locks aside


def test_indexes_of_an_earlier_configuration_are_removed_and_the_current_ones_and_locks_kept(tmp_path: Path):
    """Every code or spec change left a copy of each drop's kept contents behind, never read again."""
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [a, b, c])
    old = index_dir(SPEC, paths, a).parent
    stricter = make_spec("ds", clean={"dedup": "exact", "dedup_scope": "dataset", "min_chars": 46})
    _silver(paths, [a, b, c], spec=stricter)
    kept_before = _files(paths, [a, b, c])
    removed = remove_other_indexes(stricter, paths)
    assert [name for name, _ in removed] == [old.name] and removed[0][1] > 0 and not old.exists()
    assert sorted(p.name for p in (paths.root / "dedup_index").iterdir() if not p.name.startswith(".")) == [
        index_dir(stricter, paths, a).parent.name
    ]
    assert remove_other_indexes(stricter, paths) == []
    _silver(paths, [c], spec=stricter)  # rebuilt against the indexes kept: the same bytes
    assert _files(paths, [a, b, c]) == kept_before


def test_an_earlier_drop_this_spec_cannot_read_holds_nothing(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    (paths.raw_dir / "a.txt").write_text("plain text line\n")
    (paths.raw_dir / "b.csv").write_text("x,y\n1,2\n1,2\n")
    register_drops(paths)
    spec = make_spec("ds", input={"type": "tabular"}, clean={"dedup": "exact", "dedup_scope": "dataset"})
    b = next(d for d in registered_drops(paths).values() if d.file == "b.csv")
    drop, src = resolve_drop(paths, b.partition)
    build_raw_records(spec, drop, src, paths.partition_dir("bronze", b.partition))
    stats = silver.build(spec, paths, b.partition)  # a.txt (no reader for tables) does not block b
    assert stats.records == 1 and stats.rejects_by_reason == {"duplicate": 1}


def test_silver_over_bronze_of_another_spec_is_refused(tmp_path: Path):
    paths, keys = _lake(tmp_path)
    a = keys["a_2026-01.jsonl"]
    _silver(paths, [a])
    other = make_spec(
        "ds", input={"type": "text", "text_key": "body"}, clean={"dedup": "exact", "dedup_scope": "dataset"}
    )
    with pytest.raises(DropError, match="bronze was built with another spec"):
        silver.build(other, paths, a)


def test_scope_dataset_without_dedup_is_a_spec_error():
    with pytest.raises(SpecError, match="dedup_scope: dataset needs"):
        make_spec("ds", clean={"dedup": "none", "dedup_scope": "dataset"})


def test_manifest_gate_names_a_duplicate_whose_copy_left_with_a_replaced_drop(tmp_path: Path):
    from prep_assets.core.invariants import duplicates_resolve_to_kept

    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [a, b, c])
    assert duplicates_resolve_to_kept([paths.partition_dir("silver", k) for k in (a, b, c)]).passed
    _write(paths.raw_dir, "a_2026-01.jsonl", [C])  # a replaced: B, kept only in a, is a duplicate in b
    (a2,), _ = register_drops(paths)
    _silver(paths, [a2.partition])
    out = duplicates_resolve_to_kept([paths.partition_dir("silver", k) for k in (a2.partition, b, c)])
    assert not out.passed
    assert {r["record_id"]: r["duplicate_of"] for r in out.offending} == {f"{b}:1": f"{a}:2", f"{c}:1": f"{a}:1"}


def test_a_forced_hash_collision_keeps_both_distinct_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(silver, "content_digest", lambda canonical: "0" * 64)  # every record collides
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    stats = _silver(paths, [a, b, c])
    assert _kept(paths, a) == [A, B, C] and _kept(paths, b) == [D, E] and _kept(paths, c) == [F]
    assert [s.hash_collisions for s in stats.values()] == [1, 1, 1]
    assert all(o.passed for k in (a, b, c) for o in evaluate(SPEC, paths, k, "silver"))


def test_silver_reads_its_output_back_for_collisions_only_after_a_pass_that_met_a_hash_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A hash met once holds one content: a drop whose hashes are all new (here and in the earlier drops' indexes)
    cannot hold a collision, so silver skips the DuckDB query; a repeat in the drop, or of an earlier drop, asks."""
    calls: list[int] = []
    real = silver.dedup.collisions
    monkeypatch.setattr(silver.dedup, "collisions", lambda *a: calls.append(1) or real(*a))
    paths, keys = _lake(tmp_path)
    a, b, c = (keys[n] for n in DROPS)
    _silver(paths, [a])  # A twice
    assert len(calls) == 1
    _write(paths.raw_dir, "d_2026-04.jsonl", ["Only new text here, nothing anyone wrote before."])
    (d,), _ = register_drops(paths)
    _silver(paths, [b, c])  # b repeats B of a; c repeats A of a and F of itself
    assert len(calls) == 3
    assert _silver(paths, [d.partition])[d.partition].records == 1
    assert len(calls) == 3  # every hash new: no query
    monkeypatch.setattr(silver, "content_digest", lambda canonical: "0" * 64)  # every record collides
    _write(paths.raw_dir, "e_2026-05.jsonl", ["One text.", "Another text."])
    (e,), _ = register_drops(paths)
    assert _silver(paths, [e.partition])[e.partition].hash_collisions == 1  # still found, and kept apart
    assert _kept(paths, e.partition) == ["One text.", "Another text."]
