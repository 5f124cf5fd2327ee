"""The gates as declared: each one name and one description (the check's, the UI's and the docs' table), and
judged together (gold's row rules in one pass, the shard gates from one pass over the shard rows) each reports what
it finds alone."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import gates
from prep_assets.core import invariants as inv
from prep_assets.core.lake import dataset_paths
from prep_assets.core.manifest import manifest_outcomes
from prep_assets.core.records import SHARD_SCHEMA, SILVER_REJECT_SCHEMA, SILVER_SCHEMA
from prep_assets_tests.conftest import PROJECT, make_spec
from prep_assets_tests.core.lakes import (
    BY_ROWS,
    GOOD,
    shard_row8,
    write_gold,
    write_shard,
    write_silver_and_gold_rejects,
)


def test_shard_gates_run_together_report_what_each_finds_alone(lake):
    spec, paths, chosen = lake
    together = gates.outcomes(spec, paths, "k", chosen)
    assert [g.name for g, _ in together] == BY_ROWS
    for g, outcome in together:
        assert outcome == g.probe(spec, paths, "k") and not outcome.passed  # type: ignore[union-attr]
    assert [[r["row"] for r in o.offending] for _, o in together][0] == [1]  # type: ignore[union-attr]


def test_a_failing_shared_pass_is_reported_by_each_gate_that_reads_it(lake, monkeypatch):
    spec, paths, chosen = lake
    other = next(g for g in gates.gates_for(spec) if g.name == "packed_shards_utilization")

    def broken(*_: object) -> None:
        raise RuntimeError("the shard pass broke")

    monkeypatch.setattr(inv, "shard_rows", broken)
    out = gates.outcomes(spec, paths, "k", [*chosen, other])
    assert [(g.name, str(o)) for g, o in out if isinstance(o, Exception)] == [
        (name, "the shard pass broke") for name in BY_ROWS
    ]
    assert isinstance(out[-1][1], inv.Outcome)  # a gate that reads the shards on its own still reports


def test_a_gate_that_raises_on_the_shared_rows_leaves_the_others_their_outcomes(lake, monkeypatch):
    spec, paths, chosen = lake

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("positions broke")

    monkeypatch.setattr(inv, "shards_positions_restart", broken)
    out = dict((g.name, o) for g, o in gates.outcomes(spec, paths, "k", chosen))
    assert str(out["packed_shards_positions_restart"]) == "positions broke"
    assert [r["row"] for r in out["packed_shards_fixed_length"].offending] == [1]  # type: ignore[union-attr]
    assert not out["packed_shards_match_gold"].passed  # type: ignore[union-attr]


def _named(outcome: object) -> object:
    return f"{type(outcome).__name__}: {outcome}" if isinstance(outcome, Exception) else outcome


_UNREADABLE = {
    "segment_ids_missing": lambda t: t.drop_columns(["segment_ids"]),
    "example_ids_missing": lambda t: t.drop_columns(["example_ids"]),
    "num_loss_tokens_missing": lambda t: t.drop_columns(["num_loss_tokens"]),
    "example_ids_of_integers": lambda t: t.set_column(
        t.schema.get_field_index("example_ids"), "example_ids", pa.array([[7]], pa.list_(pa.int64()))
    ),
    "num_loss_tokens_a_float": lambda t: t.set_column(
        t.schema.get_field_index("num_loss_tokens"), "num_loss_tokens", pa.array([3.0])
    ),
    "seq_lengths_of_floats": lambda t: t.set_column(
        t.schema.get_field_index("seq_lengths"), "seq_lengths", pa.array([[3.4]], pa.list_(pa.float64()))
    ),
}


@pytest.mark.parametrize("change", list(_UNREADABLE), ids=list(_UNREADABLE))
def test_a_shard_file_lacking_a_column_or_holding_another_type_is_named_by_every_shard_gate_not_raised(
    tmp_path: Path, change: str
):
    paths = dataset_paths(tmp_path, "ds")
    shards = paths.partition_dir("shards", "k") / "train"
    write_shard(shards / "part-00000.parquet", [shard_row8()])
    changed = _UNREADABLE[change](pa.Table.from_pylist([shard_row8()], schema=SHARD_SCHEMA))
    pq.write_table(changed, shards / "part-00001.parquet")
    write_gold(paths.partition_dir("gold", "k"), [GOOD])
    spec = make_spec(sequence={"max_seq_len": 8})
    chosen = [g for g in gates.gates_for(spec) if g.layer == "shards"]
    together = {g.name: _named(o) for g, o in gates.outcomes(spec, paths, "k", chosen)}
    assert together == {g.name: _named(gates.outcomes(spec, paths, "k", [g])[0][1]) for g in chosen}
    column = change.split("_missing")[0].split("_of_")[0].split("_a_")[0]
    for name, outcome in together.items():
        assert isinstance(outcome, inv.Outcome), f"{name}: {outcome}"
        assert not outcome.passed and outcome.offending[0]["column"] == column, name
        assert outcome.offending[0]["file"] == str(shards / "part-00001.parquet"), name


def test_gold_row_gates_run_together_are_named_and_report_what_each_finds_alone(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    write_gold(
        paths.partition_dir("gold", "k"),
        [
            GOOD,
            {"token_ids": [5, 6, 7], "loss_mask": [0, 1], "token_type_ids": [1, 1, 3]},
            {"token_ids": [1, 2], "loss_mask": [0, 0], "token_type_ids": [1, 3]},
            {"token_ids": [1, 99, 3, 4, 5, 6, 7, 8, 9], "loss_mask": [0] + [1] * 8, "token_type_ids": [1] * 8 + [3]},
        ],
    )
    spec = make_spec(sequence={"max_seq_len": 8})
    names = [
        "tokenized_examples_mask_aligned",
        "tokenized_examples_have_loss_tokens",
        "tokenized_examples_within_max_len",
    ]
    chosen = [g for g in gates.gates_for(spec) if g.name in names]
    together = gates.outcomes(spec, paths, "k", chosen)
    assert [(o.name, [r["example_id"] for r in o.offending]) for _, o in together] == [  # type: ignore[union-attr]
        ("tokenized_examples_mask_aligned", ["d:2"]),
        ("tokenized_examples_have_loss_tokens", ["d:3"]),
        ("tokenized_examples_within_max_len", ["d:4"]),
    ]
    assert [o for _, o in together] == [g.probe(spec, paths, "k") for g in chosen]


def test_every_gate_has_one_name_and_its_outcome_carries_its_description(lake):
    spec, paths, chosen = lake
    assert len({g.name for g in gates.GATES}) == len(gates.GATES)
    prefix = {"bronze": "raw_records", "silver": "clean_records", "gold": "tokenized_examples"}
    prefix |= {"shards": "packed_shards", "manifest": "dataset_manifest"}
    assert all(g.name.startswith(prefix[g.layer]) and g.description for g in gates.GATES)
    for g, outcome in gates.outcomes(spec, paths, "k", chosen):
        assert outcome.name == g.name and outcome.description == g.description  # type: ignore[union-attr]


def test_a_gate_that_measures_more_than_a_count_says_so_in_its_outcome(tmp_path: Path):
    paths = dataset_paths(tmp_path, "ds")
    s, g = write_silver_and_gold_rejects(tmp_path / "built", 4, [("too_long", 2)])
    for built, layer in ((s, "silver"), (g, "gold")):
        paths.partition_dir(layer, "k").parent.mkdir(parents=True, exist_ok=True)
        built.rename(paths.partition_dir(layer, "k"))
    gate = next(x for x in gates.GATES if x.name == "tokenized_examples_reject_rate")
    outcome = gate.probe(make_spec(checks={"max_gold_reject_rate": 0.5}), paths, "k")
    assert outcome.passed and outcome.description == "gold rejects / silver records = 1 / 4 = 25.00% (at most 50.00%)"


def test_docs_gates_table_is_the_declared_one():
    """docs/shards.md holds exactly `markdown_table()`: regenerate it there when a gate changes."""
    text = (PROJECT / "docs" / "shards.md").read_text(encoding="utf-8")
    start = text.index("| layer | check | asserts |")
    end = text.find("\n\n", start)
    assert text[start : None if end < 0 else end + 1] == gates.markdown_table()
    assert text.count("| layer | check | asserts |") == 1


@pytest.mark.parametrize("scope", ["drop", "dataset"])
def test_the_manifest_is_judged_by_its_declared_gates(tmp_path: Path, scope: str):
    spec = make_spec(clean={"dedup_scope": scope})
    paths = dataset_paths(tmp_path, "ds")
    manifest = {"tokenizer_fingerprint": "a", "partitions": {"k1": {"tokenizer_fingerprint": "b"}}}
    silver = paths.partition_dir("silver", "k1")
    silver.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([], schema=SILVER_SCHEMA), silver / "records.parquet")
    pq.write_table(pa.Table.from_pylist([], schema=SILVER_REJECT_SCHEMA), silver / "rejects.parquet")
    out = manifest_outcomes(spec, paths, manifest)
    assert [o.name for o in out] == [g.name for g in gates.manifest_gates_for(spec)]
    assert out[0].name == "dataset_manifest_one_tokenizer" and out[0].violations == 1
    assert out[0].offending == [{"partition": "k1", "tokenizer_fingerprint": "b"}]
    assert [o.passed for o in out[1:]] == ([True] if scope == "dataset" else [])
    assert not set(gates.manifest_gates_for(spec)) & set(gates.gates_for(spec))


def test_a_tabular_manifest_of_drops_with_other_columns_fails_its_one_schema_gate(tmp_path: Path):
    """Drops of one tabular dataset with other columns (or the same in another order) each trained under their own
    schema prompt while the manifest stated the first drop's, every gate green."""
    import json

    spec = make_spec(input={"type": "tabular"})
    paths = dataset_paths(tmp_path, "ds")
    columns = {"d1": ["g", "a", "b"], "d2": ["g", "b", "a"], "d3": ["g", "a", "c"], "d4": ["g", "a", "b"]}
    columns["d5"] = []  # a header-only drop: no record, so no schema it trained under
    for k, cols in columns.items():
        stats = paths.partition_dir("gold", k)
        stats.mkdir(parents=True)
        (stats / "stats.json").write_text(json.dumps({"tabular": {"columns": cols, "records": len(cols)}}))
    manifest = {"tokenizer_fingerprint": "a", "partitions": {k: {"tokenizer_fingerprint": "a"} for k in columns}}
    (gate,) = [o for o in manifest_outcomes(spec, paths, manifest) if o.name == "dataset_manifest_one_table_schema"]
    assert gate.violations == 2 and [o["partition"] for o in gate.offending] == ["d2", "d3"]
    assert gate.offending[0]["columns"] == "g, b, a" and gate.offending[0]["its_columns"] == "g, a, b"
    del manifest["partitions"]["d2"], manifest["partitions"]["d3"]
    assert all(o.passed for o in manifest_outcomes(spec, paths, manifest))
    assert "dataset_manifest_one_table_schema" not in {g.name for g in gates.manifest_gates_for(make_spec())}


def test_cleaning_that_rejects_every_record_fails_a_drop_of_only_repeats_passes(tmp_path: Path):
    """A `clean` threshold edited too far emptied every drop: all gates green, an empty manifest, exit 0."""
    from prep_assets_tests.conftest import copy_sample_data
    from prep_assets_tests.core.helpers import run_core, sample_spec

    copy_sample_data(tmp_path)
    spec = sample_spec(tmp_path, "sample_text", clean={"min_chars": 10**6})
    for key in run_core(tmp_path, spec):
        (failed,) = [o for o in gates.evaluate(spec, dataset_paths(tmp_path, spec.name), key) if not o.passed]
        assert failed.name == "clean_records_not_emptied" and "too_short" in failed.description
    silver = tmp_path / "silver"
    silver.mkdir()
    pq.write_table(SILVER_SCHEMA.empty_table(), silver / "records.parquet")
    rejects = pa.Table.from_pylist(
        [
            {
                "record_id": "d:1",
                "drop": "d",
                "source_file": "f",
                "source_line": 1,
                "byte_offset": 0,
                "reason": "duplicate",
                "detail": "",
                "content": "{}",
            }
        ],
        schema=SILVER_REJECT_SCHEMA,
    )
    pq.write_table(rejects, silver / "rejects.parquet")
    assert inv.silver_not_emptied(silver).passed  # every record a repeat of a kept one: nothing lost
    one_short = {**rejects.to_pylist()[0], "record_id": "d:2", "source_line": 2, "reason": "too_short"}
    pq.write_table(
        pa.Table.from_pylist([*rejects.to_pylist(), one_short], schema=SILVER_REJECT_SCHEMA),
        silver / "rejects.parquet",
    )
    assert inv.silver_not_emptied(silver).passed  # a drop redelivered whole, one record too short: no mistake
