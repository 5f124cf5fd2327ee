"""Chat masks on real templates: round trips, the inference prefix property, injection, preference pairs.

Every record of the three shared conversation datasets is checked with TinyLlama's and Mistral's own
templates and with GPT-2 + the project's ChatML template. Mismatch counts are printed (run with -s).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep_assets.core.chat import ChatTemplate
from prep_assets.core.clean import Record, empty_turn, trained_roles
from prep_assets.core.masking import tokenize_batch
from prep_assets.core.records import (
    TYPE_COMPLETION,
    TYPE_EOS,
    extract_chat,
    extract_preference,
)
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import PROJECT, make_spec, shared_path
from prep_assets_tests.core.helpers import (
    batch_examples,
    mask_runs,
    pin_and_load,
    read_records,
    run_core,
    run_one_file,
)

CHATML = PROJECT / "data" / "templates" / "chatml.jinja"
# per tokenizer: its end-of-turn text, and the role map its template needs for tool results
TOKENIZERS = {
    "gpt2": {"eot": "<|im_end|>", "template": True, "role_map": {}},
    "tinyllama": {"eot": "</s>", "template": False, "role_map": {"observation": "user"}},  # no tool role
    "mistral7b": {"eot": "</s>", "template": False, "role_map": {"observation": "user"}},  # tool needs call ids
}
# TinyLlama's template has no tools section; Mistral's lists the tools before the *last* user message, so a
# tool-using history rendered for generation differs from the same history inside the longer conversation
EXPECTED_REJECTS = {
    ("tinyllama", "chat/glaive_toolcall_en_demo.json"): {"chat_template_dropped_tools": 191},
    ("mistral7b", "chat/glaive_toolcall_en_demo.json"): {"chat_template_history_differs": 153},
}
DATASETS = (
    "chat/glaive_toolcall_en_demo.json",
    "chat/fastchat_dummy_conversation.json",
    "dialogue/gdp_dialogue.jsonl",
)


def _spec(name: str, type_: str = "chat", max_seq_len: int = 16384, **extra: Any) -> DatasetSpec:
    cfg = TOKENIZERS[name]
    tokenizer: dict[str, Any] = {"path": str(shared_path(f"tokenizers/{name}"))}
    if cfg["template"]:
        tokenizer["chat_template_file"] = str(CHATML)
    inp = {"type": type_, "role_map": cfg["role_map"], **extra.pop("input", {})}
    return make_spec(
        input=inp, tokenizer=tokenizer, sequence={"max_seq_len": max_seq_len, **extra.pop("sequence", {})}, **extra
    )


@pytest.mark.parametrize("tok", list(TOKENIZERS))
def test_chat_mask_round_trip_every_record(tok: str, tmp_path: Path):
    """Trained tokens decode to exactly the assistant contents + end-of-turn; all tokens to the rendering."""
    spec = _spec(tok)
    pt = pin_and_load(spec, tmp_path)
    chat = ChatTemplate(pt)
    eot = TOKENIZERS[tok]["eot"]
    checked = mismatches = prefix_checked = 0
    prefix_violations: dict[str, int] = {}
    rejected: dict[str, dict[str, int]] = {}
    for rel in DATASETS:
        contents = [extract_chat(v, spec.input) for v in read_records(shared_path(f"datasets/{rel}"))]
        tb = tokenize_batch(contents, spec, pt, chat)
        rejected[rel] = dict(Counter(r[1] for r in tb.rejects))
        # the records a template cannot train as they are: named, never kept half-right (README)
        assert rejected[rel] == EXPECTED_REJECTS.get((tok, rel), {}), (rel, tb.rejects[:3])
        assert tb.split_at_turn_boundary == 0  # no merge spans a turn's edge here: ids = tokenizer(rendering)
        prefix_violations[rel] = 0
        for rec, (ids, mask, types) in zip(tb.kept.tolist(), batch_examples(tb), strict=True):
            msgs, tools = contents[rec]["messages"], contents[rec].get("tools")
            rendering = chat.render(msgs, tools)
            added_bos = pt.info.add_bos and not rendering.startswith(pt.hf.bos_token or "\0")
            head = 1 if added_bos else 0
            checked += 1
            # all tokens: exactly the template's rendering, tokenized as the tokenizer tokenizes it
            expected_ids = pt.hf(rendering, add_special_tokens=False)["input_ids"]
            ok = ids[head:].tolist() == expected_ids and pt.hf.decode(ids[head:].tolist()) == rendering
            # trained tokens: the assistant contents with their end-of-turn text, nothing else
            trained = [pt.hf.decode(ids[a:b].tolist()).strip() for a, b in mask_runs(mask)]
            wanted = [m["content"].strip() + eot for m in msgs if m["role"] == "assistant"]
            ok = ok and trained == wanted and set(types[mask == 1].tolist()) <= {TYPE_COMPLETION, TYPE_EOS}
            mismatches += not ok
            # the prompt seen at inference is a token prefix of the training sequence at each assistant turn
            for i in (i for i, m in enumerate(msgs) if m["role"] == "assistant" and i > 0):
                prompt = chat.render(msgs[:i], tools, add_generation_prompt=True)
                prompt_ids = ([pt.info.bos_id] if added_bos else []) + pt.hf(prompt, add_special_tokens=False)[
                    "input_ids"
                ]
                prefix_checked += 1
                prefix_violations[rel] += ids[: len(prompt_ids)].tolist() != prompt_ids
    print(
        f"\n{tok}: {checked} records checked, {mismatches} mismatches, rejected {rejected}; "
        f"{prefix_checked} assistant turns prefix-checked, violations {prefix_violations}"
    )
    assert checked + sum(sum(r.values()) for r in rejected.values()) == 300 + 500 + 42 and mismatches == 0
    assert sum(prefix_violations.values()) == 0


@pytest.mark.parametrize("tok", list(TOKENIZERS))
def test_special_token_strings_in_user_content_stay_plain_text(tok: str, tmp_path: Path):
    spec = _spec(tok)
    pt = pin_and_load(spec, tmp_path)
    specials = sorted(t.content for t in pt.hf.backend_tokenizer.get_added_tokens_decoder().values())
    specials += ["<|im_start|>", "<|im_end|>", "[INST]", "</s>"]
    injected = {
        "messages": [
            {"role": "user", "content": "look: " + " ".join(specials)},
            {"role": "assistant", "content": "ok " + "".join(specials[:3])},
        ]
    }
    plain = {"messages": [{"role": "user", "content": "look"}, {"role": "assistant", "content": "ok"}]}
    tb = tokenize_batch([injected, plain], spec, pt)
    (inj_ids, _, _), (plain_ids, _, _) = batch_examples(tb)
    special_ids = set(pt.hf.backend_tokenizer.get_added_tokens_decoder())
    emitted = sorted(i for i in inj_ids.tolist() if i in special_ids)
    assert emitted == sorted(i for i in plain_ids.tolist() if i in special_ids)  # only the template's own
    assert pt.hf.decode(inj_ids.tolist()).count(specials[-1]) >= 1


def test_exactly_one_bos_whether_or_not_the_template_emits_it(tmp_path: Path):
    conv = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    for tok in ("tinyllama", "mistral7b"):  # TinyLlama's template has no BOS, Mistral's writes one
        pt = pin_and_load(_spec(tok), tmp_path / tok)
        ((ids, _, _),) = batch_examples(tokenize_batch([conv], _spec(tok), pt))
        assert ids[0] == pt.info.bos_id and (ids == pt.info.bos_id).sum() == 1, tok


def test_truncation_that_leaves_no_trained_token_rejects_no_trained_tokens(tmp_path: Path):
    spec = _spec("gpt2", max_seq_len=48, sequence={"overflow": "truncate_right"})
    pt = pin_and_load(spec, tmp_path)
    long_user = {"messages": [{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "yes"}]}
    no_assistant = {"messages": [{"role": "user", "content": "only a question"}]}
    fits = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    tb = tokenize_batch([long_user, no_assistant, fits], spec, pt)
    assert tb.kept.tolist() == [2]
    assert [(r[0], r[1]) for r in tb.rejects] == [(0, "no_trained_tokens"), (1, "no_trained_tokens")]
    assert "truncated to 48 (sequence.overflow truncate_right)" in tb.rejects[0][2]  # the cause, not just the count
    assert "no text of a trained role" in tb.rejects[1][2]


def test_masks_follow_the_spec_roles_tool_turns_masked_by_default(tmp_path: Path):
    conv = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": '{"name": "weather"}'},
            {"role": "tool", "content": '{"temp": 20}'},
            {"role": "assistant", "content": "20 C"},
        ]
    }
    default = _spec("gpt2")
    pt = pin_and_load(default, tmp_path)
    ((ids, mask, _),) = batch_examples(tokenize_batch([conv], default, pt))
    assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == [
        '{"name": "weather"}<|im_end|>',
        "20 C<|im_end|>",
    ]
    both = _spec("gpt2", mask={"tool": "train", "assistant": "mask"})
    ((ids, mask, _),) = batch_examples(tokenize_batch([conv], both, pt))
    assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == ['{"temp": 20}<|im_end|>']


def test_template_that_drops_a_role_rejects_the_record_never_silently(tmp_path: Path):
    spec = _spec("tinyllama", input={"role_map": {}})  # TinyLlama's template has no tool role
    pt = pin_and_load(spec, tmp_path)
    conv = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a"},
        ]
    }
    tb = tokenize_batch([conv], spec, pt)
    assert len(tb.kept) == 0 and tb.rejects[0][1] == "chat_template_dropped_message"


def test_sharegpt_roles_map_system_and_tools(tmp_path: Path):
    spec = make_spec(input={"type": "chat", "role_map": {"bot": "assistant"}})
    value = {
        "system": "sys",
        "tools": '[{"name": "f", "parameters": {}}]',
        "conversations": [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}],
    }
    content = extract_chat(value, spec.input)
    assert content == {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }
    bad = extract_chat({"conversations": [{"from": "narrator", "value": "x"}]}, spec.input)
    assert bad.reason == "unknown_role" and "input.role_map" in bad.detail


def test_what_a_message_says_beyond_its_role_and_content_is_a_reject_never_dropped():
    spec = make_spec(input={"type": "chat"}).input
    user = {"role": "user", "content": "q"}

    def reason(**extra: Any) -> str | None:
        got = extract_chat({"messages": [user, {"role": "assistant", "content": "a", **extra}]}, spec)
        return getattr(got, "reason", None)

    assert reason(function_call={"name": "f", "arguments": "{}"}) == "unsupported_tool_calls"  # OpenAI's legacy call
    assert reason(weight=0.5) == "unsupported_message_field"  # OpenAI's weights are 0 and 1 only
    assert reason(weight="0") == "unsupported_message_field" and reason(weight=False) == "unsupported_message_field"
    assert reason(reasoning_content="because") == "unsupported_message_field"
    assert reason(weight=0) is None  # "do not train this turn": kept, masked (the weights test below)
    assert reason(weight=1) is None and reason(name="bot", reasoning_content="") is None  # nothing lost
    two = {"system": "be brief", "messages": [{"role": "system", "content": "be verbose"}, user]}
    assert extract_chat(two, spec).reason == "conflicting_system"  # type: ignore[union-attr]
    same = {"system": "be brief", "messages": [{"role": "system", "content": "be brief"}, user]}
    assert extract_chat(same, spec) == {"messages": same["messages"]}
    pair = {"system": "k", "prompt": [{"role": "system", "content": "m"}, user], "chosen": "A", "rejected": "B"}
    assert extract_preference(pair, spec).reason == "conflicting_system"  # type: ignore[union-attr]


def test_openai_weight_0_turn_is_rendered_but_not_trained_weight_1_is_the_default(tmp_path: Path):
    spec = _spec("gpt2")
    pt = pin_and_load(spec, tmp_path)
    first, second = {"role": "assistant", "content": "draft"}, {"role": "assistant", "content": "final"}
    plain = {"messages": [_u("q"), first, _u("again"), second]}
    weighted = {"messages": [_u("q"), {**first, "weight": 0}, _u("again"), {**second, "weight": 1}]}
    content = extract_chat(weighted, spec.input)
    assert content["messages"][1] == {**first, "weight": 0}  # type: ignore[index]
    assert content["messages"][3] == second  # type: ignore[index]  # weight 1 is the default: same bytes
    ((ids, mask, _),) = batch_examples(tokenize_batch([extract_chat(plain, spec.input)], spec, pt))
    ((w_ids, w_mask, _),) = batch_examples(tokenize_batch([content], spec, pt))
    assert w_ids.tolist() == ids.tolist()  # the template never sees the weight: the same rendering
    assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == ["draft<|im_end|>", "final<|im_end|>"]
    assert [pt.hf.decode(w_ids[a:b].tolist()) for a, b in mask_runs(w_mask)] == ["final<|im_end|>"]
    # an empty weight-0 answer is no empty trained turn; every answer at weight 0 leaves nothing to train
    empty = {"messages": [_u("q"), {"role": "assistant", "content": " ", "weight": 0}, _u("again"), second]}
    assert empty_turn(Record(extract_chat(empty, spec.input), [], spec.clean, trained_roles(spec))) is None
    muted = {"messages": [_u("q"), {**first, "weight": 0}]}
    tb = tokenize_batch([extract_chat(muted, spec.input)], spec, pt)
    assert len(tb.kept) == 0 and tb.rejects[0][1] == "no_trained_tokens"


def test_tools_given_as_a_json_string_are_read_as_strictly_as_a_line():
    """`_tools` read its JSON string with json.loads: a key given twice lost a value, NaN passed."""
    spec = make_spec(input={"type": "chat"}).input
    messages = [_u("q"), _a("a")]
    deep = '[{"name": "f", "parameters": ' + "[" * 200 + "]" * 200 + "}]"  # a line this deep is a reject too
    surrogate = '[{"name": "f", "description": "\\ud800"}]'
    for tools in ('[{"name": "f", "name": "g", "parameters": {}}]', '[{"name": "f", "parameters": {"x": NaN}}]', deep):
        got = extract_chat({"messages": messages, "tools": tools}, spec)
        assert got.reason == "invalid_tools"  # type: ignore[union-attr]
    assert "lone surrogate" in extract_chat({"messages": messages, "tools": surrogate}, spec).detail  # type: ignore[union-attr]
    ok = extract_chat({"messages": messages, "tools": '[{"name": "f", "parameters": {}}]'}, spec)
    assert ok["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {}}}]  # type: ignore[index]


def test_a_chat_giving_both_messages_and_conversations_is_a_reject_never_one_of_them_lost():
    spec = make_spec(input={"type": "chat"}).input
    both = {"messages": [_u("q"), _a("a")], "conversations": [{"from": "human", "value": "x"}]}
    got = extract_chat(both, spec)
    assert got.reason == "conflicting_conversations" and "'conversations'" in got.detail  # type: ignore[union-attr]
    assert extract_chat({**both, "conversations": None}, spec)["messages"][0]["content"] == "q"  # type: ignore[index]
    merged = extract_chat({**both, "messages": None}, spec)  # a table merged from both formats: the other is null
    assert merged["messages"] == [{"role": "user", "content": "x"}]  # type: ignore[index]
    chosen = make_spec(input={"type": "chat", "messages_key": "conversations"}).input
    assert extract_chat(both, chosen)["messages"] == [{"role": "user", "content": "x"}]  # type: ignore[index]


def test_a_message_missing_its_role_or_content_is_named_in_its_own_format():
    """An OpenAI message without content was told it lacked ShareGPT's 'value' (and one without a role, 'from')."""
    spec = make_spec(input={"type": "chat"}).input
    cases = {
        "no key 'content'": [{"role": "user"}, _a("x")],
        "no string 'role'": [{"content": "no role"}, _a("x")],
        "no key 'value'": [{"from": "human"}, {"from": "gpt", "value": "x"}],
        "no string 'from'": [{"value": "no role"}, {"from": "gpt", "value": "x"}],
    }
    for said, messages in cases.items():
        got = extract_chat({"messages": messages}, spec)
        assert got.reason == "missing_key" and said in got.detail, (said, got)  # type: ignore[union-attr]


def test_a_given_prompt_repeated_by_one_branch_only_is_a_reject():
    spec = make_spec(input={"type": "preference"}).input
    repeated = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A"}]
    one = extract_preference({"prompt": "Q?", "chosen": repeated, "rejected": "B"}, spec)
    assert one.reason == "inconsistent_prompt" and "'chosen'" in one.detail  # type: ignore[union-attr]
    both = extract_preference(
        {"prompt": "Q?", "chosen": repeated, "rejected": [repeated[0], {**repeated[1], "content": "B"}]}, spec
    )
    assert both["prompt"] == [repeated[0]] and both["chosen"] == [repeated[1]]  # type: ignore[index]


def test_preference_branches_that_differ_before_the_answer_are_a_reject_not_a_pair():
    """Branches asking different questions were kept as one pair: each trained its answer on its own question."""
    spec = make_spec(input={"type": "preference"}).input
    hh = {"chosen": "\n\nHuman: hh q\n\nAssistant: hh good", "rejected": "\n\nHuman: other q\n\nAssistant: hh bad"}
    u, a = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    listed = {"chosen": [u, a], "rejected": [{**u, "content": "DIFFERENT"}, {**a, "content": "b"}]}
    later = {"chosen": [u, a, {**u, "content": "then"}, a], "rejected": [u, a, {**u, "content": "else"}, a]}
    for value in (hh, listed, later):
        got = extract_preference(value, spec)
        assert got.reason == "inconsistent_prompt" and "user message" in got.detail  # type: ignore[union-attr]
    given = extract_preference({"prompt": "Q?", "chosen": [{**u, "content": "Q2"}, a], "rejected": "B"}, spec)
    assert given.reason == "inconsistent_prompt" and "'chosen'" in given.detail  # type: ignore[union-attr]
    # a given prompt's branches may share their leading turns: the pair differs at the answer
    system = [{"role": "system", "content": "Be terse."}]
    shared = extract_preference({"prompt": system, "chosen": [u, a], "rejected": [u, {**a, "content": "b"}]}, spec)
    assert shared["prompt"] == system and shared["chosen"] == [u, a]  # type: ignore[index]
    hh_given = {"prompt": "sys", "chosen": hh["chosen"], "rejected": hh["chosen"].replace("good", "bad")}
    assert isinstance(extract_preference(hh_given, spec), dict)
    # a branch that is only the repeated prompt is a reject, no crash (one record must never stop its drop)
    empty = extract_preference({"prompt": "q", "chosen": [u], "rejected": [u, a]}, spec)
    assert empty.reason == "empty_branch" and "'chosen'" in empty.detail  # type: ignore[union-attr]
    longer = extract_preference({"chosen": [u, a], "rejected": [u, a, {**u, "content": "more"}, a]}, spec)
    assert "differ first at a user message of 'rejected'" in longer.detail  # type: ignore[union-attr]
    # the answers differing at any turn after the same context is a pair
    tools = [{"role": "assistant", "content": "calling"}, {"role": "tool", "content": "42"}, a]
    ok = extract_preference({"chosen": [u, *tools], "rejected": [u, {**a, "content": "no"}]}, spec)
    assert ok["prompt"] == [u] and ok["chosen"] == tools  # type: ignore[index]


def test_preference_hh_shared_prompt_masked_and_identical_in_both_branches(tmp_path: Path):
    spec = _spec("tinyllama", type_="preference", max_seq_len=4096)
    pt = pin_and_load(spec, tmp_path)
    raw = read_records(shared_path("datasets/preference/hh_rlhf_harmless_base_test.jsonl.gz"))
    contents = [extract_preference(v, spec.input) for v in raw]
    invalid = [c for c in contents if not isinstance(c, dict)]
    assert {c.reason for c in invalid} <= {"identical_branches"}
    contents = [c for c in contents if isinstance(c, dict)]
    assert contents[0]["prompt"][-1]["role"] == "user" and contents[0]["chosen"][0]["role"] == "assistant"
    tb = tokenize_batch(contents, spec, pt)
    assert tb.branches[0::2] == ["chosen"] * (len(tb.kept) // 2) and tb.branches[1::2] == ["rejected"] * (
        len(tb.kept) // 2
    )
    assert (tb.kept[0::2] == tb.kept[1::2]).all()
    examples = batch_examples(tb)
    same_prefix = 0
    for (c_ids, c_mask, _), (r_ids, r_mask, _) in zip(examples[0::2], examples[1::2], strict=True):
        c_first, r_first = int(np.argmax(c_mask)), int(np.argmax(r_mask))
        same_prefix += c_ids[:c_first].tolist() == r_ids[:r_first].tolist()
        assert len(c_ids) + len(r_ids) <= 4096  # a pair fits one packed row
    print(
        f"\nHH preference: {len(raw)} records, {len(invalid)} identical, {len(tb.kept) // 2} pairs kept, "
        f"{len(tb.rejects)} rejected; masked prefix identical in {same_prefix}"
    )
    assert same_prefix == len(tb.kept) // 2
    assert len(tb.kept) // 2 + len(tb.rejects) == len(contents)


def test_preference_layers_keep_pairs_in_one_row_and_split(tmp_path: Path):
    """HH through bronze -> silver -> gold -> shards: pair gates pass, every pair shares a row, so a row group."""
    from prep_assets.core import invariants as inv
    from prep_assets.core.gates import layout

    src = shared_path("datasets/preference/hh_rlhf_harmless_base_test.jsonl.gz")
    spec = make_spec(
        "hh",
        input={"type": "preference"},
        tokenizer={"path": str(shared_path("tokenizers/tinyllama"))},
        sequence={"max_seq_len": 2048, "overflow": "truncate_left"},
        split={"validation_ratio": 0.1},
        packing={"max_sequences_per_example": 6},
    )
    _, r = run_one_file(tmp_path, spec, src)
    b, s, g, sh = r["dirs"]
    files = inv.shard_files(sh)
    outcomes = [
        inv.silver_accounted(s, b),
        inv.gold_accounted(g, s),
        inv.gold_mask_aligned(g),
        inv.gold_loss_tokens(g),
        inv.gold_within_max_len(g, 2048),
        inv.gold_pairs_complete(g),
        inv.shards_pairs_together(files, g),
        inv.shards_tokens_conserved(files, g, layout(spec)),
        inv.shards_match_gold(files, g),
        inv.shards_positions_restart(files),
    ]
    assert [o.name for o in outcomes if not o.passed] == []
    pairs = r["gold"].examples // 2
    print(
        f"\nHH layers: {r['bronze'].records} records, {pairs} pairs in gold, silver rejects "
        f"{r['silver'].rejects_by_reason}, gold rejects {r['gold'].rejects_by_reason}, "
        f"{r['shards'].totals['sequences']} rows, utilization {r['shards'].totals['sequence_utilization']}"
    )
    assert pairs + r["gold"].rejects == r["silver"].records and pairs > 2000
    # corrupt: swap the last example of the first two rows; both pairs are now split across rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(files[0])
    ids = table.column("example_ids").to_pylist()
    ids[0][-1], ids[1][-1] = ids[1][-1], ids[0][-1]
    table = table.set_column(
        table.schema.get_field_index("example_ids"), "example_ids", pa.array(ids, pa.list_(pa.string()))
    )
    pq.write_table(table, files[0])
    broken = inv.shards_pairs_together(files, g)
    assert broken.violations == 2 and {o["pair_id"] for o in broken.offending} == {
        i.rsplit("/", 1)[0] for i in (ids[0][-1], ids[1][-1])
    }


def test_chat_dataset_without_a_template_fails_at_the_tokenizer_with_the_remedy(tmp_path: Path):
    from prep_assets.core.errors import TokenizerError
    from prep_assets.core.gold import build_tokenizer
    from prep_assets.core.lake import dataset_paths

    spec = make_spec("c", input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2"))})
    paths = dataset_paths(tmp_path, "c")
    with pytest.raises(TokenizerError, match="chat_template_file"):
        build_tokenizer(spec, paths, tmp_path)
    assert not paths.tokenizer_dir.exists()  # nothing published


def test_inline_chat_template_from_the_spec_is_pinned_and_used(tmp_path: Path):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    spec = make_spec(
        input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": template}
    )
    pt = pin_and_load(spec, tmp_path)
    assert (tmp_path / "tok" / "chat_template.jinja").read_text() == template
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]}
    ((ids, mask, types),) = batch_examples(tokenize_batch([conv], spec, pt))
    assert pt.hf.decode(ids.tolist()) == "<user>q</user>\n<assistant>a b</assistant>\n"
    assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == ["a b</assistant>"]
    assert types[mask == 1].tolist()[-1] == TYPE_EOS


def test_dialogue_instruction_every_completion_trained_every_prompt_masked(tmp_path: Path):
    from prep_assets.core.records import extract_instruction

    spec = make_spec(
        input={"type": "instruction", "prompt_postfix": "\n"},
        tokenizer={"path": str(shared_path("tokenizers/gpt2"))},
        sequence={"max_seq_len": 4096},
    )
    pt = pin_and_load(spec, tmp_path)
    contents = [
        extract_instruction(v, spec.input) for v in read_records(shared_path("datasets/dialogue/gdp_dialogue.jsonl"))
    ]
    tb = tokenize_batch(contents, spec, pt)
    assert tb.rejects == [] and len(tb.kept) == 42
    for rec, (ids, mask, _) in zip(tb.kept.tolist(), batch_examples(tb), strict=True):
        turns = contents[rec]["turns"]
        assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == [
            t["completion"] + "<|endoftext|>" for t in turns
        ]
        assert pt.hf.decode(ids[mask == 0].tolist()) == "".join(t["prompt"] + "\n" for t in turns)


def test_whitespace_only_and_empty_contents_render_exactly(tmp_path: Path):
    spec = _spec("gpt2", clean={"normalize": False})
    pt = pin_and_load(spec, tmp_path)
    conv = {
        "messages": [
            {"role": "user", "content": "   "},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": " q \n"},
            {"role": "assistant", "content": "  a  "},
        ]
    }
    tb = tokenize_batch([conv], spec, pt)
    ((ids, mask, _),) = batch_examples(tb)
    assert pt.hf.decode(ids.tolist()) == ChatTemplate(pt).render(conv["messages"])
    assert [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)] == ["<|im_end|>", "  a  <|im_end|>"]


def test_turn_starts_after_the_generation_prompt_whatever_the_contents_whitespace(tmp_path: Path):
    """Mistral writes ' ' + trimmed answer: the space is generated, so trained, with or without a leading space
    in the content; a template's own blank line before a trimmed content stays masked (Llama-3 style)."""
    mistral = _spec("mistral7b")
    pt = pin_and_load(mistral, tmp_path / "m")
    convs = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": c}]} for c in ("42", " 42")
    ]
    runs = [
        [ids[a:b].tolist() for a, b in mask_runs(mask)]
        for ids, mask, _ in batch_examples(tokenize_batch(convs, mistral, pt))
    ]
    assert runs[0] == runs[1] and pt.hf.convert_ids_to_tokens(runs[0][0])[0] == "▁"
    llama3_like = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n\n{{ m.content | trim }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n\n{% endif %}"
    )
    spec = make_spec(
        input={"type": "chat"},
        tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": llama3_like},
        clean={"normalize": False},
    )
    pt = pin_and_load(spec, tmp_path / "l")
    convs = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": c}]}
        for c in ("Hello", "\n\nHello")
    ]
    decoded = [
        [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)]
        for ids, mask, _ in batch_examples(tokenize_batch(convs, spec, pt))
    ]
    assert decoded == [["Hello<|im_end|>"], ["Hello<|im_end|>"]]


def test_special_token_strings_in_tool_definitions_reject_the_record(tmp_path: Path):
    spec = _spec("gpt2")
    pt = pin_and_load(spec, tmp_path)
    tools = [{"type": "function", "function": {"name": "f", "description": "stop <|endoftext|> here"}}]
    conv = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": tools}
    tb = tokenize_batch([conv], spec, pt)
    assert len(tb.kept) == 0 and tb.rejects[0][1] == "special_token_in_tools"


def _pair_case(tmp_path: Path, policy: str, prompt: str, chosen: str, rejected: str, max_seq_len: int = 64):
    spec = _spec("gpt2", type_="preference", max_seq_len=max_seq_len, sequence={"overflow": policy})
    pt = pin_and_load(spec, tmp_path / policy)
    content = extract_preference({"prompt": prompt, "chosen": chosen, "rejected": rejected}, spec.input)
    return tokenize_batch([content], spec, pt), pt


@pytest.mark.parametrize("policy", ["truncate_left", "truncate_right", "drop"])
def test_lopsided_pair_fits_or_is_rejected_never_crashes_or_cuts_into_responses(policy: str, tmp_path: Path):
    tb, _ = _pair_case(tmp_path, policy, "hi there", "ok", "word " * 80)
    if tb.rejects:
        assert len(tb.kept) == 0 and tb.rejects[0][1] in ("too_long", "no_trained_tokens")
    else:
        lengths = np.diff(tb.offsets)
        assert lengths.sum() <= 64 and len(tb.kept) == 2
        (c, cm, _), (r, rm, _) = batch_examples(tb)
        n = int(tb.shared_prefix[0])
        assert c[:n].tolist() == r[:n].tolist() and cm[:n].sum() == rm[:n].sum() == 0 and cm.sum() and rm.sum()
    # a long shared prompt: truncate_left cuts it identically in both branches and keeps the pair
    tb, pt = _pair_case(tmp_path / "long", policy, "context " * 40, "yes", "no")
    if policy == "drop":
        assert tb.rejects[0][1] == "too_long"
    elif policy == "truncate_right":  # both halves end inside the prompt: nothing trainable, rejected whole
        assert len(tb.kept) == 0 and tb.rejects[0][1] == "no_trained_tokens"
    else:
        (c, cm, _), (r, rm, _) = batch_examples(tb)
        n = int(tb.shared_prefix[0])
        assert len(c) + len(r) <= 64 and c[:n].tolist() == r[:n].tolist() and cm[:n].sum() == rm[:n].sum() == 0
        if policy == "truncate_left":
            # each response and its end-of-turn survive
            assert [pt.hf.decode(c[cm == 1].tolist()), pt.hf.decode(r[rm == 1].tolist())] == [
                "yes<|im_end|>",
                "no<|im_end|>",
            ]


def test_pair_whose_branches_start_with_a_user_turn_passes_the_pair_gate(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prep_assets.core import invariants as inv

    spec = _spec("gpt2", type_="preference")
    pt = pin_and_load(spec, tmp_path)
    u, a = (lambda t: {"role": "user", "content": t}), (lambda t: {"role": "assistant", "content": t})
    # extraction rejects such branches (`inconsistent_prompt`); the gate judges gold as written, whatever made it
    content = {"prompt": [u("hi"), a("hello")], "chosen": [u("a joke?"), a("ha")], "rejected": [u("be rude"), a("no")]}
    tb = tokenize_batch([content], spec, pt)
    ex = batch_examples(tb)
    rows = [
        {
            "pair_id": "p",
            "branch": b,
            "split": "train",
            "source_file": "f",
            "source_line": 1,
            "token_ids": ids.tolist(),
            "loss_mask": m.tolist(),
            "shared_prefix_tokens": int(n),
        }
        for b, (ids, m, _), n in zip(tb.branches, ex, tb.shared_prefix, strict=True)
    ]
    (tmp_path / "g").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g" / "examples.parquet")
    assert inv.gold_pairs_complete(tmp_path / "g").passed
    rows[1]["token_ids"][1] += 1  # a different prompt token in one branch
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g" / "examples.parquet")
    assert not inv.gold_pairs_complete(tmp_path / "g").passed


def test_preference_extraction_edge_cases_never_mistrain(tmp_path: Path):
    from prep_assets.core.clean import quality_verdict
    from prep_assets.core.spec_sections import CleanSpec

    spec = make_spec(input={"type": "preference"})
    u, a = (lambda t: {"role": "user", "content": t}), (lambda t: {"role": "assistant", "content": t})
    # UltraFeedback layout: the prompt is given and repeated at the start of both branches
    repeated = extract_preference(
        {"prompt": "q", "chosen": [u("q"), a("good")], "rejected": [u("q"), a("bad")]}, spec.input
    )
    assert repeated == {"prompt": [u("q")], "chosen": [a("good")], "rejected": [a("bad")]}
    # text before the first HH turn would be trained as the assistant's: rejected instead
    bad = extract_preference({"chosen": "Intro\n\nHuman: q\n\nAssistant: a", "rejected": "x"}, spec.input)
    assert bad.reason == "malformed_transcript"
    single_newline = extract_preference(
        {"chosen": "\nHuman: q\n\nAssistant: a", "rejected": "\nHuman: q\n\nAssistant: b"}, spec.input
    )
    assert single_newline["prompt"] == [u("q")] and single_newline["chosen"] == [a("a")]
    # a plain answer that starts like a turn keeps its text
    plain = extract_preference({"prompt": "q", "chosen": "Assistant: yes", "rejected": "no"}, spec.input)
    assert plain["chosen"] == [a("Assistant: yes")]
    # branches identical once normalized go to the silver rejects
    same = {"prompt": [u("q")], "chosen": [a("yes")], "rejected": [a("yes")]}
    assert quality_verdict(same, CleanSpec()).reason == "identical_branches"


def test_preference_needs_two_sequences_per_row():
    from prep_assets.core.errors import SpecError

    with pytest.raises(SpecError, match="at least 2 for preference"):
        make_spec(input={"type": "preference"}, packing={"max_sequences_per_example": 1})


def _u(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _a(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_template_without_tools_rejects_tool_records_chat_template_dropped_tools(tmp_path: Path):
    """TinyLlama's template has no tools section: a glaive record with tools would train function calls to tools the
    model never saw; rejected naming the remedy. The same records with GPT-2 + ChatML (which lists tools) are kept."""
    contents = {}
    for tok in ("tinyllama", "gpt2"):
        spec = _spec(tok)
        pt = pin_and_load(spec, tmp_path / tok)
        contents[tok] = [extract_chat(v, spec.input) for v in read_records(shared_path(f"datasets/{DATASETS[0]}"))]
        tb = tokenize_batch(contents[tok], spec, pt)
        with_tools = {i for i, c in enumerate(contents[tok]) if c.get("tools")}
        if tok == "gpt2":
            assert tb.rejects == [] and len(tb.kept) == len(contents[tok])
            continue
        assert len(with_tools) == 191
        assert {r[0] for r in tb.rejects} == with_tools
        assert {r[1] for r in tb.rejects} == {"chat_template_dropped_tools"}
        assert all("tokenizer.chat_template_file" in r[2] and "ignores `tools`" in r[2] for r in tb.rejects)
        assert set(tb.kept.tolist()) == set(range(len(contents[tok]))) - with_tools


def test_reject_hints_name_the_cause_mistral_system_prompt_is_not_an_unsupported_role(tmp_path: Path):
    mistral = _spec("mistral7b")
    tb = tokenize_batch(
        [{"messages": [{"role": "system", "content": "be brief"}, _u("q"), _a("a")]}],
        mistral,
        pin_and_load(mistral, tmp_path / "m"),
    )
    ((_, reason, detail, _),) = tb.rejects
    assert reason == "chat_template_dropped_message" and "system prompt" in detail and "Mistral" in detail
    assert "role_map" not in detail and "input.system_key" in detail
    tiny = _spec("tinyllama", input={"role_map": {}})
    tb = tokenize_batch(
        [{"messages": [_u("q"), {"role": "tool", "content": "r"}, _a("a")]}], tiny, pin_and_load(tiny, tmp_path / "t")
    )
    ((_, reason, detail, _),) = tb.rejects
    assert reason == "chat_template_dropped_message" and "no `tool` role" in detail and "input.role_map" in detail
    conv = {"messages": [{"role": "system", "content": "s"}, _u("q"), _a("a")]}
    for template, cause in (
        ("{% for m in messages[1:] %}{{ m.content }}|{% endfor %}{{ messages[0].content }}", "moved out of order"),
        ("{% for m in messages %}{{ m.content }}|{% endfor %}{{ messages[1].content }}", "rendered 2 times"),
        ("{% for m in messages if m.role in ['user', 'assistant'] %}{{ m.content }}|{% endfor %}", "no `system` role"),
    ):
        spec = make_spec(
            input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": template}
        )
        tb = tokenize_batch([conv], spec, pin_and_load(spec, tmp_path / cause[:5]))
        ((_, reason, detail, _),) = tb.rejects
        assert reason == "chat_template_dropped_message" and cause in detail and "chat_template_file" in detail
    skips_empty = "{% for m in messages if m.content %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    spec = make_spec(
        input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": skips_empty}
    )
    tb = tokenize_batch([{"messages": [_u(""), _a("a")]}], spec, pin_and_load(spec, tmp_path / "empty"))
    ((_, reason, detail, _),) = tb.rejects
    assert reason == "chat_template_mismatch" and "messages [1] are empty" in detail


def test_assistant_content_starting_with_newlines_trains_no_template_newline(tmp_path: Path):
    """GPT-2 + ChatML: the tokenizer alone merges the header's newline with the content's ("\\n\\n"), so the
    generation prompt would not be a token prefix and a template newline would train; the encoding is cut at the
    turn's start (and end) instead, and the example counted."""
    spec = _spec("gpt2")
    pt = pin_and_load(spec, tmp_path)
    chat = ChatTemplate(pt)
    conv = [_u("q"), _a("\n\nHello")]
    tb = tokenize_batch([{"messages": conv}], spec, pt, chat)
    ((ids, mask, _),) = batch_examples(tb)
    prompt = chat.render(conv[:1], add_generation_prompt=True)
    enc = lambda text: pt.hf(text, add_special_tokens=False)["input_ids"]
    assert prompt.endswith("<|im_start|>assistant\n")
    assert ids.tolist() == enc(prompt) + enc("\n\nHello<|im_end|>") + enc("\n")
    assert ids.tolist() != enc(chat.render(conv))  # what the tokenizer alone gives
    assert mask.tolist() == [0] * len(enc(prompt)) + [1] * len(enc("\n\nHello<|im_end|>")) + [0]
    assert tb.split_at_turn_boundary == 1
    plain = tokenize_batch([{"messages": [_u("q"), _a("Hello")]}], spec, pt, chat)
    assert plain.split_at_turn_boundary == 0


def test_template_with_a_runaway_loop_is_rejected_at_the_time_limit(tmp_path: Path):
    from prep_assets.core.chat import ChatTemplate as CT

    hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
    huge = "{{ 'x' * 5000000 }}{% for m in messages %}{{ m.content }}{% endfor %}"  # fast, but 5 MB
    conv = {"messages": [_u("q"), _a("a")]}
    for template, limit, seconds in ((hang, "time limit exceeded", 0.3), (huge, "size limit", 5.0)):
        spec = make_spec(
            input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": template}
        )
        pt = pin_and_load(spec, tmp_path / limit[:4])
        tb = tokenize_batch([conv], spec, pt, CT(pt, render_seconds=seconds))
        ((_, reason, detail, _),) = tb.rejects
        assert reason == "chat_template_error" and limit in detail, detail
    # the same template object renders a sane template afterwards, and nothing fires after a stopped render
    ok = make_spec(
        input={"type": "chat"},
        tokenizer={
            "path": str(shared_path("tokenizers/gpt2")),
            "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
        },
    )
    chat = CT(pin_and_load(ok, tmp_path / "ok"), render_seconds=0.3)
    assert chat.render(conv["messages"]) == "qa"


def test_render_guard_never_leaves_an_injected_exception_behind():
    """Deadlines as short as the renders themselves, so injections race the renders' ends; afterwards no
    exception may surface in the thread."""
    from prep_assets.core.render_guard import RenderGuard, RenderTimeout

    guard = RenderGuard(0.002)

    def busy() -> str:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return "done"

    outcomes = Counter()
    for _ in range(300):
        try:
            outcomes[guard.run(busy)] += 1
        except RenderTimeout:
            outcomes["stopped"] += 1
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # a leftover injection would be raised here
        pass
    assert sum(outcomes.values()) == 300 and set(outcomes) <= {"done", "stopped"}, outcomes

    def long_busy() -> str:  # the races above may all end "done" on a loaded machine; this one cannot
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            pass
        return "done"

    with pytest.raises(RenderTimeout):
        guard.run(long_busy)


def test_template_that_hangs_on_every_record_stops_gold_with_the_remedy(tmp_path: Path):
    """A template at the time limit on record after record is the template's fault: a fatal error after a few
    records instead of hours of rejects."""
    from prep_assets.core.chat import TIME_LIMITS_IN_A_ROW
    from prep_assets.core.chat import ChatTemplate as CT
    from prep_assets.core.errors import TokenizerError

    hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    spec = make_spec(
        input={"type": "chat"}, tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template": hang}
    )
    pt = pin_and_load(spec, tmp_path)
    convs = [{"messages": [_u(f"q{i}"), _a("a")]} for i in range(TIME_LIMITS_IN_A_ROW + 3)]
    with pytest.raises(TokenizerError, match="in a row .time limit exceeded.; fix its loops"):
        tokenize_batch(convs, spec, pt, CT(pt, render_seconds=0.1))


def test_gold_counts_examples_split_at_a_turn_boundary(tmp_path: Path):
    """Through bronze -> silver -> gold: the examples whose ids differ from tokenizer(rendering) are counted."""
    raw = tmp_path / "raw" / "c"
    raw.mkdir(parents=True)
    records = [
        {"messages": [_u(f"question {i}"), _a(("\n\n" if i % 3 == 0 else "") + f"answer number {i}")]}
        for i in range(12)
    ]
    (raw / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    spec = make_spec(
        "c",
        input={"type": "chat"},
        clean={"normalize": False, "min_chars": 1},
        tokenizer={"path": str(shared_path("tokenizers/gpt2")), "chat_template_file": str(CHATML)},
    )
    gold = next(iter(run_core(tmp_path, spec).values()))["gold"]
    assert gold.examples == 12 and gold.examples_split_at_turn_boundary == 4
