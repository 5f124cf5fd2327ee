"""Tabular assembly plans on hand-made tables: exact examples per mode (pure functions over token counts)."""

import json

import numpy as np
import pytest

from prep_assets.core.tabular import (
    group_records,
    infer_column_types,
    initial_prefill,
    order_keys,
    parse_cell,
    plan_flat,
    plan_grouped,
    plan_sequential,
    render_record,
    schema_prompt,
)

COLS = ["id", "when", "amount", "note"]


def test_render_record_keeps_schema_order_numbers_nulls_and_escapes_line_breaks():
    row = {"note": "a\r\nb", "amount": 42.5, "id": 7, "when": None}
    line = render_record(row, COLS)
    assert line == '{"id":7,"when":null,"amount":42.5,"note":"a\\r\\nb"}' and "\n" not in line
    assert json.loads(line) == {"id": 7, "when": None, "amount": 42.5, "note": "a\r\nb"}
    assert (
        render_record({"id": float("nan"), "when": np.int64(3)}, COLS)
        == '{"id":null,"when":3,"amount":null,"note":null}'
    )
    assert schema_prompt(COLS) == "id, when, amount, note\n"


def test_schema_prompt_quotes_names_with_commas_quotes_line_breaks_or_edge_spaces_only():
    """`a, b` and `c` bare read as three columns; a name with a line break broke the prompt's one line."""
    names = ["id", "a, b", "c", "two\nlines", 'say "hi"', " padded", "temp °C"]
    prompt = schema_prompt(names)
    assert prompt == 'id, "a, b", c, "two\\nlines", "say \\"hi\\"", " padded", temp °C\n'
    assert prompt.count("\n") == 1


def test_flat_fills_until_max_records_or_the_next_would_not_fit():
    tokens = [5, 5, 5, 5, 5, 9]
    order = np.random.default_rng(0).permutation(6).tolist()
    examples = plan_flat(tokens, budget=2 + 15, max_per=3, seed=0)
    flat = [i for e in examples for u in e.units for i in u]
    assert flat == order  # seeded shuffle, nothing lost or repeated
    for e in examples:
        assert len(e.units) == 1 and len(e.units[0]) <= 3 and 2 + sum(tokens[i] for i in e.units[0]) <= 17


def test_flat_exact_examples_without_shuffle_effects():
    tokens = [4, 4, 4, 4]
    ex = plan_flat(tokens, budget=2 + 8, max_per=10, seed=1)
    order = np.random.default_rng(1).permutation(4).tolist()
    assert [e.units for e in ex] == [[order[:2]], [order[2:]]]  # two records of 4 fill 8


def test_grouped_each_group_its_own_unit_packed_counting_groups():
    groups = [[0, 1], [2], [3, 4, 5]]
    tokens = [3, 3, 4, 2, 2, 2]  # group tokens with BOS/EOS: 8, 6, 8
    order = np.random.default_rng(0).permutation(3).tolist()
    ex = plan_grouped(groups, tokens, budget=16, max_per=2, seed=0)
    assert [u for e in ex for u in e.units] == [groups[g] for g in order]
    assert all(len(e.units) <= 2 and sum(2 + sum(tokens[i] for i in u) for u in e.units) <= 16 for e in ex)
    one = plan_grouped(groups, tokens, budget=100, max_per=1, seed=0)
    assert [len(e.units) for e in one] == [1, 1, 1]


def test_sequential_continues_a_long_group_and_flushes_on_group_change():
    groups = [[0, 1, 2, 3, 4], [5, 6]]
    tokens = [3] * 7
    ex = plan_sequential(groups, tokens, budget=2 + 9, max_per=10, rng=None)  # full budget: 3 records each
    assert [e.units for e in ex] == [[[0, 1, 2]], [[3, 4]], [[5, 6]]]
    capped = plan_sequential(groups, tokens, budget=2 + 9, max_per=2, rng=None)
    assert [e.units for e in capped] == [[[0, 1]], [[2, 3]], [[4]], [[5, 6]]]


def test_sequential_first_record_larger_than_the_draw_expands_the_budget():
    # record budget 58; seed 3 draws 42 then 44: the 50-token first record expands the first draw to 50 and
    # is flushed alone (50 + 3 > 50); the next example fills four 3-token records against 44
    ex = plan_sequential([[0, 1, 2, 3, 4]], [50, 3, 3, 3, 3], budget=60, max_per=10, rng=np.random.default_rng(3))
    assert [e.units for e in ex] == [[[0]], [[1, 2, 3, 4]]] and [e.budget for e in ex] == [50, 44]


def test_sequential_randomized_budget_stays_within_seventy_to_hundred_percent():
    groups = [list(range(400))]
    tokens = [1] * 400
    ex = plan_sequential(groups, tokens, budget=102, max_per=1000, rng=np.random.default_rng(0))
    budgets = [e.budget for e in ex]
    assert all(70 <= b <= 100 for b in budgets) and len(set(budgets)) > 3
    again = plan_sequential(groups, tokens, budget=102, max_per=1000, rng=np.random.default_rng(0))
    assert [e.units for e in again] == [e.units for e in ex]  # seeded
    full = plan_sequential(groups, tokens, budget=102, max_per=1000, rng=None)
    assert {e.budget for e in full} == {100}


def test_initial_prefill_keeps_the_first_three_records_per_group():
    assert initial_prefill({"b": ["1", "2", "3", "4"], "a": ["x"]}) == {"a": ["x"], "b": ["1", "2", "3"]}
    rows = ['{"t":"05"}', '{"t":"00"}', '{"t":null}', '{"t":"03"}', '{"t":"01"}']
    assert initial_prefill({"g": rows}, "t") == {"g": ['{"t":"00"}', '{"t":"01"}', '{"t":"03"}']}


def test_csv_column_types_inferred_over_the_drop_leading_zeros_stay_text():
    rows = [
        {"n": "3", "x": ".2", "zip": "02134", "t": "2014-02-21", "m": ""},
        {"n": "-12", "x": "3", "zip": "10001", "t": "2014-02-24", "m": "NA"},
        {"n": "", "x": "1e-3", "zip": "", "t": "", "m": ""},
    ]
    types = infer_column_types(rows, [""])
    assert types == {"n": "int", "x": "float", "zip": "string", "t": "string", "m": "string"}
    assert infer_column_types(rows, ["", "NA"])["m"] == "int"  # every cell missing: no evidence against int
    assert infer_column_types(rows, [""], {"zip": "int", "n": "string"})["n"] == "string"
    assert [parse_cell(c, "float", [""]) for c in (".2", "3", "1e-3", "")] == [0.2, 3.0, 0.001, None]
    assert parse_cell("02134", "string", [""]) == "02134" and parse_cell("-12", "int", [""]) == -12
    with pytest.raises(ValueError, match="'0x1' is not an integer"):
        parse_cell("0x1", "int", [""])
    # a number too large for a float is text, never a silent null; forced to float it is a reject
    assert infer_column_types([{"big": "1e400"}, {"big": "2"}], [""]) == {"big": "string"}
    with pytest.raises(ValueError, match="'1e400' is not a finite number"):
        parse_cell("1e400", "float", [""])


def test_csv_number_with_more_digits_than_a_float_holds_keeps_its_text_never_trains_other_digits():
    rows = [{"amount": "12345678901234567.89", "x": "1.10", "y": "0.00001"}, {"amount": "2", "x": "3", "y": "1"}]
    assert infer_column_types(rows, [""]) == {"amount": "string", "x": "float", "y": "float"}
    assert parse_cell("1.10", "float", [""]) == 1.1 and parse_cell("0.00001", "float", [""]) == 1e-05  # same value
    with pytest.raises(ValueError, match="more digits than a float holds"):  # typed float by the spec: a reject
        parse_cell("12345678901234567.89", "float", [""])


def test_groups_in_first_appearance_order_each_sorted_by_its_typed_order_keys():
    keys = ["b", "a", "b", "a", "b"]
    typed = order_keys(["2024-03", "2024-01", "2023-12", "2023-12", "2024-01"], "t")  # not a date: text
    assert typed.type == "string" and not typed.problems
    assert group_records(keys, typed.keys) == [[2, 4, 0], [3, 1]]
    assert group_records(keys, None) == [[0, 2, 4], [1, 3]]
    assert group_records(["x", "x", "x"], [2, 1, 2]) == [[1, 0, 2]]  # ties keep input order


def test_column_types_apply_to_json_rows_too_never_silently_ignored():
    """`column_types: {price: float}` left JSON rows' "12.5" and "abc" as text, without a word."""
    from prep_assets.core.records import TabularExtractor
    from prep_assets.core.spec_sections import InputSpec, TabularSpec

    tab = TabularSpec(column_types={"price": "float", "n": "int"})
    extract = TabularExtractor(tab, "a.jsonl", columns=["id", "price", "n"])
    spec = InputSpec(type="tabular")
    assert extract({"id": 1, "price": "12.5", "n": 3}, spec) == {
        "columns": ["id", "price", "n"],
        "values": [1, 12.5, 3],
    }
    assert extract({"id": 2, "price": 7, "n": None}, spec)["values"] == [2, 7.0, None]  # type: ignore[index]
    assert extract({"id": 3, "price": "", "n": "4"}, spec)["values"] == [3, None, 4]  # type: ignore[index]
    for row, said in [
        ({"id": 4, "price": "abc"}, "column 'price' is float (tabular.column_types): 'abc' is not a finite number"),
        ({"id": 5, "n": 2.5}, "column 'n' is int (tabular.column_types): 2.5 is not an int"),
        ({"id": 6, "price": True}, "true is not a float"),
    ]:
        got = extract(row, spec)
        assert got.reason == "wrong_type" and said in got.detail  # type: ignore[union-attr]


def test_a_row_with_an_unnamed_column_is_a_reject_as_a_csv_header_without_a_name_is():
    from prep_assets.core.records import TabularExtractor
    from prep_assets.core.spec_sections import InputSpec, TabularSpec

    extract = TabularExtractor(TabularSpec(), "a.jsonl", columns=["b"])
    got = extract({"": 1, "b": "x"}, InputSpec(type="tabular"))
    assert got.reason == "bad_column_name"  # type: ignore[union-attr]
    assert extract({"b": "y"}, InputSpec(type="tabular")) == {"columns": ["b"], "values": ["y"]}
