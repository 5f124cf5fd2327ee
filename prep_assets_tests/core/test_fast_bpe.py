"""The fast BPE engine (tiktoken) gives HF's ids: on every shared dataset and on edge cases; it is chosen only for
tokenizers the pin-time check accepts; gold built with it is byte-identical to gold built with HF only; a mismatch
found at run time fails the drop."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep_assets.core import fast_bpe
from prep_assets.core.errors import DropError, TokenizerError
from prep_assets.core.fast_bpe import ENGINE_ENV, GPT2_PATTERN, build_encoding, decide
from prep_assets.core.spec import load_spec
from prep_assets.core.spec_sections import TokenizerSpec, TrainTokenizerSpec
from prep_assets.core.tokenizer import FINGERPRINT_FILE, LONG_TEXT_CHARS, PinnedTokenizer, load_pinned, pin_tokenizer
from prep_assets_tests.conftest import SAMPLE_DATA, copy_sample_data, shared_path, tree_digests
from prep_assets_tests.core.helpers import gpt2_lake, run_core

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EDGE_TEXTS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    " \n ",
    "<|endoftext|>",
    "hello <|endoftext|> world<|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "line one\r\nline two\r\n\r\n",
    "\r",
    "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧 and text",
    "\u0301",
    " \u0301x \u0301\u0302 e\u0301",
    "\u00a0\u0085\u2028\u2029\u3000\u200b\ufeff mixed whitespace",
    "it's I'LL we'VE they'd 1234567 3.14159 ...!!! ???",
    "汉字とかなカナ 한국어 العربية עברית",
    "\x00\x01\x7f control",
    "trailing spaces   ",
    "   leading spaces",
    "tabs\t\tand\t \tspaces",
]


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _render(messages: list[Any]) -> str | None:
    """A ChatML rendering of a list of {role|from, content|value} messages, None if it is not one."""
    if not messages or not all(isinstance(m, dict) for m in messages):
        return None
    parts = [
        f"<|im_start|>{m.get('role', m.get('from'))}\n{m.get('content', m.get('value'))}<|im_end|>\n" for m in messages
    ]
    return "".join(parts) if all(isinstance(m.get("content", m.get("value")), str) for m in messages) else None


def _json_or_text(line: str) -> Any:
    """A JSONL line's record, or the line itself where it is not JSON (../shared/datasets/bad)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return line


def _records(path: Path) -> list[Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        if path.suffixes[0] == ".json":
            data = json.load(f)
            return data if isinstance(data, list) else [data]
        if ".jsonl" in path.suffixes:
            return [_json_or_text(line) for line in f if line.strip()]
        text = f.read()
    return [text[i : i + 8192] for i in range(0, len(text), 8192)] + text.splitlines(keepends=True)


def dataset_texts(path: Path) -> list[str]:
    """Every string of every record (prompts, completions, messages, preference pairs, documents), and each chat's
    ChatML rendering whole and split at its template specials."""
    texts: list[str] = []
    for record in _records(path):
        texts += _strings(record)
        lists = [v for v in record.values() if isinstance(v, list)] if isinstance(record, dict) else []
        for rendering in filter(None, map(_render, lists)):
            texts.append(rendering)
            texts += [p for p in rendering.replace("<|im_end|>", "<|im_start|>").split("<|im_start|>") if p]
    return list(dict.fromkeys(texts))  # each distinct text once


def _shared_files() -> list[Path]:
    root = Path(__file__).resolve().parents[3] / "shared" / "datasets"
    return sorted(p for p in root.glob("*/*") if p.suffix in (".json", ".jsonl", ".txt", ".gz"))


def pinned(dest: Path, name: str) -> PinnedTokenizer:
    """../shared's tokenizer `name` pinned into `dest` (created) and loaded."""
    dest.mkdir(parents=True, exist_ok=True)
    pin_tokenizer(TokenizerSpec(path=str(shared_path(f"tokenizers/{name}"))), base=dest, dest=dest)
    return load_pinned(dest)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> PinnedTokenizer:
    return pinned(tmp_path_factory.mktemp("gpt2"), "gpt2")


def _hf_ids(pt: PinnedTokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in pt.encoder.encode_batch_fast(texts, add_special_tokens=False)]


def _mismatches(pt: PinnedTokenizer, texts: list[str]) -> tuple[int, int]:
    assert pt.fast is not None
    try:  # as gold runs it: in worker processes for a large batch
        fast = [x.tolist() if isinstance(x, np.ndarray) else x for x in pt.fast.encode(texts)]
    finally:
        pt.close()
    hf = _hf_ids(pt, texts)
    return sum(a != b for a, b in zip(fast, hf, strict=True)), sum(map(len, hf))


@pytest.mark.parametrize("path", _shared_files() or [None], ids=lambda p: p and f"{p.parent.name}/{p.name}")
def test_fast_ids_equal_hf_ids_on_every_shared_dataset(gpt2: PinnedTokenizer, path: Path | None):
    if path is None:
        pytest.skip("needs ../shared/datasets (the shared datasets folder beside the clone), absent here")
    texts = dataset_texts(path)
    bad, tokens = _mismatches(gpt2, texts)
    print(f"\n{path.parent.name}/{path.name}: {len(texts):,} texts, {tokens:,} tokens, {bad} mismatching")
    assert bad == 0


def test_fast_ids_equal_hf_ids_on_edge_cases(gpt2: PinnedTokenizer):
    texts = EDGE_TEXTS + [t * 3 for t in EDGE_TEXTS] + ["".join(EDGE_TEXTS)]
    assert _mismatches(gpt2, texts)[0] == 0
    # special-token strings in content are plain text: the HF encoder pinned for gold does not match them either
    assert 50256 not in gpt2.encode_batch(["a <|endoftext|> b"])[0]
    assert gpt2.encode_batch(["a <|endoftext|> b"]) == _hf_ids(gpt2, ["a <|endoftext|> b"])


def _offsets_mismatches(pt: PinnedTokenizer, texts: list[str]) -> int:
    assert pt.fast is not None
    fast = pt.fast.encode_offsets(texts)
    assert fast is not None
    hf = pt.encoder.encode_batch(texts, add_special_tokens=False)
    return sum((f.ids, f.offsets) != (h.ids, h.offsets) for f, h in zip(fast, hf, strict=True))


@pytest.mark.parametrize("name", ["fastchat_dummy_conversation.json", "glaive_toolcall_en_demo.json", "edge cases"])
def test_chat_spans_from_fast_ids_equal_hf_offsets(gpt2: PinnedTokenizer, name: str):
    texts = EDGE_TEXTS if name == "edge cases" else dataset_texts(shared_path(f"datasets/chat/{name}"))
    assert _offsets_mismatches(gpt2, texts + [t * 2 for t in EDGE_TEXTS]) == 0


def test_long_texts_pieces_are_the_whole_texts_ids(gpt2: PinnedTokenizer):
    rng = random.Random(0)
    words = [w for w in EDGE_TEXTS[6:] if w.strip()] + ["alpha", "beta", "gamma", "\n\n", "  "]
    text = " ".join(rng.choice(words) for _ in range(60_000))
    assert len(text) > 4 * LONG_TEXT_CHARS
    whole = _hf_ids(gpt2, [text])[0]
    fast_long = gpt2.encode_long(text)
    assert isinstance(fast_long, np.ndarray) and fast_long.tolist() == whole
    assert gpt2.encode_batch(["short", text, ""]) == [_hf_ids(gpt2, ["short"])[0], whole, []]


def test_gpt2_takes_tiktoken_and_the_sentencepiece_style_tokenizers_are_refused_with_a_reason(
    tmp_path: Path, gpt2: PinnedTokenizer
):
    assert gpt2.fast is not None
    for name, reason in (("tinyllama", "'Metaspace'"), ("mistral7b", "'Metaspace'")):
        pt = pinned(tmp_path / name, name)
        record = json.loads((tmp_path / name / FINGERPRINT_FILE).read_text())
        assert record["engine"]["engine"] == "hf" and reason in record["engine"]["reason"]
        assert pt.fast is None


def test_the_decision_is_recorded_beside_the_fingerprint_which_it_does_not_change(tmp_path: Path):
    pinned(tmp_path / "a", "gpt2")
    record = json.loads((tmp_path / "a" / FINGERPRINT_FILE).read_text())
    assert record["engine"]["engine"] == "tiktoken" and record["engine"]["pattern"] == GPT2_PATTERN
    assert "engine.json" not in record["files"] and FINGERPRINT_FILE not in record["files"]
    pinned(tmp_path / "b", "gpt2")  # deterministic
    assert (tmp_path / "b" / FINGERPRINT_FILE).read_text() == (tmp_path / "a" / FINGERPRINT_FILE).read_text()


def build_tokenizer_dir(spec: Any, data: Path) -> Path:
    """The spec's tokenizer pinned into the lake as gold's asset pins it (run_core pins it again, identically)."""
    from prep_assets.core.gold import build_tokenizer
    from prep_assets.core.lake import dataset_paths

    paths = dataset_paths(data, spec.name)
    build_tokenizer(spec, paths, data)
    return paths.tokenizer_dir


def _gpt2_json() -> dict[str, Any]:
    return json.loads((shared_path("tokenizers/gpt2") / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, LLAMA3_PATTERN], ids=["gpt2_regex", "llama3_regex"])
def test_a_split_regex_before_a_regex_free_byte_level_llama3_style_is_accepted_and_equal(pattern: str):
    from tokenizers import Tokenizer

    tj = _gpt2_json()
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, level]}
    decision = decide(tj)
    assert decision.engine == "tiktoken" and decision.pattern == pattern
    hf = Tokenizer.from_str(json.dumps(tj))
    hf.encode_special_tokens = True
    texts = EDGE_TEXTS + dataset_texts(shared_path("datasets/text/c4_demo.jsonl"))[:300]
    fast = build_encoding(tj, pattern).encode_ordinary_batch(texts)
    assert fast == [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda tj: tj.update(normalizer={"type": "NFC"}), "normalizer 'NFC'"),
        (lambda tj: tj["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda tj: tj["pre_tokenizer"].update(use_regex=False), "use_regex"),
        (lambda tj: tj["model"].update(dropout=0.1), "dropout"),
        (lambda tj: tj["added_tokens"][0].update(special=False), "non-special added tokens"),
        (lambda tj: tj["model"]["merges"].reverse(), "does not rise with the merge order"),
        (lambda tj: tj["model"]["vocab"].pop("Ġ"), "256 byte-level symbols"),
    ],
    ids=["normalizer", "prefix_space", "no_regex", "dropout", "plain_added", "merge_order", "byte_missing"],
)
def test_what_tiktoken_does_not_implement_is_refused_with_the_reason(change: Any, reason: str):
    tj = _gpt2_json()
    change(tj)
    decision = decide(tj)
    assert decision.engine == "hf" and reason in decision.reason, decision


def test_the_sample_data_trained_tokenizer_takes_tiktoken_and_gives_hf_ids(tmp_path: Path):
    train = TrainTokenizerSpec(files=["corpus/sample_corpus.txt"], vocab_size=2000)
    dest = tmp_path / "tok"
    dest.mkdir()
    record = pin_tokenizer(TokenizerSpec(train=train), base=SAMPLE_DATA, dest=dest)
    assert record["engine"]["engine"] == "tiktoken", record["engine"]
    pt = load_pinned(dest)
    texts = EDGE_TEXTS + (SAMPLE_DATA / "corpus" / "sample_corpus.txt").read_text().splitlines()
    assert _mismatches(pt, texts)[0] == 0 and _offsets_mismatches(pt, texts) == 0


def test_the_environment_forces_hf_and_refuses_unknown_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENGINE_ENV, "hf")
    assert pinned(tmp_path / "a", "gpt2").fast is None
    monkeypatch.setenv(ENGINE_ENV, "fastest")
    with pytest.raises(TokenizerError, match=ENGINE_ENV):
        load_pinned(tmp_path / "a")


def _lake(data_dir: Path) -> dict[str, str]:
    """Instructions, documents and one long document (encoded in pieces)."""
    return gpt2_lake(data_dir, long_chars=300_000)


def test_gold_with_the_fast_path_is_byte_identical_to_gold_with_hf_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls = []
    real = fast_bpe.FastEncoder.encode
    monkeypatch.setattr(fast_bpe.FastEncoder, "encode", lambda self, texts: calls.append(1) or real(self, texts))
    fast = _lake(tmp_path / "fast")
    assert calls, "the fast engine was not used"
    monkeypatch.setenv(ENGINE_ENV, "hf")
    calls.clear()
    hf = _lake(tmp_path / "hf")
    assert not calls
    assert any("/gold/" in k for k in fast) and any("/shards/" in k for k in fast)
    assert fast == hf


def test_the_sample_chat_lake_split_at_template_specials_is_byte_identical_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    digests = {}
    for engine in ("auto", "hf"):
        monkeypatch.setenv(ENGINE_ENV, engine)
        data = copy_sample_data(tmp_path / engine)
        spec = load_spec(data / "datasets" / "sample_chat.yaml", data)
        pt = load_pinned(build_tokenizer_dir(spec, data))
        assert (pt.fast is not None and pt.fast.spans_as_hf) == (engine == "auto")
        run_core(data, spec)
        digests[engine] = tree_digests(data / "lake", skip_hidden_names=True)
    assert any("/gold/" in k for k in digests["hf"]) and digests["auto"] == digests["hf"]


def test_a_mismatch_at_run_time_fails_the_drop_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = fast_bpe.tiktoken.Encoding.encode_ordinary

    def wrong(self: Any, text: str) -> list[int]:
        ids = real(self, text)
        return [*ids[:-1], (ids[-1] + 1) % 50000] if ids else ids

    monkeypatch.setattr(fast_bpe.tiktoken.Encoding, "encode_ordinary", wrong)
    with pytest.raises(DropError, match=f"encode a text differently.*{ENGINE_ENV}=hf"):
        _lake(tmp_path)


def test_the_spot_check_draws_the_same_texts_of_a_call_whatever_calls_came_before(gpt2: PinnedTokenizer):
    """Gold encodes two batches at once and a batch with a long text makes several calls, so calls come in either
    order: the texts HF re-encodes are drawn from the call's own texts, not from how many calls came before."""
    assert gpt2.fast is not None
    fast, real = gpt2.fast, gpt2.fast.hf
    first = [f"text number {i} " * (i % 7 + 1) for i in range(200)]
    second = [f"another {i}" for i in range(50)]
    checked: list[str] = []

    class Seen:  # HF as the spot check calls it, noting which texts it re-encodes
        def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
            checked.extend(texts)
            return real.encode_batch_fast(texts, **kwargs)

    drawn = []
    try:
        fast.hf = Seen()  # type: ignore[assignment]
        for calls in ((first, second), (second, first), (second, second, first)):
            for texts in calls:
                checked.clear()
                fast.spot_check(texts, [real.encode(t, add_special_tokens=False).ids for t in texts])
                if texts is first:
                    drawn.append(list(checked))
    finally:
        fast.hf = real
    assert len(drawn) == 3 and drawn[0] == drawn[1] == drawn[2] and len(drawn[0]) >= 3
