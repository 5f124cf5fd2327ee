"""Tabular gold on small hand-made tables with the real GPT-2 tokenizer: exact examples per mode, the masks,
the split along groups, and the budget rejects the gate reads."""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prep_assets.core import invariants as inv
from prep_assets.core.gates import evaluate
from prep_assets.core.lake import dataset_paths
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT
from prep_assets.core.tokenizer import load_pinned
from prep_assets_tests.conftest import make_spec
from prep_assets_tests.core.helpers import run_core, write_raw

EOT = "<|endoftext|>"  # GPT-2's BOS and EOS: the default unit delimiters


def _run_drops(tmp_path: Path, gpt2: Path, drops: dict[str, str], tabular: dict, max_seq_len: int = 128, **extra):
    data = write_raw(tmp_path / "data", "tab", drops)
    extra.setdefault("checks", {"min_sequence_utilization": 0.0})
    spec = make_spec(
        "tab",
        input={"type": "tabular"},
        tokenizer={"path": str(gpt2)},
        sequence={"max_seq_len": max_seq_len},
        tabular=tabular,
        **extra,
    )
    return data, spec, run_core(data, spec)


def _run(tmp_path: Path, gpt2: Path, csv_text: str, tabular: dict, max_seq_len: int = 128, **extra):
    data, spec, runs = _run_drops(tmp_path, gpt2, {"table.csv": csv_text}, tabular, max_seq_len, **extra)
    ((key, r),) = runs.items()
    gold = pq.read_table(r["dirs"][2] / "examples.parquet").to_pylist()
    pt = load_pinned(dataset_paths(data, "tab").tokenizer_dir)
    return data, spec, key, r, gold, pt


def _text(pt, ids) -> str:
    return pt.hf.decode(ids, skip_special_tokens=False)


def _line(**row) -> str:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False)


FLAT = "id,name,score\n1,ann,3.5\n2,bob,\n3,cy,4\n4,dee,0.25\n5,eve,10\n"
FLAT_ROWS = [
    _line(id=1, name="ann", score=3.5),
    _line(id=2, name="bob", score=None),
    _line(id=3, name="cy", score=4.0),
    _line(id=4, name="dee", score=0.25),
    _line(id=5, name="eve", score=10.0),
]


def test_flat_exact_examples_seeded_shuffle_max_records_and_masks(tmp_path: Path, gpt2_dir: Path):
    data, spec, key, r, gold, pt = _run(
        tmp_path, gpt2_dir, FLAT, {}, packing={"max_sequences_per_example": 2, "seed": 4}
    )
    order = np.random.default_rng([4, 0]).permutation(5).tolist()  # the train split's seeded shuffle
    expected = [order[0:2], order[2:4], order[4:]]
    assert [g["example_id"] for g in gold] == [f"{key}:train/{k}" for k in range(3)]
    for g, recs in zip(gold, expected, strict=True):
        body = "".join(FLAT_ROWS[i] + "\n" for i in recs)
        assert _text(pt, g["token_ids"]) == f"id, name, score\n{EOT}{body}{EOT}"
        assert g["record_ids"] == [f"{key}:{i + 2}" for i in recs] and g["group_keys"] is None
        prompt = len(pt.encode_batch(["id, name, score\n"])[0])
        assert g["loss_mask"] == [0] * prompt + [1] * (len(g["token_ids"]) - prompt)  # records and BOS/EOS train
        assert g["token_type_ids"][:prompt] == [TYPE_PROMPT] * prompt
        assert g["token_type_ids"][prompt:-1] == [TYPE_COMPLETION] * (len(g["token_ids"]) - prompt - 1)
        assert g["token_type_ids"][-1] == TYPE_EOS and g["num_prompt_tokens"] == prompt
    assert all(o.passed for o in evaluate(spec, dataset_paths(data, "tab"), key)), [
        o.name for o in evaluate(spec, dataset_paths(data, "tab"), key) if not o.passed
    ]
    tab = r["gold"].tabular
    assert tab["mode"] == "flat" and tab["records_per_example"]["max"] == 2 and tab["records_in_examples"] == 5


def test_flat_flushes_when_the_next_record_would_not_fit(tmp_path: Path, gpt2_dir: Path):
    pt = load_pinned_gpt2(tmp_path, gpt2_dir)
    prompt = len(pt.encode_batch(["id, name, score\n"])[0])
    rows = [_line(id=i, name=f"n{i}", score=i + 0.5) + "\n" for i in range(1, 6)]
    sizes = {len(x) for x in pt.encode_batch(rows, continuation=True)}
    assert len(sizes) == 1  # every rendered row has the same number of GPT-2 tokens
    L = prompt + 2 + 2 * sizes.pop()  # room for exactly two rows
    _, _, _, r, gold, pt = _run(
        tmp_path / "run",
        gpt2_dir,
        "id,name,score\n" + "".join(f"{i},n{i},{i}.5\n" for i in range(1, 6)),
        {},
        max_seq_len=L,
    )
    assert [len(g["record_ids"]) for g in gold] == [2, 2, 1] and max(len(g["token_ids"]) for g in gold) == L


def load_pinned_gpt2(tmp_path: Path, gpt2: Path):
    from prep_assets.core.spec_sections import TokenizerSpec
    from prep_assets.core.tokenizer import pin_tokenizer

    dest = tmp_path / "tok"
    dest.mkdir(parents=True)
    pin_tokenizer(TokenizerSpec(path=str(gpt2)), base=tmp_path, dest=dest)
    return load_pinned(dest)


GROUPED = "who,t,v\nb,2,x\na,1,p\nb,1,y\nc,1,z\na,3,r\na,2,q\n"


def test_grouped_units_per_group_ordered_by_order_by_and_packed_counting_groups(tmp_path: Path, gpt2_dir: Path):
    _, _, key, r, gold, pt = _run(
        tmp_path, gpt2_dir, GROUPED, {"group_by": "who", "order_by": "t"}, packing={"max_sequences_per_example": 2}
    )
    units = {
        "b": [_line(who="b", t=1, v="y"), _line(who="b", t=2, v="x")],
        "a": [_line(who="a", t=1, v="p"), _line(who="a", t=2, v="q"), _line(who="a", t=3, v="r")],
        "c": [_line(who="c", t=1, v="z")],
    }
    first_seen = ["b", "a", "c"]
    order = [first_seen[g] for g in np.random.default_rng([0, 0]).permutation(3).tolist()]
    expected = [order[:2], order[2:]]
    texts = [_text(pt, g["token_ids"]) for g in gold]
    assert texts == [
        "who, t, v\n" + "".join(EOT + "".join(x + "\n" for x in units[k]) + EOT for k in ex) for ex in expected
    ]
    assert [g["group_keys"] for g in gold] == expected
    tab = r["gold"].tabular
    assert tab["groups"] == 3 and tab["groups_per_example"]["max"] == 2 and tab["examples_per_group"]["max"] == 1


def test_groups_never_divided_between_splits(tmp_path: Path, gpt2_dir: Path):
    rows = "".join(f"g{g},{t},{g * t}\n" for g in range(40) for t in range(3))
    _, _, _, r, gold, _ = _run(
        tmp_path,
        gpt2_dir,
        "who,t,v\n" + rows,
        {"group_by": "who"},
        max_seq_len=1024,
        split={"validation_ratio": 0.2, "test_ratio": 0.2},
    )
    split_of: dict[str, set[str]] = {}
    for g in gold:
        for k in g["group_keys"]:
            split_of.setdefault(k, set()).add(g["split"])
    assert len(split_of) == 40 and all(len(s) == 1 for s in split_of.values())
    assert {s for v in split_of.values() for s in v} == {"train", "validation", "test"}


def test_sequential_continues_in_order_flushes_on_group_change_and_draws_budgets(tmp_path: Path, gpt2_dir: Path):
    # two series written out of order; 13-token records; each training example's record budget is drawn in
    # [0.7, 1] x (max_seq_len - prompt - 2) with the seed, a first record above the draw expands it
    rows = [f"s{s},{t:02d},{t}.5\n" for s in (1, 2) for t in range(12)]
    csv_text = "sid,t,v\n" + "".join(rows[::-1])
    L = 100
    _, _, _, r, gold, pt = _run(
        tmp_path,
        gpt2_dir,
        csv_text,
        {"group_by": "sid", "order_by": "t", "time_series": True},
        max_seq_len=L,
        packing={"seed": 9},
    )
    tab = r["gold"].tabular
    size = tab["tokens_per_record"]["max"]
    assert tab["mode"] == "sequential" and tab["tokens_per_record"]["min"] == size
    record_budget = L - tab["schema_prompt_tokens"] - 2
    rng = np.random.default_rng([9, 0])
    by_group: dict[str, list[str]] = {}
    for g in gold:
        (group,) = g["group_keys"]  # one group per example: a change of group flushes
        draw = int(rng.uniform(0.7, 1.0) * record_budget)
        assert 0.7 * record_budget - 1 <= draw <= record_budget
        n = len(g["record_ids"])
        limit = max(draw, size)
        last = len(by_group.get(group, [])) + n == 12  # a group's last example ends with the group
        assert n * size <= limit and ((n + 1) * size > limit or n == 10 or last)
        lines = _text(pt, g["token_ids"]).split(EOT)[1].splitlines()
        by_group.setdefault(group, []).extend(lines)
    # series in the file's group order (s2 first: the file is reversed), each continued across examples in time order
    assert list(by_group) == ["s2", "s1"]
    for s in ("s1", "s2"):  # "00".."11" have leading zeros: the column stays text (and sorts as text)
        assert [json.loads(x)["t"] for x in by_group[s]] == [f"{t:02d}" for t in range(12)]
    assert tab["examples_per_group"]["min"] >= 2  # 12 records never fit one example of 100 tokens
    prefill = tab["initial_prefill"]
    assert list(prefill) == ["s1", "s2"] and [json.loads(x)["t"] for x in prefill["s1"]] == ["00", "01", "02"]


def test_sequential_test_split_uses_the_full_budget_and_train_the_seeded_draws(tmp_path: Path, gpt2_dir: Path):
    rows = "".join(f"s{s},{t:02d},{t}.5\n" for s in range(30) for t in range(8))
    _, spec, _, r, gold, _ = _run(
        tmp_path,
        gpt2_dir,
        "sid,t,v\n" + rows,
        {"group_by": "sid", "order_by": "t", "time_series": True},
        max_seq_len=100,
        split={"test_ratio": 0.5},
        packing={"max_sequences_per_example": 100, "seed": 5},
    )
    tab = r["gold"].tabular
    record_budget = 100 - tab["schema_prompt_tokens"] - 2
    size = tab["tokens_per_record"]["max"]
    assert tab["tokens_per_record"]["min"] == size

    def sizes(draws) -> list[int]:  # the flush rule on equal-size records: 8 per group, groups in order
        out = []
        for _ in range(len({g["group_keys"][0] for g in gold if g["split"] == split})):
            left = 8
            while left:
                n = min(left, max(1, max(next(draws), size) // size))
                out.append(n)
                left -= n
        return out

    rng = np.random.default_rng([5, 0])
    split = "train"
    train = sizes(int(rng.uniform(0.7, 1.0) * record_budget) for _ in iter(int, 1))
    assert [len(g["record_ids"]) for g in gold if g["split"] == "train"] == train
    split = "test"
    test = sizes(record_budget for _ in iter(int, 1))
    assert [len(g["record_ids"]) for g in gold if g["split"] == "test"] == test
    assert len(set(test)) <= 2 < len(set(train)) or set(train) != set(test)


def test_sequential_shard_rows_stay_in_order(tmp_path: Path, gpt2_dir: Path):
    rows = "".join(f"s{s},{t:02d},{t}.5\n" for s in range(6) for t in range(10))
    data, _, key, r, gold, _ = _run(
        tmp_path,
        gpt2_dir,
        "sid,t,v\n" + rows,
        {"group_by": "sid", "order_by": "t", "time_series": True},
        max_seq_len=100,
    )
    shard = pq.read_table(r["dirs"][3] / "train" / "part-00000.parquet", columns=["example_ids"]).to_pylist()
    assert [x["example_ids"][0] for x in shard] == [g["example_id"] for g in gold if g["split"] == "train"]


def test_initial_prefill_merges_drops_by_order_by(tmp_path: Path, gpt2_dir: Path):
    drops = {"a.csv": "sid,t,v\ns1,05,1\ns2,01,1\n", "b.csv": "sid,t,v\ns1,03,1\ns1,00,1\ns1,04,1\ns1,01,1\n"}
    data, _, runs = _run_drops(tmp_path, gpt2_dir, drops, {"group_by": "sid", "order_by": "t", "time_series": True})
    manifest = json.loads((data / "lake" / "tab" / "manifest.json").read_text())
    prefill = manifest["tabular"]["initial_prefill"]
    assert {g: [json.loads(x)["t"] for x in v] for g, v in prefill.items()} == {"s1": ["00", "01", "03"], "s2": ["01"]}


def test_a_group_id_typed_differently_across_drops_stays_in_one_split(tmp_path: Path, gpt2_dir: Path):
    ids = range(40)
    drops = {
        "a.csv": "dev,v\n" + "".join(f"{i},1\n" for i in ids),
        "b.csv": "dev,v\n" + "".join(f"{i},2\n" for i in ids) + "x9,2\n",
    }  # x9: the column is text here
    _, _, runs = _run_drops(
        tmp_path, gpt2_dir, drops, {"group_by": "dev"}, max_seq_len=1024, split={"test_ratio": 0.5}
    )
    split_of: dict[str, set] = {}
    for r in runs.values():
        for g in pq.read_table(r["dirs"][2] / "examples.parquet").to_pylist():
            for k in g["group_keys"]:
                split_of.setdefault(k, set()).add(g["split"])
    assert len(split_of) == 41 and all(len(v) == 1 for v in split_of.values())
    assert {s for v in split_of.values() for s in v} == {"train", "test"}


def test_jsonl_rows_take_the_union_of_keys_nulls_and_nested_values(tmp_path: Path, gpt2_dir: Path):
    text = (
        '{"id": 1, "tags": ["a", "b"]}\n{"id": 2, "extra": {"k": true}, "score": null}\n'
        '{"id": 3, "tags": null, "score": 1.5}\n"not a row"\n{"id": 4, "score": NaN}\n'
    )
    data, spec, runs = _run_drops(
        tmp_path,
        gpt2_dir,
        {"rows.jsonl": text},
        {},
        max_seq_len=256,
        checks={"max_reject_rate": 0.5, "min_sequence_utilization": 0.0},
    )
    (r,) = runs.values()
    assert r["bronze"].records == 3  # NaN is not JSON: that line is a reader reject, never a silent null
    assert sorted(r["bronze"].rejects_by_reason) == ["invalid_json_constant", "not_an_object"]
    pt = load_pinned(dataset_paths(data, "tab").tokenizer_dir)
    (g,) = pq.read_table(r["dirs"][2] / "examples.parquet").to_pylist()
    text_out = _text(pt, g["token_ids"])
    assert text_out.startswith("id, tags, extra, score\n")
    lines = sorted((json.loads(x) for x in text_out.split(EOT)[1].splitlines()), key=json.dumps)
    assert lines == sorted(
        [
            {"id": 1, "tags": ["a", "b"], "extra": None, "score": None},
            {"id": 2, "tags": None, "extra": {"k": True}, "score": None},
            {"id": 3, "tags": None, "extra": None, "score": 1.5},
        ],
        key=json.dumps,
    )


def test_over_budget_group_and_record_become_rejects_and_fail_the_budget_gate(tmp_path: Path, gpt2_dir: Path):
    rows = "who,t,v\n" + "".join(f"big,{t},{t}\n" for t in range(30)) + "small,1,1\nsmall,2,2\n"
    data, spec, key, r, gold, _ = _run(tmp_path, gpt2_dir, rows, {"group_by": "who"}, max_seq_len=120)
    assert [g["group_keys"] for g in gold] == [["small"]]
    rejects = pq.read_table(r["dirs"][2] / "rejects.parquet").to_pylist()
    assert {x["reason"] for x in rejects} == {"group_over_budget"} and len(rejects) == 30
    outcome = inv.gold_tabular_budget(r["dirs"][2], 120)
    assert outcome.violations == 1 and outcome.offending[0]["name"] == "big" and outcome.offending[0]["records"] == 30
    tokens = outcome.offending[0]["tokens"]
    assert tokens > 120 and f"group 'big' ({tokens} tokens, 30 record(s), table.csv:2)" in outcome.description
    assert "max_seq_len 120" in outcome.description and "For a group: group by a finer column" in outcome.description
    assert "raise sequence.max_seq_len" in outcome.description and "For a record" not in outcome.description
    assert "max_sequences_per_example" not in outcome.description  # no remedy: a group is one example whole
    # accounting still holds: every silver record is in an example or a reject
    assert inv.gold_accounted(r["dirs"][2], r["dirs"][1]).passed
    failed = [o.name for o in evaluate(spec, dataset_paths(data, "tab"), key) if not o.passed]
    assert failed == ["tokenized_examples_reject_rate", "tokenized_examples_tabular_budget"]  # rejects: 2 of 5


def test_a_record_alone_over_budget_is_a_reject_in_flat_mode(tmp_path: Path, gpt2_dir: Path):
    rows = "k,text\n1,short\n2," + "word " * 80 + "\n"
    _, _, _, r, gold, _ = _run(tmp_path, gpt2_dir, rows, {}, max_seq_len=40)
    (rej,) = pq.read_table(r["dirs"][2] / "rejects.parquet").to_pylist()
    assert rej["reason"] == "record_over_budget" and rej["source_line"] == 3 and rej["num_tokens"] > 40
    outcome = inv.gold_tabular_budget(r["dirs"][2], 40)
    assert outcome.violations == 1 and outcome.offending[0]["kind"] == "record"
    assert [len(g["record_ids"]) for g in gold] == [1]


def test_a_huge_record_in_grouped_mode_leaves_its_group_out_once(tmp_path: Path, gpt2_dir: Path):
    rows = "who,t,v\na,1,x\na,2," + "word " * 80 + "\nb,1,y\n"
    _, _, _, r, gold, _ = _run(tmp_path, gpt2_dir, rows, {"group_by": "who"}, max_seq_len=60)
    rejects = pq.read_table(r["dirs"][2] / "rejects.parquet").to_pylist()
    assert sorted((x["source_line"], x["reason"]) for x in rejects) == [
        (2, "group_over_budget"),
        (3, "group_over_budget"),
    ]
    assert inv.gold_accounted(r["dirs"][2], r["dirs"][1]).passed
    assert [g["group_keys"] for g in gold] == [["b"]]
