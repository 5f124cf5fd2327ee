from prep_assets.core.records import Invalid, extract_instruction, extract_text
from prep_assets_tests.conftest import make_spec


def test_text_extraction_and_bare_strings():
    spec = make_spec().input
    assert extract_text({"text": "hi", "id": 1}, spec) == {"text": "hi"}
    assert extract_text("a txt line", spec) == {"text": "a txt line"}


def test_missing_key_names_available_keys():
    result = extract_text({"body": "x"}, make_spec().input)
    assert isinstance(result, Invalid) and result.reason == "missing_key" and "['body']" in result.detail


def test_null_text_is_never_the_string_none():
    result = extract_text({"text": None}, make_spec().input)
    assert isinstance(result, Invalid) and result.reason == "null_value"


def test_wrong_type_and_not_an_object():
    spec = make_spec().input
    assert extract_text({"text": 3}, spec).reason == "wrong_type"  # type: ignore[union-attr]
    assert extract_text([1], spec).reason == "not_an_object"  # type: ignore[union-attr]


def test_instruction_single_pair_and_dialogue_list_kept_in_order():
    spec = make_spec(input={"type": "instruction"}).input
    assert extract_instruction({"prompt": "p", "completion": "c"}, spec) == {
        "turns": [{"prompt": "p", "completion": "c"}]
    }
    dialogue = [{"prompt": "p1", "completion": "c1"}, {"prompt": "p2", "completion": "c2"}]
    assert extract_instruction(dialogue, spec) == {"turns": dialogue}


def test_alpaca_keys_join_instruction_and_input_skipping_empty_input():
    spec = make_spec(
        input={"type": "instruction", "prompt_key": ["instruction", "input"], "completion_key": "output"}
    ).input
    rec = {"instruction": "Translate", "input": "bonjour", "output": "hello"}
    assert extract_instruction(rec, spec) == {"turns": [{"prompt": "Translate\n\nbonjour", "completion": "hello"}]}
    rec = {"instruction": "Say hi", "input": "", "output": "hi"}
    assert extract_instruction(rec, spec)["turns"][0]["prompt"] == "Say hi"  # type: ignore[index]


def test_dialogue_with_bad_turn_names_the_turn_and_empty_list_rejected():
    spec = make_spec(input={"type": "instruction"}).input
    bad = extract_instruction([{"prompt": "p", "completion": "c"}, {"prompt": "p"}], spec)
    assert isinstance(bad, Invalid) and bad.detail.startswith("turn 2:")
    assert extract_instruction([], spec).reason == "empty_dialogue"  # type: ignore[union-attr]


def test_a_json_row_number_a_float_cannot_hold_is_a_reject_never_other_digits(tmp_path):
    """12345678901234567.89 trained as 1.2345678901234568e+16, 9007199254740993.0 as ...992.0 and 1e-400 as 0.0,
    while a CSV cell of the same digits kept its text."""
    from prep_assets.core.readers import Accounting, RawItem, read_drop
    from prep_assets.core.records import TabularExtractor
    from prep_assets.core.spec_sections import TabularSpec

    rows = [
        ('{"id": 1, "v": 12345678901234567.89}', "1.2345678901234568e+16"),
        ('{"id": 2, "v": 9007199254740993.0}', "9007199254740992.0"),
        ('{"id": 3, "v": 1e-400}', "0.0"),
        ('{"id": 4, "v": [1, {"x": 2.5e-400}]}', "0.0"),
        ('{"id": 5, "v": 0.1}', None),
        ('{"id": 6, "v": 1.10}', None),
        ('{"id": 7, "v": 1e5}', None),
        ('{"id": 8, "v": 0.10000000000000001}', None),  # C's %.17g of 0.1: the float as written, in other digits
    ]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(line + "\n" for line, _ in rows))
    items = [i for i in read_drop(path, "jsonl", max_line_bytes=1 << 20, acct=Accounting()) if isinstance(i, RawItem)]
    extract = TabularExtractor(TabularSpec(), "a.jsonl", columns=["id", "v"])
    for item, (_, would) in zip(items, rows, strict=True):
        got = extract(item.value, None)  # type: ignore[arg-type]
        if would is None:
            assert isinstance(got, dict), got
        else:
            assert got.reason == "inexact_number" and f"would train as {would}" in got.detail, got  # type: ignore[union-attr]
