"""`recipe: gdp` against gdp's own output: our rows, exported as gdp's HDF5, equal the arrays gdp wrote for the same
input and `max_seq_length` (fixtures/gdp/, how they were made in its README)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from prep_assets.core.bronze import record_category
from prep_assets.core.masking import example_pieces
from prep_assets.core.packing import drop_rows_without, plan_greedy, plan_rows
from prep_assets.core.readers import Accounting, _parse_json, read_drop
from prep_assets.core.spec import parse_spec
from prep_assets_tests.conftest import make_spec, shared_path
from prep_assets_tests.core.helpers import failed_gates, run_core

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gdp"


def _lines(source: str, numbers: list[int]) -> str:
    """Lines of a shared file by their 1-based numbers, in file order, each with its line end."""
    with shared_path(f"datasets/{source}").open(encoding="utf-8", newline="") as f:
        return "".join(line for i, line in enumerate(f, 1) if i in numbers)


def _gdp_rows(
    tmp_path: Path,
    text: str,
    sequence: dict[str, Any],
    packing: dict[str, Any],
    *,
    input_type: str = "instruction",
    suffix: str = "jsonl",
    **sections: Any,
) -> tuple[dict[str, np.ndarray], int]:
    """Our rows of `text` (one drop) under `recipe: gdp`, read back from the hdf5 export; and gold's rejects. Every
    gate but the reject rates and utilization (small heads with too-long lines) passes."""
    raw = {
        "recipe": "gdp",
        "input": {"type": input_type},
        "tokenizer": {"path": str(shared_path("tokenizers/gpt2"))},
        "sequence": {"max_seq_len": 128, **sequence},
        "packing": packing,
        "output": {"formats": ["parquet", "hdf5"]},
        **sections,
    }
    spec = parse_spec(raw, path=Path("gdp.yaml"), default_name="gdp")
    (tmp_path / "raw" / "gdp").mkdir(parents=True)
    (tmp_path / "raw" / "gdp" / f"head.{suffix}").write_bytes(text.encode("utf-8"))
    ((key, result),) = run_core(tmp_path, spec).items()
    assert not [g for g, _ in failed_gates(spec, tmp_path, key) if "rate" not in g and "utilization" not in g]
    (hdf5,) = result["dirs"][3].glob("hdf5/train_*.hdf5")  # `categories.json`: gdp's train_1_of_1.hdf5
    with h5py.File(hdf5) as f:
        return {k: f[k][:] for k in f}, result["gold"].rejects


def _expected(fixture: str) -> list[dict[str, list[int]]]:
    return json.loads((FIXTURES / f"{fixture}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("fixture", "sequence", "packing", "rejects"),
    [
        ("single_truncate_right", {"overflow": "truncate_right"}, {"strategy": "single"}, 2),
        ("greedy_drop", {"overflow": "drop"}, {"strategy": "greedy"}, 2),
        # gdp's --keep_prompt_only_sequences: the two prompts truncated to no completion stay, as rows
        (
            "single_truncate_right_keep_prompt_only",
            {"overflow": "truncate_right", "keep_prompt_only_sequences": True},
            {"strategy": "single"},
            0,
        ),
    ],
)
def test_gdp_recipe_rows_equal_gdps_own_arrays(tmp_path: Path, fixture: str, sequence, packing, rejects: int):
    head = _lines("instruction/gdp_generative_tuning.jsonl", list(range(1, 9)))
    ours, gold_rejects = _gdp_rows(tmp_path, head, sequence, packing)
    assert gold_rejects == rejects  # what gdp drops silently (too long, or prompt only) is a counted reject here
    expected = _expected(fixture)
    assert ours["input_ids"].tolist() == [r["input_ids"] for r in expected]
    assert ours["token_type_ids"].tolist() == [r["token_type_ids"] for r in expected]


def test_an_example_dropped_as_too_long_closes_greedys_open_row_as_in_gdp(tmp_path: Path):
    """Lines of 33, 1118, 46, 505, 55 and 21 tokens: gdp's greedy closes its row at each too-long line, so the 46
    does not join the 33 nor the 55 the 46: rows 33 | 46 | 55 + 21 (kept ones alone would pack 33 + 46 | 55 + 21)."""
    head = _lines("instruction/gdp_generative_tuning.jsonl", [2, 3, 4, 6, 20, 21])
    ours, rejects = _gdp_rows(tmp_path, head, {"overflow": "drop"}, {"strategy": "greedy"})
    expected = _expected("greedy_drop_closes")
    assert rejects == 2
    assert ours["input_ids"].tolist() == [r["input_ids"] for r in expected]
    assert ours["token_type_ids"].tolist() == [r["token_type_ids"] for r in expected]
    gold = pq.read_table(next((tmp_path / "lake").rglob("gold/*/examples.parquet")))
    assert gold.column("after_dropped").to_pylist() == [False, True, True, False]


def test_gdp_full_on_text_lines_keeps_each_lines_newline_before_the_eos(tmp_path: Path):
    text = _lines("text/gdp_pretraining.txt", [17, 23, 40, 65, 86])
    ours, rejects = _gdp_rows(tmp_path, text, {}, {}, input_type="text", suffix="txt")
    expected = _expected("full")
    assert rejects == 0
    assert ours["input_ids"].tolist() == [r["input_ids"] for r in expected]
    assert ours["token_type_ids"].tolist() == [r["token_type_ids"] for r in expected]


def test_gdp_full_leaves_out_the_rows_cut_from_a_long_prompt(tmp_path: Path):
    """Lines of 33, 46 and 505 tokens (line 6: a prompt of 470) under `full`: gdp keeps 2 of the 5 rows, leaving
    out the three (384 tokens) holding no completion token; so do we, counted in the shard stats (and the
    conservation gate, which `_gdp_rows` holds passing, finds no completion token in the tokens left out)."""
    text = _lines("instruction/gdp_generative_tuning.jsonl", [2, 4, 6])
    ours, rejects = _gdp_rows(tmp_path, text, {}, {})
    expected = _expected("full_long_prompt")
    assert rejects == 0
    assert ours["input_ids"].tolist() == [r["input_ids"] for r in expected]
    assert ours["token_type_ids"].tolist() == [r["token_type_ids"] for r in expected]
    stats = json.loads(next((tmp_path / "lake").rglob("shards/*/stats.json")).read_text(encoding="utf-8"))
    train = stats["splits"]["train"]
    assert (train["sequences"], train["rows_dropped"], train["tokens_dropped_by_packing"]) == (2, 3, 384)
    gold = pq.read_table(next((tmp_path / "lake").rglob("gold/*/examples.parquet")))
    lengths = np.array(gold.column("num_tokens").to_pylist())
    flags = np.concatenate([np.array(t) == 1 for t in gold.column("token_type_ids").to_pylist()])
    plan = drop_rows_without(plan_rows(lengths, capacity=128, strategy="full"), lengths, flags)
    assert (plan.num_rows, plan.dropped_rows, plan.dropped_tokens) == (2, 3, 384)
    assert drop_rows_without(plan, lengths, flags) is plan  # nothing more to leave out


def test_full_keeps_prompt_only_rows_when_asked(tmp_path: Path):
    text = _lines("instruction/gdp_generative_tuning.jsonl", [2, 4, 6])
    ours, _ = _gdp_rows(tmp_path, text, {"keep_prompt_only_sequences": True}, {})
    assert [bool((row == 1).any()) for row in ours["token_type_ids"]] == [True, False, False, False, True]


PAIR = "prompt_completion_pair"


@pytest.mark.parametrize(
    ("fixture", "packing_boundary", "attention_boundary", "boundaries_per_row"),
    [
        ("pair_boundary", PAIR, PAIR, [5, 6]),  # every pair's EOS is a 3
        # gdp's "all shot": pairs packed as units, a 3 only after a line's last pair; line 2's pairs run on into
        # row 2, where they still attend to each other
        ("all_shot", PAIR, "jsonl", [1, 3]),
        # lines whole (35, 132, 30 and 29 tokens), a 3 after each pair; line 2 is dropped and closes row 1
        ("pair_attention", "jsonl", PAIR, [2, 4]),
    ],
)
def test_gdp_packing_and_attention_boundaries_place_type_3_as_gdp(
    tmp_path: Path, fixture: str, packing_boundary: str, attention_boundary: str, boundaries_per_row: list[int]
):
    text = _lines("dialogue/gdp_dialogue.jsonl", [1, 2, 3, 4])
    boundaries = {"packing_boundary": packing_boundary, "attention_boundary": attention_boundary}
    ours, rejects = _gdp_rows(tmp_path, text, {"overflow": "drop"}, {"strategy": "greedy", **boundaries})
    expected = _expected(fixture)
    assert rejects == (1 if packing_boundary == "jsonl" else 0)
    assert ours["input_ids"].tolist() == [r["input_ids"] for r in expected]
    assert ours["token_type_ids"].tolist() == [r["token_type_ids"] for r in expected]
    assert [int(np.count_nonzero(row == 3)) for row in ours["token_type_ids"]] == boundaries_per_row
    if fixture == "all_shot":  # gold types the EOS of a line's earlier pairs as gdp does: 1; the last pair's 3
        gold = pq.read_table(next((tmp_path / "lake").rglob("gold/*/examples.parquet"))).to_pylist()
        assert [(g["example_id"].split(":")[-1], g["token_type_ids"][-1]) for g in gold[:3]] == [
            ("1/1", 1),
            ("1/2", 3),
            ("2/1", 1),
        ]


def test_all_shot_keeps_the_pairs_gdp_keeps_where_whole_lines_would_be_dropped(tmp_path: Path):
    """The whole `dialogue` example (42 lines, 96 pairs) at 32 tokens, greedy + drop: with gdp's all shot
    boundaries gdp keeps 91 pairs in 76 rows with 41 type-3 tokens (a line whose last pair is dropped has none;
    figures printed by the last commands of fixtures/gdp/make.sh). Ours keeps the same. With lines packed whole,
    gdp and we keep 12 of the 42 lines (23 pairs), in 12 rows."""
    text = shared_path("datasets/dialogue/gdp_dialogue.jsonl").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    # line 21 gives "prompt" and "completion" twice in its second pair: gdp's json.loads kept the second values
    # without a word, we reject the line (duplicate_key). Fed what gdp read, we must keep what gdp keeps.
    assert _parse_json(lines[20].rstrip("\n"))[1] == "duplicate_key"
    lines[20] = json.dumps(json.loads(lines[20])) + "\n"
    text = "".join(lines)
    ours, rejects = _gdp_rows(
        tmp_path,
        text,
        {"max_seq_len": 32, "overflow": "drop"},
        {"strategy": "greedy", "packing_boundary": PAIR, "attention_boundary": "jsonl"},
    )
    ids, types = ours["input_ids"], ours["token_type_ids"]
    kept_pairs = int(np.count_nonzero((ids == 50256) & ((types == 1) | (types == 3))))  # each kept pair's EOS
    assert (kept_pairs, len(ids), int(np.count_nonzero(types == 3))) == (91, 76, 41)
    gold = pq.read_table(next((tmp_path / "lake").rglob("gold/*/examples.parquet")))
    assert gold.num_rows == 91 and rejects == 0  # every line keeps a pair: the 5 dropped pairs are counted apart
    whole, rejects = _gdp_rows(
        tmp_path / "whole", text, {"max_seq_len": 32, "overflow": "drop"}, {"strategy": "greedy"}
    )
    assert (len(whole["input_ids"]), rejects, int(np.count_nonzero(whole["token_type_ids"] == 3))) == (12, 30, 12)


def test_the_text_endoftext_in_content_is_encoded_as_text_never_as_the_eos(tmp_path: Path):
    """gdp's `encode` turns the text `<|endoftext|>` into a real EOS (50256); ours encodes its characters."""
    text = json.dumps({"prompt": "Say <|endoftext|> now", "completion": "ok<|endoftext|>"}) + "\n"
    ours, rejects = _gdp_rows(tmp_path, text, {"overflow": "drop"}, {"strategy": "single"})
    prompt = [25515, 1279, 91, 437, 1659, 5239, 91, 29, 783]  # "Say", " <", "|", "end", "of", "text", "|", ">", " now"
    completion = [12876, 27, 91, 437, 1659, 5239, 91, 29]  # " ok", "<", "|", "end", "of", "text", "|", ">"
    ids = prompt + completion + [50256]  # the only EOS: the one ending the example
    assert rejects == 0
    assert ours["input_ids"].tolist() == [ids + [50256] * (128 - len(ids))]
    assert ours["token_type_ids"].tolist() == [[0] * 9 + [1] * 8 + [3] + [2] * (128 - len(ids))]


@pytest.mark.parametrize("keep", [False, True])
def test_prompt_only_examples_are_rejected_or_kept_and_counted(tmp_path: Path, keep: bool):
    """gdp's keep_prompt_only_sequences: false (gdp's default) rejects a prompt truncated to no completion and a
    pair whose completion is empty; true keeps both (the empty completion's prompt too) and counts them."""
    lines = [
        {"prompt": " ".join(["word"] * 40), "completion": "A"},  # truncated to its prompt only
        {"prompt": "Q", "completion": ""},  # an empty completion: its prompt alone
        {"prompt": "Q", "completion": "A"},
    ]
    spec = make_spec(
        "gdp",
        recipe="gdp",
        input={"type": "instruction"},
        tokenizer={"path": str(shared_path("tokenizers/gpt2"))},
        sequence={"max_seq_len": 16, "overflow": "truncate_right", "keep_prompt_only_sequences": keep},
        packing={"strategy": "single"},
    )
    assert spec.clean.keep_empty_turns is keep
    (tmp_path / "raw" / "gdp").mkdir(parents=True)
    (tmp_path / "raw" / "gdp" / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    ((key, result),) = run_core(tmp_path, spec).items()
    gold = result["gold"]
    if keep:
        assert (gold.examples, gold.rejects, gold.examples_without_trained_tokens) == (3, 0, 1)
        assert result["silver"].rejects == 0
    else:
        assert (gold.examples, gold.rejects_by_reason, gold.examples_without_trained_tokens) == (
            1,
            {"no_trained_tokens": 1},
            None,
        )
        assert result["silver"].rejects_by_reason == {"empty_completion": 1}
    assert not [g for g, _ in failed_gates(spec, tmp_path, key) if "rate" not in g and "utilization" not in g]


def test_a_too_long_pair_is_counted_and_its_record_kept_by_its_other_pairs(tmp_path: Path):
    long = " ".join(["word"] * 200)
    lines = [
        [{"prompt": "Q1", "completion": "A1"}, {"prompt": "Q2", "completion": long}],  # one pair too long
        [{"prompt": long, "completion": "A"}],  # its only pair too long: the record is a reject
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    boundaries = {"packing_boundary": PAIR, "attention_boundary": PAIR}
    raw = {
        "recipe": "gdp",
        "input": {"type": "instruction"},
        "tokenizer": {"path": str(shared_path("tokenizers/gpt2"))},
    }
    spec = parse_spec(
        {**raw, "sequence": {"max_seq_len": 64}, "packing": {"strategy": "greedy", **boundaries}},
        path=Path("gdp.yaml"),
        default_name="gdp",
    )
    (tmp_path / "raw" / "gdp").mkdir(parents=True)
    (tmp_path / "raw" / "gdp" / "d.jsonl").write_text(text, encoding="utf-8")
    ((key, result),) = run_core(tmp_path, spec).items()
    gold = result["gold"]
    assert (gold.examples, gold.rejects, gold.pairs_rejected_by_reason) == (1, 1, {"too_long": 1})
    rejects = pq.read_table(result["dirs"][2] / "rejects.parquet").to_pylist()
    assert [(r["source_line"], r["reason"]) for r in rejects] == [(2, "too_long")]
    assert rejects[0]["detail"].startswith("all 1 pairs rejected; pair 1:")
    assert pq.read_table(result["dirs"][2] / "examples.parquet").column("example_id").to_pylist() == [f"{key}:1/1"]
    failed = {name for name, _ in failed_gates(spec, tmp_path, key)}  # one of two records rejected: rates fail
    assert failed <= {"tokenized_examples_reject_rate", "packed_shards_utilization"}, failed


def test_boundaries_that_gdp_cannot_pack_are_refused():
    with pytest.raises(Exception, match="full cuts examples"):
        make_spec(
            recipe="gdp", input={"type": "instruction"}, packing={"packing_boundary": PAIR, "attention_boundary": PAIR}
        )
    with pytest.raises(Exception, match="needs them packed in input order: use strategy greedy or single, not bfd"):
        make_spec(input={"type": "instruction"}, packing={"packing_boundary": PAIR})
    for key in ("packing_boundary", "attention_boundary"):
        with pytest.raises(Exception, match=f"packing.{key} prompt_completion_pair applies to the pairs"):
            make_spec(packing={"strategy": "greedy", key: PAIR})
    # gdp's full packing with an attention boundary per pair; any strategy with lines packed whole
    assert make_spec(recipe="gdp", input={"type": "instruction"}, packing={"attention_boundary": PAIR})
    assert make_spec(input={"type": "instruction"}, packing={"attention_boundary": PAIR, "strategy": "bfd"})


CATEGORIES = ["example_category_1", "example_category_2", "example_category_3"]


def test_gdp_categories_reach_the_hdf5_category_ids(tmp_path: Path):
    text = _lines("instruction/gdp_category_ids.jsonl", list(range(1, 9)))
    categories = {"categories": CATEGORIES, "category_key": "category_id"}  # the shared file's key (gdp's: category)
    ours, rejects = _gdp_rows(
        tmp_path, text, {"overflow": "drop"}, {"strategy": "greedy"}, input={"type": "instruction", **categories}
    )
    expected = _expected("categories")
    assert rejects == 2  # too long, as gdp drops them
    for key in ("input_ids", "token_type_ids", "category_ids"):
        assert ours[key].tolist() == [r[key] for r in expected], key
    gold = pq.read_table(next((tmp_path / "lake").rglob("gold/*/examples.parquet")))
    assert set(gold.column("category_id").to_pylist()) <= {0, 1, 2}


def test_an_unknown_or_mixed_category_is_a_reject_with_its_reason(tmp_path: Path):
    lines = [
        {"prompt": "Q", "completion": "A", "category": "b"},
        {"prompt": "Q", "completion": "A", "category": "z"},  # not listed
        [{"prompt": "Q", "completion": "A", "category": "a"}, {"prompt": "Q", "completion": "A", "category": "b"}],
        {"prompt": "Q", "completion": "A"},  # names none: -1
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    spec = make_spec(
        "gdp",
        recipe="gdp",
        input={"type": "instruction", "categories": ["a", "b"]},
        tokenizer={"path": str(shared_path("tokenizers/gpt2"))},
        packing={"strategy": "greedy"},
    )
    (tmp_path / "raw" / "gdp").mkdir(parents=True)
    (tmp_path / "raw" / "gdp" / "d.jsonl").write_text(text, encoding="utf-8")
    ((_, result),) = run_core(tmp_path, spec).items()
    assert result["bronze"].rejects_by_reason == {"mixed_categories": 1, "unknown_category": 1}
    gold = pq.read_table(result["dirs"][2] / "examples.parquet")
    assert gold.column("category_id").to_pylist() == [1, -1]


def test_line_ends_are_kept_only_where_asked(tmp_path: Path):
    """`recipe: gdp` sets input.keep_line_ends; without it a text line is read without its end, as before."""
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\n\nthree")
    read = lambda **kw: [i.value for i in read_drop(path, "txt", max_line_bytes=1024, acct=Accounting(), **kw)]  # noqa: E731
    assert read() == ["one", "two", "three"]
    assert read(keep_line_ends=True) == ["one\n", "two\n", "three"]  # a blank line stays blank, never a record
    assert make_spec(recipe="gdp").input.keep_line_ends and not make_spec().input.keep_line_ends


def test_recipe_gdp_sets_gdps_defaults_and_each_key_can_be_overridden():
    spec = make_spec(recipe="gdp", input={"type": "instruction"})
    assert spec.input.space_separator and spec.clean.normalization.nfc is False and spec.clean.dedup == "none"
    assert spec.packing.strategy == "full" and spec.packing.shuffle is False and spec.sequence.max_seq_len == 2048
    spec = make_spec(
        recipe="gdp", input={"type": "instruction", "space_separator": False}, packing={"strategy": "greedy"}
    )
    assert not spec.input.space_separator and spec.packing.strategy == "greedy" and not spec.packing.shuffle


def test_specs_without_a_recipe_keep_their_fingerprints():
    spec = make_spec(input={"type": "instruction"})
    assert (
        "recipe" not in spec.fingerprint()
        and spec.fingerprint() == make_spec(input={"type": "instruction"}).fingerprint()
    )
    dumped = json.dumps(spec.model_dump(mode="json"))
    assert "space_separator" in dumped  # present in the spec, left out of the fingerprint at its default
    assert spec.layer_version("gold") != make_spec(recipe="gdp", input={"type": "instruction"}).layer_version("gold")


def test_greedy_is_next_fit_in_input_order():
    assert plan_greedy(np.array([3, 4, 2, 5, 1]), 8) == [[0, 1], [2, 3, 4]]
    assert plan_greedy(np.array([8, 1, 8]), 8) == [[0], [1], [2]]  # a row never reaches back
    assert plan_greedy(np.array([1, 1, 1]), 8, max_per_bin=2) == [[0, 1], [2]]
    assert plan_greedy(np.array([], dtype=np.int64), 8) == []


def test_greedy_closes_the_open_row_before_an_example_that_follows_a_dropped_one():
    closes = np.array([False, True, False, True, False])
    assert plan_greedy(np.array([2, 2, 2, 2, 2]), 8, closes=closes) == [[0], [1, 2], [3, 4]]
    assert plan_greedy(np.array([5, 2, 2]), 8, closes=np.array([True, False, False])) == [[0, 1], [2]]  # none open
    assert plan_greedy(np.array([2, 2, 2]), 8, max_per_bin=1, closes=np.array([0, 1, 0])) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="closes has 2 flags for 3 examples"):
        plan_greedy(np.array([2, 2, 2]), 8, closes=np.array([0, 1]))
    assert make_spec(recipe="gdp").packing.close_row_at_dropped and not make_spec().packing.close_row_at_dropped


def test_gdp_separator_strips_prompt_spaces_and_adds_one_before_the_completion_only_after_a_prompt():
    spec = make_spec(recipe="gdp", input={"type": "instruction"})
    texts = lambda c: [p.text for p in example_pieces(c, spec, _Info()) if p.text]  # noqa: E731
    assert texts({"turns": [{"prompt": "Q:  ", "completion": "  A"}]}) == ["Q:", " A"]
    assert texts({"turns": [{"prompt": "", "completion": "A"}]}) == ["A"]  # gdp would add a space here
    assert texts({"turns": [{"prompt": "Q: ", "completion": ""}]}) == ["Q:"]  # no space for an empty completion


class _Info:
    class info:  # noqa: N801 (shaped like PinnedTokenizer.info)
        add_bos, bos_id, add_eos, eos_id = False, None, True, 0


def test_recipe_gdp_is_refused_for_tables():
    with pytest.raises(Exception, match="tables have no gdp recipe"):
        make_spec(recipe="gdp", input={"type": "tabular"})


def test_fixtures_are_small_and_say_how_they_were_made():
    assert all(p.stat().st_size < 8000 for p in FIXTURES.glob("*.json"))
    assert "693d6e36835b3051298b026ead75832a5a61ffe3" in (FIXTURES / "README.md").read_text(encoding="utf-8")


def test_a_category_given_as_a_list_or_object_is_a_reject_not_a_traceback():
    """`record_category` put the values in a set: a list or object raised TypeError and stopped the drop."""
    spec = make_spec("gdp", input={"type": "instruction", "categories": ["x", "y"]}).input
    for value in ({"category": ["x"]}, {"category": []}, [{"category": "x"}, {"category": {"a": 1}}]):
        _, reason, detail = record_category(value, spec)
        assert reason == "unknown_category" and "a list or object names no category" in detail, value
    assert record_category([{"category": "y"}, {"category": "y"}], spec) == (1, None, None)
