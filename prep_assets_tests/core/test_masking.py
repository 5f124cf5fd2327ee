from pathlib import Path

import numpy as np
import pytest

from prep_assets.core.masking import apply_overflow, tokenize_batch
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT
from prep_assets.core.spec_sections import TokenizerSpec
from prep_assets.core.tokenizer import PinnedTokenizer, load_pinned, pin_tokenizer
from prep_assets_tests.conftest import make_spec, shared_path


@pytest.fixture
def gpt2(gpt2_dir: Path, tmp_path: Path) -> PinnedTokenizer:
    dest = tmp_path / "tok"
    dest.mkdir()
    pin_tokenizer(TokenizerSpec(path=str(gpt2_dir)), base=tmp_path, dest=dest)
    return load_pinned(dest)


def _examples(tb):
    return [
        (tb.token_ids[a:b], tb.loss_mask[a:b], tb.token_type_ids[a:b]) for a, b in zip(tb.offsets[:-1], tb.offsets[1:])
    ]


def test_instruction_masks_prompt_trains_completion_and_eos(gpt2: PinnedTokenizer):
    spec = make_spec(input={"type": "instruction", "prompt_postfix": "\n"}, sequence={"max_seq_len": 64})
    turns = [{"prompt": "What is 2+2?", "completion": " It is 4."}, {"prompt": "And 3+3?", "completion": " 6."}]
    tb = tokenize_batch([{"turns": turns}], spec, gpt2)
    ((ids, mask, types),) = _examples(tb)
    dec = gpt2.hf.decode
    assert dec(ids.tolist()) == "What is 2+2?\n It is 4.<|endoftext|>And 3+3?\n 6.<|endoftext|>"
    assert dec(ids[mask == 1].tolist()) == " It is 4.<|endoftext|> 6.<|endoftext|>"
    assert dec(ids[types == TYPE_PROMPT].tolist()) == "What is 2+2?\nAnd 3+3?\n"
    assert (ids[types == TYPE_EOS] == gpt2.info.eos_id).all() and (mask[types == TYPE_EOS] == 1).all()
    assert set(np.unique(types)) == {TYPE_PROMPT, TYPE_COMPLETION, TYPE_EOS}
    assert mask[0] == 0


def test_text_trains_everything_but_the_first_token(gpt2: PinnedTokenizer):
    spec = make_spec(sequence={"max_seq_len": 64})
    tb = tokenize_batch([{"text": "Hello world, again."}], spec, gpt2)
    ((ids, mask, types),) = _examples(tb)
    assert mask.tolist() == [0] + [1] * (len(ids) - 1)
    assert ids[-1] == gpt2.info.eos_id and types[-1] == TYPE_EOS


def test_special_token_strings_in_content_are_plain_text(gpt2: PinnedTokenizer):
    spec = make_spec(sequence={"max_seq_len": 64})
    tb = tokenize_batch([{"text": "a <|endoftext|> b"}], spec, gpt2)
    ((ids, _, _),) = _examples(tb)
    assert (ids[:-1] != gpt2.info.eos_id).all()  # only the appended EOS is the special id
    assert gpt2.hf.decode(ids[:-1].tolist()) == "a <|endoftext|> b"


def test_overflow_drop_rejects_with_reason_and_counts_tokens(gpt2: PinnedTokenizer):
    spec = make_spec(sequence={"max_seq_len": 8, "overflow": "drop"})
    tb = tokenize_batch([{"text": "one two"}, {"text": " word" * 20}], spec, gpt2)
    assert tb.kept.tolist() == [0]
    assert tb.rejects[0][:2] == (1, "too_long") and tb.tokens_dropped == 21


def test_overflow_truncate_right_and_left(gpt2: PinnedTokenizer):
    text = {"text": "".join(f" w{i}" for i in range(20))}
    right = tokenize_batch([text], make_spec(sequence={"max_seq_len": 8, "overflow": "truncate_right"}), gpt2)
    left = tokenize_batch([text], make_spec(sequence={"max_seq_len": 8, "overflow": "truncate_left"}), gpt2)
    ((r_ids, r_mask, _),) = _examples(right)
    ((l_ids, l_mask, _),) = _examples(left)
    assert len(r_ids) == len(l_ids) == 8 and r_mask[0] == 0 and l_mask[0] == 0
    assert gpt2.hf.decode(r_ids.tolist()).startswith(" w0")
    assert l_ids[-1] == gpt2.info.eos_id


def test_truncation_leaving_no_trained_token_is_rejected(gpt2: PinnedTokenizer):
    spec = make_spec(input={"type": "instruction"}, sequence={"max_seq_len": 8, "overflow": "truncate_right"})
    tb = tokenize_batch([{"turns": [{"prompt": " long" * 30, "completion": " yes"}]}], spec, gpt2)
    assert len(tb.kept) == 0 and tb.rejects[0][1] == "no_trained_tokens"


def test_exactly_max_seq_len_is_kept_and_one_over_is_not(gpt2: PinnedTokenizer):
    text = " a" * 7
    assert len(gpt2.encode_batch([text])[0]) == 7  # + EOS = 8 tokens
    exact = tokenize_batch([{"text": text}], make_spec(sequence={"max_seq_len": 8, "overflow": "drop"}), gpt2)
    over = tokenize_batch([{"text": text + " a"}], make_spec(sequence={"max_seq_len": 8, "overflow": "drop"}), gpt2)
    assert exact.kept.tolist() == [0] and exact.tokens_dropped == 0
    assert over.rejects[0][1] == "too_long" and over.rejects[0][3] == 9


@pytest.mark.parametrize("name", ["tinyllama", "mistral7b", "gpt2"])
def test_instruction_tokens_equal_encoding_the_joined_text(name: str, tmp_path: Path):
    """No word-start marker at prompt/completion boundaries (SentencePiece `Prepend`/Metaspace)."""
    src = shared_path(f"tokenizers/{name}")
    pin_tokenizer(TokenizerSpec(path=str(src)), base=tmp_path, dest=tmp_path)
    pt = load_pinned(tmp_path)
    # byte-level BPE encodes starts like continuations (one encode call); SentencePiece needs the second encoder
    assert (pt.continuation is pt.encoder) == (name == "gpt2")
    spec = make_spec(input={"type": "instruction", "prompt_postfix": "\n"}, sequence={"max_seq_len": 128})
    turns = [{"prompt": "What is 2+2?", "completion": "4 is the answer."}, {"prompt": "And 3+3?", "completion": "6."}]
    ids = tokenize_batch([{"turns": turns}], spec, pt).token_ids.tolist()
    eos = pt.hf.eos_token
    ref = pt.hf(f"What is 2+2?\n4 is the answer.{eos}And 3+3?\n6.{eos}", add_special_tokens=True)["input_ids"]
    assert ids == ref  # the tokenizer's own call adds BOS exactly when our add_bos says so
    if pt.info.add_bos:
        assert ids[0] == pt.info.bos_id and ids.count(pt.info.bos_id) == 1


def test_truncate_left_keeps_exactly_one_bos(tmp_path: Path):
    pin_tokenizer(TokenizerSpec(path=str(shared_path("tokenizers/tinyllama"))), base=tmp_path, dest=tmp_path)
    pt = load_pinned(tmp_path)
    spec = make_spec(sequence={"max_seq_len": 8, "overflow": "truncate_left"})
    tb = tokenize_batch([{"text": " ".join(f"w{i}" for i in range(30))}], spec, pt)
    ((ids, mask, _),) = _examples(tb)
    assert len(ids) == 8 and ids[0] == pt.info.bos_id and ids.tolist().count(pt.info.bos_id) == 1
    assert ids[-1] == pt.info.eos_id and mask[0] == 0 and mask[1:].all()


def test_trainable_types_follow_the_mask_spec():
    from prep_assets.core.masking import trainable_types

    assert trainable_types(make_spec(input={"type": "instruction"})) == (TYPE_COMPLETION, TYPE_EOS)
    assert trainable_types(make_spec(input={"type": "instruction"}, mask={"prompt": "train"})) == (
        TYPE_PROMPT,
        TYPE_COMPLETION,
        TYPE_EOS,
    )
    assert trainable_types(make_spec()) == (TYPE_COMPLETION, TYPE_EOS)


@pytest.mark.parametrize("name", ["gpt2", "tinyllama"])
def test_pipelined_batches_equal_one_batch_at_a_time_in_order(name: str, tmp_path: Path):
    """tokenize_batches encodes batch k+1 on a worker thread while batch k is assembled: same results, same order,
    with one encoder (gpt2) and with separate start/continuation encoders (tinyllama)."""
    from prep_assets.core.masking import tokenize_batches

    pin_tokenizer(TokenizerSpec(path=str(shared_path(f"tokenizers/{name}"))), base=tmp_path, dest=tmp_path)
    pt = load_pinned(tmp_path)
    spec = make_spec(input={"type": "instruction"}, sequence={"max_seq_len": 24, "overflow": "drop"})
    batches = [
        [
            {"turns": [{"prompt": f"q{b}.{i} " * (i % 5 + 1), "completion": f"a{b}.{i} " * (i % 7 + 1)}]}
            for i in range(b * 3 + 1)
        ]
        for b in range(6)
    ]
    piped = list(tokenize_batches(((b, c) for b, c in enumerate(batches)), spec, pt))
    assert [k for k, _ in piped] == list(range(6))
    for (_, got), contents in zip(piped, batches, strict=True):
        want = tokenize_batch(contents, spec, pt)
        assert got.kept.tolist() == want.kept.tolist() and got.rejects == want.rejects
        for a, b in zip(_examples(got), _examples(want), strict=True):
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(tb.rejects for _, tb in piped)  # overflow rejects go through the pipeline too


def _overflow_reference(ids, mask, types, lengths, policy, max_len, head):
    """apply_overflow one example at a time, as the rules read: (kept examples, reject reasons by index)."""
    kept, reasons, start = [], {}, 0
    for i, n in enumerate(lengths.tolist()):
        e = [a[start : start + n] for a in (ids, mask, types)]
        start += n
        if n > max_len and policy == "drop":
            reasons[i] = "too_long"
            continue
        if n > max_len and policy == "truncate_right":
            e = [a[:max_len] for a in e]
        if n > max_len and policy == "truncate_left":
            e = [np.concatenate([a[:head], a[n - (max_len - head) :]]) for a in e]
        e[1] = e[1].copy()
        e[1][:1] = 0
        if e[1].sum() == 0:
            reasons[i] = "no_trained_tokens"
            continue
        kept.append((i, *e))
    return kept, reasons


@pytest.mark.parametrize("policy", ["keep", "drop", "truncate_right", "truncate_left"])
def test_overflow_equals_the_rules_applied_one_example_at_a_time_with_or_without_cuts_and_rejects(policy: str):
    rng = np.random.default_rng(3)
    for trial in range(300):
        lengths = rng.integers(1, 12, size=rng.integers(1, 9))
        total = int(lengths.sum())
        ids = rng.integers(0, 50_000, size=total).astype(np.int32)
        mask = (rng.random(total) < (0.1 if trial % 3 else 0.8)).astype(
            np.uint8
        )  # some examples lose every loss token
        types = rng.integers(0, 4, size=total).astype(np.uint8)
        max_len = int(rng.integers(2, 14))  # sometimes nothing is over, sometimes much
        tb = apply_overflow(ids, mask, types, lengths, policy=policy, max_len=max_len, head=1)
        kept, reasons = _overflow_reference(ids, mask, types, lengths, policy, max_len, 1)
        assert tb.kept.tolist() == [k[0] for k in kept]
        assert {r[0]: r[1] for r in tb.rejects} == reasons
        got = _examples(tb)
        assert len(got) == len(kept)
        for (_, *want), have in zip(kept, got):
            for w, h in zip(want, have):
                assert w.tolist() == h.tolist()
