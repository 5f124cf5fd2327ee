"""`recipe: safe_synthesizer` on the shared Safe Synthesizer tables equals SS's own assembler: the schema prompt, the
examples with their records in order, each example's tokens (hence its budget) and the sequential initial_prefill.
Expected values: prep_assets_tests/fixtures/safe_synthesizer/ (obtained from SS 0.1.12, see its README)."""

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from transformers import AutoTokenizer

from prep_assets.core.errors import SpecError
from prep_assets_tests.conftest import PROJECT, make_spec, shared_path
from prep_assets_tests.core.helpers import run_core, write_raw

FIXTURES = Path(__file__).parent.parent / "fixtures" / "safe_synthesizer"

CASES = {
    "iris_flat": {},
    "patient_events_grouped": {"group_by": "patient_name"},
    "dow_jones_sequential": {"time_series": True, "group_by": "stock", "order_by": "date"},
    # no group, no timestamp: one pseudo-group ordered by a generated elapsed_seconds column
    "iris_ungrouped_elapsed": {"time_series": True, "timestamp_interval_seconds": 60},
    # a table of the fixtures folder: patient events' first 40 rows, 3 ages blanked (SS renders the others 49.0)
    "patient_events_missing_ages": {},
}


def _run(tmp_path: Path, name: str) -> tuple[dict, list[dict], dict]:
    fx = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    source = (
        FIXTURES / fx["table"] if (FIXTURES / fx["table"]).exists() else shared_path(f"datasets/tabular/{fx['table']}")
    )
    table = source.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = table[1:] if fx["nrows"] is None else table[1 : 1 + fx["nrows"]]
    data = write_raw(tmp_path / "data", "ss", {"table.csv": "".join([table[0], *rows])})
    spec = make_spec(
        "ss",
        recipe="safe_synthesizer",
        input={"type": "tabular"},
        tokenizer={"path": str(shared_path("tokenizers/tinyllama"))},
        sequence={"max_seq_len": fx["max_seq_len"]},
        packing={"seed": fx["seed"]},
        tabular={**CASES[name], "num_input_records_to_sample": fx["num_input_records_to_sample"]},
        checks={"min_sequence_utilization": 0.0},
    )
    ((_, r),) = run_core(data, spec).items()
    gold = pq.read_table(r["dirs"][2] / "examples.parquet").to_pylist()
    return fx, gold, r


def _row_of(r: dict) -> dict[str, int]:
    """record_id -> 0-based data row of the CSV (line 1 is the header)."""
    silver = pq.read_table(r["dirs"][1] / "records.parquet", columns=["record_id", "source_line"]).to_pylist()
    return {x["record_id"]: x["source_line"] - 2 for x in silver}


def _without_ss_bug(fx: dict) -> list[dict]:
    """SS's examples, except that grouped mode's budget counts the prompt once (SS counts it twice, docs/spec.md):
    SS's group order re-packed greedily so that prompt + every group with its BOS/EOS fits max_seq_len."""
    if fx["data"].get("group_training_examples_by") is None or fx["time_series"]:
        return fx["examples"]
    prompt, limit, tokens = len(fx["schema_prompt_ids"]), fx["max_seq_len"], fx["record_tokens"]
    out: list[dict] = []
    for unit in (u for e in fx["examples"] for u in e["units"]):
        need = 2 + sum(tokens[i] for i in unit)
        if out and len(out[-1]["units"]) < fx["max_sequences_per_example"] and out[-1]["num_tokens"] + need <= limit:
            out[-1]["units"].append(unit)
            out[-1]["num_tokens"] += need
        else:
            out.append({"units": [unit], "num_tokens": prompt + need})
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_recipe_safe_synthesizer_equals_its_assembler(tmp_path: Path, name: str):
    fx, gold, r = _run(tmp_path, name)
    prompt = fx["schema_prompt_ids"]
    assert [g["token_ids"][: len(prompt)] for g in gold[:1]] == [prompt]
    row = _row_of(r)
    lines = fx["lines"]
    ours = []
    for g in gold:
        recs = [lines[row[rid]] for rid in g["record_ids"]]
        ours.append((recs, g["num_tokens"]))
    ss_examples = _without_ss_bug(fx)
    expected = [([lines[i] for u in e["units"] for i in u], e["num_tokens"]) for e in ss_examples]
    assert len(ours) == len(expected)
    assert ours == expected
    # our records render as SS's lines: each example's ids are the prompt + per unit BOS, SS's lines, EOS
    tok = AutoTokenizer.from_pretrained(str(shared_path("tokenizers/tinyllama")))
    ids = tok([line + "\n" for line in lines], add_special_tokens=False)["input_ids"]
    assert [len(x) for x in ids] == fx["record_tokens"]
    bos, eos = prompt[0], prompt[-1]
    for g, e in zip(gold, ss_examples, strict=True):
        assert g["token_ids"] == prompt + [t for u in e["units"] for t in [bos, *(x for i in u for x in ids[i]), eos]]
    if "initial_prefill" in fx:
        assert r["gold"].tabular["initial_prefill"] == fx["initial_prefill"]


def _spec(**tabular):
    return make_spec("ss", recipe="safe_synthesizer", input={"type": "tabular"}, tabular=tabular)


def test_recipe_sets_ss_defaults_and_a_spec_key_wins():
    spec = _spec(float_digits=6)
    assert spec.tabular is not None
    assert (spec.tabular.prompt, spec.tabular.record_encoding, spec.tabular.assembly) == (
        "safe_synthesizer",
        "standalone",
        "safe_synthesizer",
    )
    assert spec.tabular.float_digits == 6
    assert spec.sequence.max_seq_len == 2048


def test_max_sequences_per_example_auto_is_one_under_differential_privacy():
    assert _spec().max_per_example == 10
    assert _spec(differential_privacy=True).max_per_example == 1


def test_recipe_safe_synthesizer_is_refused_for_text():
    with pytest.raises(SpecError, match="safe_synthesizer prepares tables"):
        make_spec("ss", recipe="safe_synthesizer", input={"type": "text"})


def test_ss_sampling_passes():
    import numpy as np

    from prep_assets.core.tabular import group_passes, safe_synthesizer_prefill, sample_passes, sequence_passes

    rng = np.random.default_rng(0)
    passes = sample_passes(4, 6, rng)  # 1.5 passes: one whole permutation, then the first 2 of another
    assert [sorted(p) for p in passes] == [[0, 1, 2, 3], sorted(passes[1])] and len(passes[1]) == 2
    assert list(map(list, sequence_passes(4, 6))) == [[0, 1, 2, 3], [0, 1]]
    assert [len(p) for p in group_passes([3, 1], 6, np.random.default_rng(0))][0] == 2
    assert safe_synthesizer_prefill(["a", "b", "c", "d"]) == " a\nb\nc\n"


def test_the_readme_spec_parses_and_says_what_its_safe_synthesizer_config_says():
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)]
    (ss,) = [b for b in blocks if "time_series" in b and "training" in b]
    (ours,) = [b for b in blocks if b.get("recipe") == "safe_synthesizer"]
    spec = make_spec("sensors", **ours)
    tab = spec.tabular
    assert tab is not None and tab.resolved_mode == "sequential" and tab.assembly == "safe_synthesizer"
    assert (tab.group_by, tab.order_by) == (
        ss["data"]["group_training_examples_by"],
        ss["time_series"]["timestamp_column"],
    )
    assert tab.num_input_records_to_sample == ss["training"]["num_input_records_to_sample"]
    assert (spec.split.validation_ratio, spec.split.test_ratio) == (0.0, 0.0)  # SS: holdout 0, validation_ratio 0
    assert spec.sequence.max_seq_len == 2048 and spec.max_per_example == 10


def test_integer_columns_with_a_missing_cell_are_pandas_floats_under_the_recipe_only():
    from prep_assets.core.tabular import pandas_float_columns

    rows = [[1, True, 2, "a"], [None, None, 3, None], [4, False, None, "b"]]
    assert pandas_float_columns(rows) == [0, 2]  # bools and text stay as they are, a full int column too
    assert pandas_float_columns([[1], [2]]) == [] and pandas_float_columns([]) == []
    assert _spec().tabular.missing_ints_as_floats
    assert not make_spec("t", input={"type": "tabular"}).tabular.missing_ints_as_floats
