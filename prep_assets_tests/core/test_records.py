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
