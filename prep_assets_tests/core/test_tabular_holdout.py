"""`tabular.holdout` holds out the records Safe Synthesizer's holdout holds out (same seed, same records, same
training order) and refuses what it refuses. Expected splits: prep_assets_tests/fixtures/safe_synthesizer/
holdout_splits.json (SS 0.1.12's `Holdout`, see the README there)."""

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prep_assets.core.errors import DropError, SpecError
from prep_assets.core.tabular_holdout import HoldoutRefused, holdout_size, split_groups, split_records
from prep_assets_tests.conftest import make_spec, shared_path
from prep_assets_tests.core.helpers import run_core, write_raw

FIXTURES = Path(__file__).parent.parent / "fixtures" / "safe_synthesizer"
SPLITS = {c["name"]: c for c in json.loads((FIXTURES / "holdout_splits.json").read_text(encoding="utf-8"))}
SS_DEFAULTS = {"holdout": 0.05, "max_holdout": 2000}  # SS's data.holdout and data.max_holdout


def _rows(table: str) -> list[dict[str, str]]:
    with shared_path(f"datasets/tabular/{table}").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", [n for n, c in SPLITS.items() if "data" in c])  # SS's Holdout, config `data`
def test_the_held_out_records_are_safe_synthesizers(name: str):
    case = SPLITS[name]
    data = {**SS_DEFAULTS, **case["data"]}
    rows = _rows(case["table"])
    group = data.get("group_training_examples_by")

    def ours():
        size = holdout_size(len(rows), data["holdout"], data["max_holdout"])
        if size is None:
            return None
        seed = data["random_state"]
        return split_groups([r[group] for r in rows], size, seed) if group else split_records(len(rows), size, seed)

    if "refused" in case:
        with pytest.raises(HoldoutRefused):
            ours()
        return
    split = ours()
    if case["test"] is None:
        assert split is None
        return
    assert split is not None and (split.train, split.test) == (case["train"], case["test"])


def test_the_naive_split_on_iris_is_safe_synthesizers():
    case = SPLITS["iris_naive_split_15"]
    split = split_records(150, case["test_size"], case["random_state"])
    assert (split.train, split.test) == (case["train"], case["test"])


def _spec(seed: int = 0, **tabular):
    return make_spec(
        "ho",
        recipe="safe_synthesizer",
        input={"type": "tabular"},
        tokenizer={"path": str(shared_path("tokenizers/tinyllama"))},
        checks={"min_sequence_utilization": 0.0},
        split={"seed": seed},  # SS's data.random_state
        tabular=tabular,
    )


def _held_out_rows(tmp_path: Path, table: str, spec) -> tuple[set[int], list[int]]:
    """The 0-based data rows gold puts in test, and the training rows in the order of its first example."""
    data = write_raw(tmp_path / "data", "ho", {"t.csv": shared_path(f"datasets/tabular/{table}").read_text()})
    ((_, r),) = run_core(data, spec).items()
    silver = pq.read_table(r["dirs"][1] / "records.parquet", columns=["record_id", "source_line"]).to_pylist()
    row = {x["record_id"]: x["source_line"] - 2 for x in silver}
    gold = pq.read_table(r["dirs"][2] / "examples.parquet", columns=["split", "record_ids"]).to_pylist()
    test = {row[i] for g in gold if g["split"] == "test" for i in g["record_ids"]}
    train = [row[i] for g in gold if g["split"] == "train" for i in g["record_ids"]]
    return test, train


def test_gold_holds_out_safe_synthesizers_groups(tmp_path: Path):
    case = SPLITS["patients_grouped_ratio"]
    spec = _spec(group_by="patient_name", holdout=0.1)
    test, train = _held_out_rows(tmp_path, case["table"], spec)
    assert test == set(case["test"]) and sorted(set(train)) == case["train"]


def test_gold_holds_out_safe_synthesizers_records(tmp_path: Path):
    case = SPLITS["patients_clamped"]
    spec = _spec(seed=7, holdout=0.5, max_holdout=30)
    test, train = _held_out_rows(tmp_path, case["table"], spec)
    assert test == set(case["test"]) and sorted(train) == sorted(case["train"])


def test_a_table_under_200_records_is_refused(tmp_path: Path):
    data = write_raw(tmp_path / "data", "ho", {"t.csv": shared_path("datasets/tabular/iris.csv").read_text()})
    with pytest.raises(DropError, match="has 150 records; a holdout needs at least 200"):
        run_core(data, _spec(holdout=0.05))


def test_holdout_keys_that_conflict_are_spec_errors():
    with pytest.raises(SpecError, match="tabular.holdout is Safe Synthesizer's test split"):
        make_spec("t", input={"type": "tabular"}, tabular={"holdout": 0.1}, split={"test_ratio": 0.1})
    with pytest.raises(SpecError, match="ungrouped time series"):
        make_spec("t", input={"type": "tabular"}, tabular={"holdout": 0.1, "time_series": True, "order_by": "t"})
    assert _spec().tabular.holdout == 0  # off unless the spec sets it (SS's default is 0.05)


def test_a_group_held_out_in_one_drop_and_trained_in_another_fails_the_manifest_gate(tmp_path: Path):
    """The holdout draws each drop's test groups apart: a device in both drops was in test in one and in train in
    the other, and every gate passed (drop by drop, no group is divided)."""
    from prep_assets.core import invariants as inv
    from prep_assets_tests.core.lakes import GOOD, write_gold

    day1 = write_gold(
        tmp_path / "day1", [{**GOOD, "group_keys": ["d1"], "split": "test"}, {**GOOD, "group_keys": ["d2"]}]
    )
    day2 = write_gold(tmp_path / "day2", [{**GOOD, "group_keys": ["d1", "d1"]}, {**GOOD, "group_keys": ["d2"]}])
    out = inv.groups_in_one_split([day1, day2])
    assert out.violations == 1 and [r["group_key"] for r in out.offending] == ["d1"]
    assert out.offending[0]["splits"] == "test, train" and "give each group one drop" in out.description
    assert inv.groups_in_one_split([day2]).passed and inv.groups_in_one_split([]).passed
    (day1 / "examples.parquet").unlink()
    assert inv.groups_in_one_split([day1, day2]).description.startswith("not judged")
