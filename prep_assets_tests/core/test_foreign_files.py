"""Layer files rewritten by another writer (a NULL where the layer's schema allows none, a column missing or of
another kind): every gate that reads them fails naming the file and column, rather than passing (a comparison with
a NULL is NULL, which a rule reads as passing) or raising a database error."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import gates, gold, shards, silver
from prep_assets.core import invariants as inv
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.dedup import earlier_indexes
from prep_assets.core.drops import register_drops, registered_drops, resolve_drop
from prep_assets.core.errors import DropError
from prep_assets.core.lake import dataset_paths
from prep_assets.core.records import GOLD_SCHEMA, SHARD_SCHEMA, SILVER_SCHEMA
from prep_assets_tests.conftest import make_spec
from prep_assets_tests.core.lakes import GOOD, shard_row, shard_row8, write_gold, write_shard

SPEC = make_spec("ds", clean={"dedup": "exact", "dedup_scope": "dataset"})
TEXTS = ["A first note about the river.", "A second note about the hills.", "A first note about the river."]


def _loose(schema: pa.Schema) -> pa.Schema:
    """`schema` with every column nullable, as another writer might declare it."""
    return pa.schema([f.with_nullable(True) for f in schema])


def _rewrite(path: Path, change) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table.cast(_loose(table.schema))), path)


def _null_at(table: pa.Table, column: str, row: int = 0) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = None
    at = table.schema.get_field_index(column)
    return table.set_column(at, table.schema.field(at), pa.array(values, table.schema.field(at).type))


def _as(table: pa.Table, column: str, kind: pa.DataType) -> pa.Table:
    at = table.schema.get_field_index(column)
    return table.set_column(at, column, table.column(column).cast(kind))


def _silver_lake(tmp_path: Path, drops: tuple[str, ...] = ("a.jsonl",)):
    """Bronze and silver of `drops` (each holding TEXTS, registered in name order); the last drop's key."""
    paths = dataset_paths(tmp_path, "ds")
    paths.raw_dir.mkdir(parents=True)
    for name in drops:
        texts = [*TEXTS, f"A note only {name} holds."]
        (paths.raw_dir / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    register_drops(paths)
    keys = sorted(registered_drops(paths), key=lambda k: registered_drops(paths)[k].file)
    for key in keys:
        drop, src = resolve_drop(paths, key)
        build_raw_records(SPEC, drop, src, paths.partition_dir("bronze", key))
        silver.build(SPEC, paths, key)
    return paths, keys[-1]


def _judged(paths, key: str, layer: str) -> dict[str, object]:
    chosen = [g for g in gates.gates_for(SPEC) if g.layer == layer]
    return {g.name: o for g, o in gates.outcomes(SPEC, paths, key, chosen)}


def test_file_problems_names_a_missing_column_another_kind_and_nulls_and_accepts_wider_kinds(tmp_path: Path):
    row = {f.name: None for f in SILVER_SCHEMA} | {
        "record_id": "d:1",
        "drop": "d",
        "source_file": "f.jsonl",
        "source_line": 1,
        "byte_offset": 0,
        "content": "{}",
        "content_sha256": "ab",
        "num_chars": 2,
        "split": "train",
    }
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=SILVER_SCHEMA), good)
    assert inv.file_problems(good, SILVER_SCHEMA) == []
    wide = pa.Table.from_pylist([row], schema=_loose(SILVER_SCHEMA))  # nullable, holding no NULL: fine
    wide = wide.set_column(wide.schema.get_field_index("content"), "content", pa.array(["{}"], pa.large_string()))
    pq.write_table(wide, tmp_path / "wide.parquet")
    assert inv.file_problems(tmp_path / "wide.parquet", SILVER_SCHEMA) == []
    bad = pa.Table.from_pylist([row, {**row, "content_sha256": None}], schema=_loose(SILVER_SCHEMA))
    bad = bad.drop_columns(["split"])
    bad = bad.set_column(bad.schema.get_field_index("num_chars"), "num_chars", pa.array([2.0, 2.0]))
    pq.write_table(bad, tmp_path / "bad.parquet")
    assert [(p["column"], p["type"]) for p in inv.file_problems(tmp_path / "bad.parquet", SILVER_SCHEMA)] == [
        ("num_chars", "double"),
        ("split", "missing"),
        ("content_sha256", "string holding 1 NULL"),
    ]
    assert inv.file_problems(tmp_path / "absent.parquet", SILVER_SCHEMA)[0]["column"] is None


@pytest.mark.parametrize("column", ["content_sha256", "num_chars", "split", "content", "record_id"])
def test_a_null_in_silver_fails_every_silver_and_gold_gate_naming_it(tmp_path: Path, column: str):
    """A NULL hash joined no duplicate: a copy of a held-out record reached train with every gate passing."""
    paths, key = _silver_lake(tmp_path)
    assert all(o.passed for o in _judged(paths, key, "silver").values())  # type: ignore[union-attr]
    _rewrite(paths.partition_dir("silver", key) / "records.parquet", lambda t: _null_at(t, column))
    for layer in ("silver", "gold"):
        for name, outcome in _judged(paths, key, layer).items():
            assert isinstance(outcome, inv.Outcome), f"{name}: {outcome}"
            assert not outcome.passed and outcome.offending[0]["column"] == column, name
            assert outcome.offending[0]["type"] == "string holding 1 NULL" or column == "num_chars", name


def test_bronze_lacking_a_column_fails_every_bronze_gate_naming_it(tmp_path: Path):
    paths, key = _silver_lake(tmp_path)
    _rewrite(paths.partition_dir("bronze", key) / "records.parquet", lambda t: t.drop_columns(["content"]))
    for name, outcome in _judged(paths, key, "bronze").items():
        assert isinstance(outcome, inv.Outcome) and not outcome.passed, f"{name}: {outcome}"
        assert outcome.offending[0] | {"file": ""} == {"file": "", "column": "content", "type": "missing"}, name


def test_a_null_split_in_gold_fails_every_gold_gate(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    write_gold(paths.partition_dir("gold", "k"), [GOOD, GOOD])
    _rewrite(paths.partition_dir("gold", "k") / "examples.parquet", lambda t: _null_at(t, "split", 1))
    spec = make_spec(sequence={"max_seq_len": 8})
    chosen = [g for g in gates.gates_for(spec) if g.layer == "gold"]
    for g, outcome in gates.outcomes(spec, paths, "k", chosen):
        assert isinstance(outcome, inv.Outcome) and outcome.offending[0]["column"] == "split", g.name


def test_a_negative_mask_or_type_in_signed_lists_fails_mask_aligned(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD])
    schema = GOLD_SCHEMA
    for name in ("loss_mask", "token_type_ids"):
        schema = schema.set(schema.get_field_index(name), pa.field(name, pa.list_(pa.int8()), nullable=False))
    for over in ({"loss_mask": [-1, 1, 1], "num_loss_tokens": 1}, {"token_type_ids": [-1, 1, 3]}):
        row = {**pq.read_table(g / "examples.parquet").to_pylist()[0], **over}
        pq.write_table(pa.Table.from_pylist([row], schema=schema), g / "examples.parquet")
        assert inv.gold_mask_aligned(g).violations == 1, over


def test_a_duplicate_reject_naming_no_record_fails_the_manifest_duplicates_gate(tmp_path: Path):
    paths, key = _silver_lake(tmp_path)
    silver_dir = paths.partition_dir("silver", key)
    assert inv.duplicates_resolve_to_kept([silver_dir]).passed
    _rewrite(silver_dir / "rejects.parquet", lambda t: _null_at(t, "duplicate_of"))
    out = inv.duplicates_resolve_to_kept([silver_dir])
    assert out.violations == 1 and out.offending[0]["duplicate_of"] is None


def test_the_manifest_duplicates_gate_names_silver_lacking_a_column_or_missing_rather_than_raising(tmp_path: Path):
    """A rejects file without `duplicate_of` raised a DuckDB BinderException; a drop without silver an IOException."""
    paths, key = _silver_lake(tmp_path, ("a.jsonl", "b.jsonl"))
    first, last = (paths.partition_dir("silver", k) for k in sorted(registered_drops(paths)))
    _rewrite(last / "rejects.parquet", lambda t: t.drop_columns(["duplicate_of"]))
    (first / "records.parquet").unlink()
    out = inv.duplicates_resolve_to_kept([first, last])
    assert not out.passed and out.description.startswith("not judged")
    named = {(Path(p["file"]).parent.name, Path(p["file"]).name, p["column"]) for p in out.offending}
    assert named == {(first.name, "records.parquet", None), (last.name, "rejects.parquet", "duplicate_of")}


def test_a_duplicate_whose_kept_record_became_a_reject_fails_the_drop_scoped_duplicates_gate(tmp_path: Path):
    """With `dedup_scope: drop` nothing judged it: the record moved from silver's records to its rejects keeps the
    accounting whole and the kept contents unique, yet the duplicate removed for it names no record that ships."""
    spec = make_spec("ds", clean={"dedup": "exact"})
    paths, key = _silver_lake(tmp_path)  # built with dataset scope; drop scope gives the same files for one drop
    silver_dir = paths.partition_dir("silver", key)
    gate = next(g for g in gates.gates_for(spec) if g.name == "clean_records_duplicates_kept")
    assert gate.probe(spec, paths, key).passed
    assert "clean_records_duplicates_kept" not in {g.name for g in gates.gates_for(SPEC)}  # the manifest's, there
    rejects = pq.read_table(silver_dir / "rejects.parquet")
    (named,) = [r for r in rejects.to_pylist() if r["reason"] == "duplicate"]
    records = pq.read_table(silver_dir / "records.parquet").to_pylist()
    (moved,) = [r for r in records if r["record_id"] == named["duplicate_of"]]
    kept = [r for r in records if r is not moved]
    pq.write_table(pa.Table.from_pylist(kept, schema=SILVER_SCHEMA), silver_dir / "records.parquet")
    filtered = {**moved, "reason": "too_short", "detail": "", "duplicate_of": None, "content_sha256": None}
    pq.write_table(
        pa.Table.from_pylist([*rejects.to_pylist(), filtered], schema=rejects.schema), silver_dir / "rejects.parquet"
    )
    out = gate.probe(spec, paths, key)
    assert not out.passed and [r["duplicate_of"] for r in out.offending] == [moved["record_id"]]
    accounted = next(g for g in gates.gates_for(spec) if g.name == "clean_records_accounted")
    assert accounted.probe(spec, paths, key).passed


def test_fixed_length_names_a_sole_shard_file_holding_a_token_list_of_strings(tmp_path: Path):
    f = tmp_path / "train" / "part-00000.parquet"
    f.parent.mkdir(parents=True)
    schema = SHARD_SCHEMA.set(SHARD_SCHEMA.get_field_index("loss_mask"), pa.field("loss_mask", pa.list_(pa.string())))
    row = shard_row(loss_mask=["0", "1", "1", "0"])
    pq.write_table(pa.Table.from_pylist([row], schema=schema), f)
    out = inv.shards_fixed_length([f], 4)
    assert out.violations == 1 and out.offending[0]["column"] == "loss_mask"


def test_an_earlier_drops_index_row_without_a_hash_fails_unique_across_drops(tmp_path: Path):
    """A NULL hash in an earlier drop's dedup index joins nothing: a repeat of it would pass unnoticed."""
    paths, key = _silver_lake(tmp_path, ("a.jsonl", "b.jsonl"))
    assert _judged(paths, key, "silver")["clean_records_unique_across_drops"].passed  # type: ignore[union-attr]
    ((_, index),) = earlier_indexes(SPEC, paths, key)
    _rewrite(index, lambda t: _null_at(t, "content_sha256"))
    out = _judged(paths, key, "silver")["clean_records_unique_across_drops"]
    assert isinstance(out, inv.Outcome) and out.violations == 1
    assert out.offending == [{"index_file": str(index), "rows_without_hash_or_content": 1}]


def _pair(pair_id: str | None, branch: str | None) -> dict:
    return {**GOOD, "loss_mask": [0, 0, 1], "pair_id": pair_id, "branch": branch, "shared_prefix_tokens": 2}


@pytest.mark.parametrize(
    "rows",
    [
        [_pair("p", "chosen"), _pair("p", "rejected"), _pair(None, "chosen")],
        [_pair(None, "chosen"), _pair(None, "rejected")],
        [_pair("p", "chosen"), _pair("p", None)],
    ],
    ids=["an_example_of_no_pair", "a_pair_of_null_ids", "a_null_branch"],
)
def test_pairs_complete_fails_an_example_of_no_pair_or_branch(tmp_path: Path, rows: list[dict]):
    g = write_gold(tmp_path / "g", [_pair("p", "chosen"), _pair("p", "rejected")])
    assert inv.gold_pairs_complete(g).passed
    write_gold(g, rows)
    assert not inv.gold_pairs_complete(g).passed


def test_a_truncated_shard_file_is_named_by_every_shard_gate_not_raised(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    shards = paths.partition_dir("shards", "k") / "train"
    write_shard(shards / "part-00000.parquet", [shard_row8()])
    broken = write_shard(shards / "part-00001.parquet", [shard_row8()])
    broken.write_bytes(broken.read_bytes()[:100])
    write_gold(paths.partition_dir("gold", "k"), [GOOD])
    spec = make_spec(sequence={"max_seq_len": 8})
    chosen = [g for g in gates.gates_for(spec) if g.layer == "shards"]
    for g, outcome in gates.outcomes(spec, paths, "k", chosen):
        assert isinstance(outcome, inv.Outcome) and not outcome.passed, f"{g.name}: {outcome}"
        assert outcome.offending[0]["file"] == str(broken) and outcome.offending[0]["column"] is None, g.name


def test_large_lists_large_and_dictionary_strings_read_as_the_schemas_kinds(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD])
    table = pq.read_table(g / "examples.parquet")
    for name in ("token_ids", "loss_mask", "token_type_ids"):
        at = table.schema.get_field_index(name)
        table = table.set_column(
            at, name, table.column(name).cast(pa.large_list(table.schema.field(at).type.value_type))
        )
    at = table.schema.get_field_index("split")
    table = table.set_column(at, "split", table.column("split").dictionary_encode())
    pq.write_table(table, g / "examples.parquet")
    assert inv.file_problems(g / "examples.parquet", GOLD_SCHEMA) == []
    assert inv.gold_mask_aligned(g).passed


def test_silver_build_refuses_bronze_lacking_a_column_and_keeps_the_silver_it_had(tmp_path: Path):
    paths, key = _silver_lake(tmp_path)
    before = (paths.partition_dir("silver", key) / "records.parquet").read_bytes()
    _rewrite(paths.partition_dir("bronze", key) / "records.parquet", lambda t: t.drop_columns(["content"]))
    with pytest.raises(DropError, match=r"records\.parquet is not a file this pipeline writes \(column 'content'"):
        silver.build(SPEC, paths, key)
    assert (paths.partition_dir("silver", key) / "records.parquet").read_bytes() == before


@pytest.mark.parametrize("column", ["split", "content"])
def test_gold_build_refuses_silver_holding_a_null_rather_than_a_traceback(tmp_path: Path, column: str):
    """It raised ArrowInvalid from the reader (a traceback in the run), before the check."""
    paths, key = _silver_lake(tmp_path)
    _rewrite(paths.partition_dir("silver", key) / "records.parquet", lambda t: _null_at(t, column))
    with pytest.raises(DropError, match=rf"column '{column}': string holding 1 NULL\): rematerialize silver"):
        gold.build(SPEC, paths, key)
    assert not paths.partition_dir("gold", key).exists()


def test_shards_build_refuses_gold_holding_a_null_split_or_a_double_count(tmp_path: Path):
    """Both built shards before the check; only the gates after the build refused them."""
    paths = dataset_paths(tmp_path, "ds")
    gold_dir = write_gold(paths.partition_dir("gold", "k"), [GOOD, GOOD])
    _rewrite(gold_dir / "examples.parquet", lambda t: _null_at(t, "split", 1))
    with pytest.raises(DropError, match=r"column 'split': string holding 1 NULL\): rematerialize gold"):
        shards.build(SPEC, paths, "k")
    write_gold(gold_dir, [GOOD, GOOD])
    _rewrite(gold_dir / "examples.parquet", lambda t: _as(t, "num_tokens", pa.float64()))
    with pytest.raises(DropError, match=r"column 'num_tokens': double\)"):
        shards.build(SPEC, paths, "k")
    assert not paths.partition_dir("shards", "k").exists()


@pytest.mark.parametrize("garbage", [None, b"PAR1 not a footer"])
def test_a_build_names_an_input_file_missing_or_unreadable(tmp_path: Path, garbage: bytes | None):
    paths, key = _silver_lake(tmp_path)
    path = paths.partition_dir("silver", key) / "records.parquet"
    path.unlink()
    if garbage is not None:
        path.write_bytes(garbage)
    said = "is not there" if garbage is None else "not a readable Parquet file"
    with pytest.raises(DropError, match=said):
        gold.build(SPEC, paths, key)
