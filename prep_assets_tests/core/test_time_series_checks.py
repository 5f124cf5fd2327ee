"""`tabular.validate_time_series` refuses exactly the tables Safe Synthesizer's time-series validation refuses, for
the same check, naming the same groups; on a table it accepts, the same format, interval, start and stop.
Expected verdicts: prep_assets_tests/fixtures/safe_synthesizer/time_series_verdicts.json (SS 0.1.12, see its
README)."""

import csv
import io
import json
import re
from pathlib import Path

import pytest

from prep_assets.core.errors import DropError
from prep_assets.core.tabular import (
    elapsed_column_name,
    elapsed_seconds,
    group_label,
    infer_column_types,
    pandas_group_key,
    parse_cell,
)
from prep_assets.core.time_series_checks import TimeSeriesRefused, guess_timestamp_format, validate_time_series
from prep_assets_tests.conftest import make_spec, shared_path
from prep_assets_tests.core.helpers import run_core, write_raw

FIXTURES = Path(__file__).parent.parent / "fixtures" / "safe_synthesizer"
VERDICTS = json.loads((FIXTURES / "time_series_verdicts.json").read_text(encoding="utf-8"))

# SS's reason -> the checks here that refuse for it (SS has one reason for its four interval checks)
REASONS = {
    "TIMESERIES_EMPTY": {"empty"},
    "PSEUDO_COLUMN_COLLISION": {"pseudo_group_column"},
    "TIMESTAMP_NULLS": {"timestamp_missing"},
    "TIMESTAMP_ELAPSED_NON_NUMERIC": {"elapsed_seconds"},
    "TIMESTAMP_ELAPSED_INVALID": {"elapsed_seconds"},
    "TIMESTAMP_FORMAT_MISMATCH": {"timestamp_format"},
    "TIMESTAMP_PARSE_FAILED": {"timestamp_parse"},
    "TIMESERIES_GROUP_LENGTH_MISMATCH": {"group_sizes"},
    "TIMESERIES_START_MISMATCH": {"start_timestamps"},
    "TIMESERIES_STOP_MISMATCH": {"stop_timestamps"},
    "TIMESTAMP_INTERVAL_MISMATCH": {
        "interval_whole_seconds",
        "interval_within_group",
        "interval_across_groups",
        "interval_given",
    },
}


def _table(case: dict) -> str:
    if "table" in case:
        return shared_path(f"datasets/tabular/{case['table']}").read_text(encoding="utf-8")
    return case["csv"]


def _check(case: dict):
    """Our validation of a fixture case: the CSV typed as bronze types it, the generated column as gold adds it."""
    rows = list(csv.DictReader(io.StringIO(_table(case))))
    columns = list(rows[0])
    types = infer_column_types(rows, [""])
    values = [[parse_cell(r[c], types[c], [""]) for c in columns] for r in rows]
    group, ts = case["group_training_examples_by"], case["time_series"]
    labels = [group_label(v[columns.index(group)]) for v in values] if group else ["0"] * len(values)
    timestamp = ts.get("timestamp_column")
    if timestamp is None:
        timestamp = elapsed_column_name(columns)
        values = [[t, *v] for t, v in zip(elapsed_seconds(labels, ts["timestamp_interval_seconds"]), values)]
        columns = [timestamp, *columns]
    groups = None
    if group:
        gi = columns.index(group)
        groups = [(pandas_group_key(v[gi]), k) for v, k in zip(values, labels, strict=True)]
    given = ts.get("timestamp_interval_seconds") if "timestamp_column" in ts else None
    fmt = ts.get("timestamp_format") if "timestamp_column" in ts else "elapsed_seconds"
    return validate_time_series(columns, values, groups, timestamp, fmt, given)


@pytest.mark.parametrize("case", VERDICTS, ids=[c["name"] for c in VERDICTS])
def test_we_refuse_what_safe_synthesizer_refuses(case: dict):
    ss = case["verdict"]
    if ss["accepted"]:
        facts = _check(case)
        assert (facts.timestamp_format, facts.interval_seconds, facts.start, facts.stop) == (
            ss["timestamp_format"],
            ss["timestamp_interval_seconds"],
            ss["start_timestamp"],
            ss["stop_timestamp"],
        )
        return
    with pytest.raises(TimeSeriesRefused) as refused:
        _check(case)
    assert refused.value.check in REASONS[ss["reason"]]
    for named in re.findall(r"group '([^']*)'", ss["message"]):  # the group SS names, we name
        assert repr(named) in str(refused.value)
    for size in re.findall(r"\w+=\d+", ss["message"]):  # group sizes a=3, b=2
        assert size in str(refused.value)


def test_the_verdicts_cover_every_check_that_a_table_can_fail():
    refused = {c["verdict"]["reason"] for c in VERDICTS if not c["verdict"]["accepted"]}
    assert refused == set(REASONS) - {"TIMESERIES_EMPTY", "TIMESTAMP_ELAPSED_INVALID"}
    assert sum(c["verdict"]["accepted"] for c in VERDICTS) >= 5


def test_the_format_guess_keeps_separators_and_tries_month_first():
    assert guess_timestamp_format("2011-01-14T10:00:00Z") == "%Y-%m-%dT%X%z"
    assert guess_timestamp_format("14.01.2011") == "%d.%m.%Y"
    assert guess_timestamp_format("7.1.2011") == "%m.%d.%Y"  # SS: either, by Python's string hash seed
    assert guess_timestamp_format("Jan 7 2011") == "%b %d %Y"
    assert guess_timestamp_format("1/14/2011 10:00:00") is None  # SS has times only after year-month-day
    assert guess_timestamp_format("60") is None and guess_timestamp_format("2011#01") is None


def test_an_empty_drop_is_refused():
    """No table file reaches it (a drop has rows); SS's interval-across-groups check is out of reach as well:
    equal sizes, starts and stops leave one interval."""
    with pytest.raises(TimeSeriesRefused, match="check empty"):
        validate_time_series(["t"], [], None, "t")


def _spec(**tabular):
    return make_spec(
        "ts",
        recipe="safe_synthesizer",
        input={"type": "tabular"},
        tokenizer={"path": str(shared_path("tokenizers/tinyllama"))},
        sequence={"max_seq_len": 512},
        checks={"min_sequence_utilization": 0.0},
        tabular={"time_series": True, **tabular},
    )


def test_the_drop_is_refused_with_the_check_and_groups_named(tmp_path: Path):
    """The shared Dow Jones table (the recipe's sequential fixture), which SS refuses for its group sizes."""
    table = shared_path("datasets/tabular/dow_jones_index_group_size_8.csv").read_text(encoding="utf-8")
    data = write_raw(tmp_path / "data", "ts", {"t.csv": "".join(table.splitlines(keepends=True)[:41])})
    spec = _spec(group_by="stock", order_by="date", validate_time_series=True)
    with pytest.raises(DropError, match=r"check group_sizes .*AAPL_0=5, AAPL_1=7"):
        run_core(data, spec)
    ((_, r),) = run_core(tmp_path / "data", _spec(group_by="stock", order_by="date")).items()  # off: prepared
    assert r["gold"].tabular["time_series_validation"] is None


def test_an_accepted_series_records_what_the_validation_settled(tmp_path: Path):
    table = {"t.csv": "id,day,v\nb,2011-01-02,4\na,2011-01-02,2\na,2011-01-01,1\nb,2011-01-01,3\n"}
    spec = _spec(group_by="id", order_by="day", validate_time_series=True, timestamp_interval_seconds=86400)
    ((_, r),) = run_core(write_raw(tmp_path / "a", "ts", table), spec).items()
    assert r["gold"].tabular["time_series_validation"] == {
        "timestamp_format": "%Y-%m-%d",
        "interval_seconds": 86400,
        "start": "2011-01-01 00:00:00",
        "stop": "2011-01-02 00:00:00",
        "groups": 2,
    }
    hourly = _spec(group_by="id", order_by="day", validate_time_series=True, timestamp_interval_seconds=3600)
    with pytest.raises(DropError, match=r"check interval_given .*group 'a'"):
        run_core(write_raw(tmp_path / "b", "ts", table), hourly)
