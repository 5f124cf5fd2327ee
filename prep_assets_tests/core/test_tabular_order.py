"""order_by typed over a drop (numbers, epoch clocks, ISO 8601 and M/D/YYYY date-times) and the records that
have no place in a group: empty or unreadable order values (gold rejects) and empty group keys (bronze rejects).

The end-to-end cases run CSV drops through bronze, silver and gold with GPT-2 and check, besides the order, that
every data row is kept or rejected once: rows = bronze records + bronze rejects, silver records = records in gold
examples + gold rejects (and the gold accounting gate agrees)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prep_assets.core import invariants as inv
from prep_assets.core.tabular import initial_prefill, order_keys
from prep_assets_tests.conftest import make_spec, shared_path
from prep_assets_tests.core.helpers import run_core, write_raw

SEQUENTIAL = {"group_by": "dev", "order_by": "t", "time_series": True}


def _sorted(values: list) -> list[int]:
    typed = order_keys(values, "t")
    assert not typed.problems
    return sorted(range(len(values)), key=lambda i: typed.keys[i])


# ---------------------------------------------------------------- the typing rule on values


def test_m_d_yyyy_orders_by_time_across_month_and_year_boundaries():
    values = [
        "1/10/2024 00:00",
        "1/9/2024 22:00",
        "1/31/2024 23:59",
        "2/1/2024 0:00",
        "12/31/2023 23:00",
        "1/9/2024",
        "1/9/2024 22:00:30",
        "1/9/2024 9:59 PM",
    ]
    typed = order_keys(values, "t")
    assert typed.type == "datetime" and typed.kinds == {"datetime": 8}
    assert [values[i] for i in _sorted(values)] == [
        "12/31/2023 23:00",
        "1/9/2024",
        "1/9/2024 9:59 PM",
        "1/9/2024 22:00",
        "1/9/2024 22:00:30",
        "1/10/2024 00:00",
        "1/31/2024 23:59",
        "2/1/2024 0:00",
    ]
    assert sorted(values)[:2] == ["1/10/2024 00:00", "1/31/2024 23:59"]  # what text order did


def test_slash_dates_read_day_first_only_when_the_column_rules_out_month_first():
    dmy = ["13/1/2024 10:00", "2/1/2024 09:00", "1/2/2024"]  # 13 cannot be a month, no second field is over 12
    typed = order_keys(dmy, "t")
    assert typed.type == "datetime" and typed.day_first and not typed.problems
    assert [dmy[i] for i in _sorted(dmy)] == ["2/1/2024 09:00", "13/1/2024 10:00", "1/2/2024"]  # 2 Jan, 13 Jan, 1 Feb
    both = order_keys(["13/1/2024", "1/13/2024", "1/14/2024"], "t")  # either reading fails a value: M/D stands
    assert not both.day_first and list(both.problems) == [0]
    assert not order_keys(["1/2/2024", "2/1/2024"], "t").day_first  # undecidable: M/D/YYYY, the documented default


def test_iso_with_a_time_zone_orders_instants_and_without_one_wall_times():
    zoned = ["2024-03-10T01:30:00-05:00", "2024-03-10T07:00:00+01:00", "2024-03-10T06:15Z", "2024-03-10T06:15:00.5Z"]
    assert order_keys(zoned, "t").type == "datetime_tz"
    assert [zoned[i] for i in _sorted(zoned)] == [  # 06:00Z, 06:15Z, 06:15:00.5Z, 06:30Z
        "2024-03-10T07:00:00+01:00",
        "2024-03-10T06:15Z",
        "2024-03-10T06:15:00.5Z",
        "2024-03-10T01:30:00-05:00",
    ]
    naive = ["2024-03-10 10:00", "2024-03-09T23:00:59", "2024-03-10", "2024-02-29T12:00"]
    assert order_keys(naive, "t").type == "datetime"
    assert _sorted(naive) == [3, 1, 2, 0]


def test_a_zone_in_a_column_of_wall_times_is_unorderable_not_guessed():
    typed = order_keys(["2024-03-10 10:00", "2024-03-10 11:00", "2024-03-10T10:30+02:00"], "t")
    assert typed.type == "datetime" and list(typed.problems) == [2]
    assert "'2024-03-10T10:30+02:00' does not read as datetime" in typed.problems[2]


def test_epoch_seconds_and_milliseconds_are_one_clock():
    seconds = [1700000100, 1700000000, 1699999999]
    millis = [1700000100000, 1700000000000, 1699999999000]
    assert order_keys(seconds, "t").type == "epoch_s" and _sorted(seconds) == [2, 1, 0]
    assert order_keys(millis, "t").type == "epoch_ms" and _sorted(millis) == [2, 1, 0]
    mixed = [1700000000500, 1700000000, 1700000001, 1699999999000]
    assert order_keys(mixed, "t").type == "epoch_s_ms"
    assert [mixed[i] for i in _sorted(mixed)] == [1699999999000, 1700000000, 1700000000500, 1700000001]
    assert order_keys([5, 1700000000], "t").type == "int"  # not every value on an epoch clock: plain numbers


def test_mixed_ints_and_floats_order_numerically():
    values = ["10", "9.5", "2", "2.25", "-1", "007"]
    typed = order_keys(values, "t")
    assert typed.type == "float" and typed.kinds == {"number": 6}
    assert [values[i] for i in _sorted(values)] == ["-1", "2", "2.25", "007", "9.5", "10"]
    assert order_keys([3, 1, 2], "t").type == "int"


def test_unreadable_and_empty_values_have_no_key_and_say_why():
    values = ["1/9/2024", "yesterday", "", None, "2/30/2024", "  ", "1/8/2024"]
    typed = order_keys(values, "t")
    assert typed.type == "string" and typed.kinds == {"datetime": 2, "text": 2}  # 2 of 4 is no majority...
    typed = order_keys([*values, "1/7/2024"], "t")
    assert typed.type == "datetime"  # ...3 of 5 is
    assert sorted(typed.problems) == [1, 2, 3, 4, 5] and [k is None for k in typed.keys] == [
        False,
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert typed.problems[1] == (
        "order_by column 't': 'yesterday' does not read as datetime, the column's type "
        "(3 of its 5 non-empty values do)"
    )
    assert "'2/30/2024' does not read as datetime" in typed.problems[4]
    assert typed.problems[3].startswith("order_by column 't' is empty (null)")
    assert typed.problems[5].startswith("order_by column 't' is empty ('  ')")


def test_without_a_majority_type_the_column_orders_as_text_and_rejects_only_empties():
    typed = order_keys(["b", "a", 3, "1/9/2024", None], "t")
    assert typed.type == "string" and list(typed.problems) == [4]
    assert sorted(range(4), key=lambda i: typed.keys[i]) == [3, 2, 1, 0]  # "1/9/2024" < "3" < "a" < "b"


def test_ties_keep_input_order_also_across_formats():
    values = ["1/9/2024 22:00", "2024-01-09T22:00", "1/9/2024 10:00 PM", "1/9/2024 21:00"]
    assert _sorted(values) == [3, 0, 1, 2]


def test_initial_prefill_types_the_gathered_records_of_every_drop():
    rows = {
        "d": [json.dumps({"t": v}) for v in ("1/10/2024 00:00", "1/9/2024 22:00", "12/31/2023 1:00", "1/9/2024 23:00")]
    }
    assert [json.loads(r)["t"] for r in initial_prefill(rows, "t")["d"]] == [
        "12/31/2023 1:00",
        "1/9/2024 22:00",
        "1/9/2024 23:00",
    ]
    ms_and_s = {"d": [json.dumps({"t": v}) for v in (1700000002, 1700000001000, 1700000000)]}
    assert [json.loads(r)["t"] for r in initial_prefill(ms_and_s, "t")["d"]] == [1700000000, 1700000001000, 1700000002]


# ---------------------------------------------------------------- end to end: order, rejects, accounting


def _run(tmp_path: Path, gpt2: Path, drops: dict[str, str], tabular: dict, **extra) -> dict:
    data = write_raw(tmp_path / "data", "tab", drops)
    sections = {
        "input": {"type": "tabular"},
        "tokenizer": {"path": str(gpt2)},
        "clean": {"dedup": "none"},
        "sequence": {"max_seq_len": 1024},
        "split": {"test_ratio": 0.0},
        "tabular": tabular,
        "packing": {"max_sequences_per_example": 50},
        "checks": {"min_sequence_utilization": 0.0, "max_reject_rate": 1.0},
    }
    spec = make_spec("tab", **{**sections, **extra})
    out = {}
    for key, r in run_core(data, spec).items():
        bronze, silver, gold, _ = r["dirs"]
        examples = pq.read_table(gold / "examples.parquet").to_pylist()
        rejects = pq.read_table(gold / "rejects.parquet").to_pylist()
        # every data row kept or rejected once, in the layer that knew why
        assert r["bronze"].lines_in == r["bronze"].records + r["bronze"].rejects + r["bronze"].blank_lines
        in_examples = [rid for e in examples for rid in e["record_ids"]]
        assert (
            r["silver"].records
            == len(in_examples) + len(rejects)
            == len(set(in_examples) | {x["record_id"] for x in rejects})
        )
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


def test_sequences_of_m_d_yyyy_times_are_in_time_order(tmp_path: Path, gpt2_dir: Path):
    csv = (
        "dev,t,v\n"
        "a,1/10/2024 00:00,1\n"  # line 2
        "a,1/9/2024 22:00,2\n"
        "b,2/1/2024 0:00,3\n"
        "a,12/31/2023 23:00,4\n"
        "b,1/31/2024 23:59,5\n"
        "a,1/9/2024 22:00:30,6\n"
    )  # line 7
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, SEQUENTIAL))
    assert _ordered_lines(r) == {"a": [5, 3, 7, 2], "b": [6, 4]} and r["rejects"] == []
    tab = r["stats"]["gold"].tabular
    assert tab["order_by_type"] == "datetime" and tab["unorderable_records"] == 0
    prefill = [json.loads(x)["t"] for x in tab["initial_prefill"]["a"]]
    assert prefill == ["12/31/2023 23:00", "1/9/2024 22:00", "1/9/2024 22:00:30"]


@pytest.mark.parametrize(
    ("values", "kind", "order"),
    [
        (["2024-03-10T01:30:00-05:00", "2024-03-10T07:00:00+01:00", "2024-03-10T06:15Z"], "datetime_tz", [3, 4, 2]),
        (["2024-03-10 10:00", "2024-03-09T23:00", "2024-03-10"], "datetime", [3, 4, 2]),
        ([1700000100, 1700000000, 1699999999], "epoch_s", [4, 3, 2]),
        ([1700000000500, 1700000000, 1699999999000], "epoch_s_ms", [4, 3, 2]),
        (["10", "9.5", "-1"], "float", [4, 3, 2]),
    ],
    ids=["iso_zoned", "iso_wall_time", "epoch_s", "epoch_s_and_ms", "ints_and_floats"],
)
def test_each_type_orders_its_sequences(tmp_path: Path, gpt2_dir: Path, values: list, kind: str, order: list):
    csv = "dev,t\n" + "".join(f"a,{v}\n" for v in values)
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, SEQUENTIAL))
    assert _ordered_lines(r) == {"a": order} and r["rejects"] == []
    assert r["stats"]["gold"].tabular["order_by_type"] == kind


def test_unreadable_and_empty_order_values_are_gold_rejects_naming_the_value(tmp_path: Path, gpt2_dir: Path):
    csv = (
        "dev,t,v\n"
        "a,1/10/2024 00:00,1\n"  # line 2
        "a,yesterday,2\n"
        "a,1/9/2024 22:00,3\n"
        "b,,4\n"
        "b,1/8/2024 10:00,5\n"
        "a,2/30/2024,6\n"
    )  # line 7
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, SEQUENTIAL))
    assert _ordered_lines(r) == {"a": [4, 2], "b": [6]}
    got = [(x["source_line"], x["reason"], x["group_key"], x["source_file"]) for x in r["rejects"]]
    assert got == [
        (3, "unorderable_value", "a", "t.csv"),
        (5, "unorderable_value", "b", "t.csv"),
        (7, "unorderable_value", "a", "t.csv"),
    ]
    assert all(x["byte_offset"] > 0 for x in r["rejects"])
    assert "'yesterday' does not read as datetime" in r["rejects"][0]["detail"]
    assert r["rejects"][1]["detail"].startswith("order_by column 't' is empty")
    tab = r["stats"]["gold"].tabular
    assert tab["unorderable_records"] == 3 and tab["over_budget"] == []
    assert r["stats"]["gold"].rejects_by_reason == {"unorderable_value": 3}


def test_an_empty_group_cell_is_a_bronze_reject_and_the_text_null_its_own_group(tmp_path: Path, gpt2_dir: Path):
    csv = (
        "dev,t\n"
        "null,2\n"  # line 2: the text "null" names a group
        ",1\n"  # line 3: no group
        "null,1\n"
        "  ,3\n"  # line 5: blank
        "a,1\n"
    )
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
    assert [(x["source_line"], x["reason"]) for x in r["bronze_rejects"]] == [
        (2, "empty_group_key"),
        (3, "empty_group_key"),
    ]


def test_json_rows_null_and_absent_group_keys_are_rejects_the_text_null_a_group(tmp_path: Path, gpt2_dir: Path):
    rows = [{"dev": "null", "t": 1}, {"dev": None, "t": 1}, {"t": 2}, {"dev": "", "t": 3}, {"dev": "null", "t": 0}]
    text = "".join(json.dumps(x) + "\n" for x in rows)
    r = _one(_run(tmp_path, gpt2_dir, {"t.jsonl": text}, SEQUENTIAL))
    assert _ordered_lines(r) == {"null": [5, 1]}
    assert [(x["source_line"], x["reason"]) for x in r["bronze_rejects"]] == [
        (2, "empty_group_key"),
        (3, "empty_group_key"),
        (4, "empty_group_key"),
    ]
    assert "(absent)" in r["bronze_rejects"][1]["detail"]


def test_ties_keep_file_order(tmp_path: Path, gpt2_dir: Path):
    csv = "dev,t,v\na,1/9/2024 22:00,1\na,1/9/2024 21:00,2\na,2024-01-09T22:00,3\na,1/9/2024 10:00 PM,4\n"
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, SEQUENTIAL))
    assert _ordered_lines(r) == {"a": [3, 2, 4, 5]}


def test_shared_patient_events_empty_timestamps_are_rejects_and_equal_dates_keep_file_order(
    tmp_path: Path, gpt2_dir: Path
):
    src = shared_path("datasets/tabular/sample-patient-events-12groups-200-records.csv")
    text = src.read_text(encoding="utf-8")
    r = _one(
        _run(
            tmp_path,
            gpt2_dir,
            {"events.csv": text},
            {"group_by": "patient_name", "order_by": "timestamp"},
            sequence={"max_seq_len": 2048},
            packing={"max_sequences_per_example": 1},
        )
    )
    rows = text.splitlines()[1:]
    empty = [n for n, row in enumerate(rows, start=2) if row.split(",")[1] == ""]
    assert len(empty) == 98 and len(rows) == 200
    assert [x["source_line"] for x in r["rejects"]] == empty
    assert {x["reason"] for x in r["rejects"]} == {"unorderable_value"}
    tab = r["stats"]["gold"].tabular
    assert tab["order_by_type"] == "datetime" and tab["order_by_values"] == {"datetime": 102}
    assert tab["records_in_examples"] == 102
    for group, lines in _ordered_lines(r).items():  # every kept timestamp is 2025-02-12: file order
        assert lines == sorted(lines) and {rows[n - 2].split(",")[0] for n in lines} == {group}


# ---------------------------------------------------------------- time series without groups or timestamps


def test_an_ungrouped_time_series_is_one_group_in_order_by_order(tmp_path: Path, gpt2_dir: Path):
    csv = "t,v\n3,a\n1,b\n,c\n2,d\n"  # lines 2..5; line 4 has no time
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, {"time_series": True, "order_by": "t"}))
    assert _ordered_lines(r) == {"0": [3, 5, 2]}
    assert [(x["source_line"], x["reason"]) for x in r["rejects"]] == [(4, "unorderable_value")]
    tab = r["stats"]["gold"].tabular
    assert tab["groups"] == 1 and tab["columns"] == ["t", "v"]  # the pseudo-group is never a column
    assert [json.loads(x)["v"] for x in tab["initial_prefill"]["0"]] == ["b", "d", "a"]


def test_without_order_by_a_generated_elapsed_seconds_column_counts_each_group_in_input_order(
    tmp_path: Path, gpt2_dir: Path
):
    csv = "dev,elapsed_seconds,v\na,x,1\nb,y,2\na,z,3\n"  # the name is taken: the column is _elapsed_seconds
    tabular = {"time_series": True, "group_by": "dev", "timestamp_interval_seconds": 30}
    r = _one(_run(tmp_path, gpt2_dir, {"t.csv": csv}, tabular))
    assert _ordered_lines(r) == {"a": [2, 4], "b": [3]} and r["rejects"] == []
    tab = r["stats"]["gold"].tabular
    assert tab["columns"] == ["_elapsed_seconds", "dev", "elapsed_seconds", "v"]
    assert tab["order_by"] == "_elapsed_seconds"
    assert {g: [json.loads(x)["_elapsed_seconds"] for x in v] for g, v in tab["initial_prefill"].items()} == {
        "a": [0, 30],
        "b": [0],
    }


def test_elapsed_column_names_and_values_follow_safe_synthesizer():
    from prep_assets.core.tabular import elapsed_column_name, elapsed_seconds

    assert elapsed_column_name(["a"]) == "elapsed_seconds"
    assert elapsed_column_name(["elapsed_seconds"]) == "_elapsed_seconds"
    taken = ["elapsed_seconds", "_elapsed_seconds", "_elapsed_seconds_1"]
    assert elapsed_column_name(taken) == "_elapsed_seconds_2"
    assert elapsed_seconds(["a", "b", "a", "a"], 60) == [0, 0, 60, 120]
