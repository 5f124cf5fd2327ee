"""A text over LONG_TEXT_CHARS is encoded in pieces: their ids, concatenated, are exactly the ids of the whole text."""

import json
import random

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from prep_assets.core import tokenizer as tk
from prep_assets.core.spec import TokenizerSpec
from prep_assets.core.tokenizer import PinnedTokenizer, continuation_encoder, load_pinned, pin_tokenizer
from prep_assets_tests.conftest import shared_path

TOKENIZERS = ["gpt2", "tinyllama", "mistral7b"]
# words, digits, punctuation, contractions, CRLF, tabs, emoji, combining marks, no-break and ideographic spaces, runs
# of spaces, the space symbols of byte-level BPE and SentencePiece, special-token strings as plain text
_PARTS = [
    "the",
    "Hello",
    "world",
    "naïve",
    "café",
    "日本語",
    "Ελληνικά",
    "😀",
    "👍🏽",
    "3.14159",
    "2024",
    "1,000,000",
    "don't",
    "It's",
    "we'll",
    "'s",
    "<|endoftext|>",
    "<s>",
    "</s>",
    "[INST]",
    "<unk>",
    "\r\n",
    "\n",
    "\n\n",
    "\t",
    "-",
    "--",
    ",",
    ".",
    "!?",
    "(x)",
    "Ġ",
    "▁",
    "▁▁",
    "\u00a0",
    "\u3000",
    "ﬁ",
    "e\u0301",
    " \u0301",
    "  ",
    "    ",
    " " * 40,
]


def mixed_text(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        part = rng.choice(_PARTS) + rng.choice([" ", " ", " ", "", "  ", "\n", " \n", "\r\n "])
        out.append(part)
        size += len(part)
    return "".join(out)


def whole_ids(pt: PinnedTokenizer, text: str, continuation: bool) -> list[int]:
    encoder = pt.continuation if continuation else pt.encoder
    return encoder.encode_batch_fast([text], add_special_tokens=False)[0].ids


@pytest.fixture(scope="module", params=TOKENIZERS)
def pinned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PinnedTokenizer:
    dest = tmp_path_factory.mktemp(request.param)
    pin_tokenizer(TokenizerSpec(path=str(shared_path(f"tokenizers/{request.param}"))), base=dest, dest=dest)
    return load_pinned(dest)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pieces of 2 KiB above 4 KiB: hundreds of cuts in a test-sized text."""
    monkeypatch.setattr(tk, "PIECE_CHARS", 2048)
    monkeypatch.setattr(tk, "LONG_TEXT_CHARS", 4096)
    return 2048


@pytest.mark.parametrize("continuation", [False, True], ids=["start", "continuation"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pieces_of_mixed_text_give_the_ids_of_the_whole_text(
    pinned: PinnedTokenizer, small_pieces: int, seed: int, continuation: bool
):
    text = mixed_text(300_000, seed)
    assert pinned.cutter is not None and len(pinned.cutter.cuts(text, small_pieces)) > 100
    ids = pinned.encode_long(text, continuation=continuation)
    assert ids.dtype == np.int32 and ids.tolist() == whole_ids(pinned, text, continuation)


@pytest.mark.parametrize("name", ["tinyshakespeare.txt", "wiki_demo.txt", "gdp_pretraining.txt", "c4_demo.jsonl"])
def test_pieces_of_the_shared_long_texts_give_the_ids_of_the_whole_text(
    pinned: PinnedTokenizer, name: str, monkeypatch: pytest.MonkeyPatch
):
    raw = shared_path(f"datasets/text/{name}").read_text(encoding="utf-8")
    text = "\n\n".join(json.loads(line)["text"] for line in raw.splitlines()) if name.endswith(".jsonl") else raw
    monkeypatch.setattr(tk, "PIECE_CHARS", 8192)
    assert len(pinned.cutter.cuts(text, 8192)) > 20
    for continuation in (False, True):
        assert pinned.encode_long(text, continuation=continuation).tolist() == whole_ids(pinned, text, continuation)


def test_a_batch_gives_long_texts_as_arrays_and_the_rest_as_lists_in_order(pinned: PinnedTokenizer, small_pieces: int):
    texts = ["short one", mixed_text(20_000, 2), "", "another short", mixed_text(9_000, 3)]
    out = pinned.encode_texts(texts)
    assert [type(x) for x in out] == [list, np.ndarray, list, list, np.ndarray]
    assert [list(x) for x in out] == [whole_ids(pinned, t, False) for t in texts]
    assert pinned.encode_batch(texts) == [whole_ids(pinned, t, False) for t in texts]


def test_cuts_only_before_a_space_between_two_non_spaces(pinned: PinnedTokenizer):
    text = "ab cd  ef\n gh \tij k"
    assert [i for i in range(len(text)) if pinned.cutter.is_safe(text, i)] == [2, 17]


def test_sentencepiece_bpe_is_cut_by_its_merges_byte_level_bpe_by_its_pre_tokens(pinned: PinnedTokenizer):
    """GPT-2 has merges across a space (" ³ ³") that its split regex never lets meet: cut by pre-tokens only. The
    SentencePiece-style BPEs do not split before encoding, and none of their merges joins across the start of a
    space."""
    assert pinned.cutter.merge_free_space == (
        None if pinned.encoder.pre_tokenizer.__class__.__name__ == "ByteLevel" else "\u2581"
    )


def _toy(pre_tokenizer: pre_tokenizers.PreTokenizer, merges: list[tuple[str, str]]) -> PinnedTokenizer:
    vocab = {c: i for i, c in enumerate(" abcd")}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    enc = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    enc.pre_tokenizer = pre_tokenizer
    return PinnedTokenizer(info=None, encoder=enc, continuation=continuation_encoder(enc), hf=None)  # type: ignore


def test_no_cut_where_a_merge_joins_a_word_to_the_space_after_it(small_pieces: int):
    """A pre-tokenizer that keeps each space with the word before it and a merge "b" + " ": the cut is refused,
    so the text is encoded whole; without that merge the same cuts are taken."""
    text = "ab cd " * 2000
    keep = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    joined = _toy(keep, [("b", " ")])
    assert joined.cutter.cuts(text, small_pieces) == []
    assert joined.encode_long(text).tolist() == whole_ids(joined, text, False)
    assert joined.encoder.token_to_id("b ") in whole_ids(joined, text, False)
    apart = _toy(keep, [("a", "b"), ("c", "d")])
    assert len(apart.cutter.cuts(text, small_pieces)) > 3
    assert apart.encode_long(text).tolist() == whole_ids(apart, text, False)


def test_a_tokenizer_with_a_non_special_added_token_encodes_long_texts_whole(
    pinned: PinnedTokenizer, small_pieces: int
):
    """Added tokens are matched on the raw text before anything else, so a cut could split one: no cut at all."""
    enc = Tokenizer.from_str(pinned.encoder.to_str())
    enc.encode_special_tokens = True
    enc.add_tokens(["lo wo"])
    pt = PinnedTokenizer(info=pinned.info, encoder=enc, continuation=continuation_encoder(enc), hf=pinned.hf)
    text = "hello world " * 1000
    assert pt.cutter is None
    ids = pt.encode_long(text)
    assert ids.tolist() == whole_ids(pt, text, False) and enc.token_to_id("lo wo") in ids
