"""The generation-prompt prefix property on every shipped and shared chat set, with every tokenizer that renders them.

For every trained assistant turn of every kept example, the ids of the history rendered with
add_generation_prompt=True must be a prefix of the example's ids, and the trained tokens must be exactly the
turn's content and end-of-turn text. Also on generated records whose assistant contents start or end with
whitespace. Figures are printed (run with -s).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prep_assets.core.chat import ChatTemplate
from prep_assets.core.masking import chat_examples, tokenize_batch
from prep_assets.core.records import Invalid, extract_chat, extract_preference
from prep_assets_tests.conftest import PROJECT, make_spec, shared_path
from prep_assets_tests.core.helpers import mask_runs, pin_and_load, read_records

CHATML = PROJECT / "data" / "templates" / "chatml.jinja"
EOT = {"gpt2": "<|im_end|>", "tinyllama": "</s>", "mistral7b": "</s>"}
WHITESPACE = ("\n", " ", "\n\n", "\t")


def _with_whitespace(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record once per whitespace and edge: every assistant content starting, ending or both with it."""
    out = []
    for ws in WHITESPACE:
        for lead, trail in ((ws, ""), ("", ws), (ws, ws)):
            for v in values:
                turns = [
                    {**t, "value": lead + t["value"] + trail} if t["from"] == "gpt" else t for t in v["conversations"]
                ]
                out.append({**v, "conversations": turns})
    return out


def _shared(rel: str) -> list[Any]:
    return read_records(shared_path(f"datasets/{rel}"))


def _shipped(rel: str) -> list[Any]:
    return read_records(PROJECT / "data" / "raw" / rel)


SETS: dict[str, tuple[str, Any]] = {
    "shared chat/glaive_toolcall_en_demo": ("chat", lambda: _shared("chat/glaive_toolcall_en_demo.json")),
    "shared chat/fastchat_dummy_conversation": ("chat", lambda: _shared("chat/fastchat_dummy_conversation.json")),
    "shared chat/gdp_apply_chat_template": ("chat", lambda: _shared("chat/gdp_apply_chat_template.jsonl")),
    "shared dialogue/gdp_dialogue": ("chat", lambda: _shared("dialogue/gdp_dialogue.jsonl")),
    "shared preference/hh_rlhf_harmless_base_test": (
        "preference",
        lambda: _shared("preference/hh_rlhf_harmless_base_test.jsonl.gz"),
    ),
    "shipped sample_chat": ("chat", lambda: _shipped("sample_chat/conversations_2026-11-03.jsonl")),
    "shipped sample_pref": ("preference", lambda: _shipped("sample_pref/answer_pairs_2026-11-04.jsonl")),
    "generated whitespace-edged contents": (
        "chat",
        lambda: _with_whitespace(_shared("chat/fastchat_dummy_conversation.json")[:25]),
    ),
}


def _check(tok: str, name: str, tmp_path: Path) -> dict[str, Any]:
    type_, load = SETS[name]
    tokenizer: dict[str, Any] = {"path": str(shared_path(f"tokenizers/{tok}"))}
    if tok == "gpt2":
        tokenizer["chat_template_file"] = str(CHATML)
    role_map = {} if tok == "gpt2" else {"observation": "user", "tool": "user"}  # no tool role / call ids needed
    spec = make_spec(
        input={"type": type_, "role_map": role_map},
        tokenizer=tokenizer,
        sequence={"max_seq_len": 1 << 20},
        clean={"normalize": False},
    )
    pt = pin_and_load(spec, tmp_path)
    chat = ChatTemplate(pt)
    extract = extract_chat if type_ == "chat" else extract_preference
    contents = [c for c in (extract(v, spec.input) for v in load()) if not isinstance(c, Invalid)]
    tb = tokenize_batch(contents, spec, pt, chat)
    f = Counter(records=len(contents), kept_records=len(set(tb.kept.tolist())), split=tb.split_at_turn_boundary)
    f.update(Counter(r[1] for r in tb.rejects))
    examples = {}
    for k, rec in enumerate(tb.kept.tolist()):
        branch = tb.branches[k] if tb.branches else None
        examples[k] = next((m, fl) for b, m, fl in chat_examples(contents[rec], spec) if b == branch)
    enc = lambda text: pt.hf(text, add_special_tokens=False)["input_ids"]
    for k, rec in enumerate(tb.kept.tolist()):
        ids = tb.token_ids[tb.offsets[k] : tb.offsets[k + 1]]
        mask = tb.loss_mask[tb.offsets[k] : tb.offsets[k + 1]]
        msgs, flags = examples[k]
        tools = contents[rec].get("tools")
        rc = chat.spans(msgs, flags, tools)
        encoded = chat.encode([rc])[0]
        head = [pt.info.bos_id] if len(ids) > len(encoded.token_ids) else []
        for i in (i for i, m in enumerate(msgs) if m["role"] == "assistant" and flags[i] and i > 0):
            prompt = chat.render(msgs[:i], tools, add_generation_prompt=True)
            prompt_ids = head + chat.encode_prefix(rc, len(prompt)).token_ids.tolist()
            f["turns"] += 1
            f["violations"] += int(ids[: len(prompt_ids)].tolist() != prompt_ids or mask[len(prompt_ids) - 1] == 1)
            if not encoded.split:  # the ids are the tokenizer's own: so must the prompt's be
                f["turns_tokenizer_oracle"] += 1
                f["violations_tokenizer_oracle"] += ids[: len(prompt_ids)].tolist() != head + enc(prompt)
        # trained tokens: exactly each trained turn's content and its end-of-turn text, no template text
        trained = [pt.hf.decode(ids[a:b].tolist()) for a, b in mask_runs(mask)]
        wanted = [m["content"] + EOT[tok] for m, fl in zip(msgs, flags, strict=True) if fl]
        if tok == "gpt2":  # byte-level: decoding is exact, whitespace included
            f["trained_text_mismatches"] += trained != wanted
        else:  # SentencePiece decoding drops a leading space; Mistral trims contents
            if tok == "mistral7b":
                wanted = [m["content"].strip() + EOT[tok] for m, fl in zip(msgs, flags, strict=True) if fl]
            f["trained_text_mismatches"] += [t.strip() for t in trained] != [w.strip() for w in wanted]
    return dict(f)


@pytest.mark.parametrize("tok", ["gpt2", "tinyllama", "mistral7b"])
def test_generation_prompt_prefix_property_on_every_chat_set(tok: str, tmp_path: Path):
    total: Counter[str] = Counter()
    for name in SETS:
        figures = _check(tok, name, tmp_path / name.replace("/", "_").replace(" ", "_"))
        print(f"\n{tok} {name}: {figures}")
        total.update(figures)
    print(
        f"\n{tok} total: {total['turns']} trained assistant turns checked, {total['violations']} violations; "
        f"{total['turns_tokenizer_oracle']} against tokenizer(prompt), {total['violations_tokenizer_oracle']} "
        f"violations; {total['split']} examples split at a turn boundary; {total['trained_text_mismatches']} "
        f"trained-text mismatches"
    )
    assert total["turns"] > 1000 and total["violations"] == 0 and total["violations_tokenizer_oracle"] == 0
    assert total["trained_text_mismatches"] == 0 and total["turns_tokenizer_oracle"] > 0
