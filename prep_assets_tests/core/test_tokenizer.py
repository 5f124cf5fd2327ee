"""The pinned tokenizer: pinned from a path, the local hub cache or training files; its fingerprint and source digest;
chat templates inline or from a file; loaded back offline.

Real tokenizers only: one trained here from the shipped sample corpus (data/corpus, what the sample datasets do),
GPT-2 and TinyLlama from ../shared/tokenizers (skipped with a reason where absent).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from prep_assets.core.errors import TokenizerError
from prep_assets.core.spec_sections import TokenizerSpec
from prep_assets.core.tokenizer import (
    FINGERPRINT_FILE,
    PinnedTokenizer,
    TokenizerInfo,
    chat_template_text,
    iter_training_texts,
    load_pinned,
    load_pinned_info,
    load_tokenizer,
    pin_tokenizer,
    pinned_hf,
    source_digest,
    tokenizer_info,
)
from prep_assets_tests.conftest import SAMPLE_DATA, shared_path

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
TRAIN = {"files": ["corpus/*.txt"], "vocab_size": 1024, "min_frequency": 2}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir holding a copy of the shipped tokenizer corpus (tests change it)."""
    shutil.copytree(SAMPLE_DATA / "corpus", tmp_path / "data" / "corpus")
    return tmp_path / "data"


def _pin(spec: TokenizerSpec, base: Path, dest: Path) -> dict:
    dest.mkdir(parents=True)
    return pin_tokenizer(spec, base=base, dest=dest)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fingerprint(files: dict[str, str]) -> str:
    """The fingerprint recomputed from its definition: sha256 of the key-sorted compact JSON of file -> sha256."""
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _load_checked(record: dict, dest: Path) -> PinnedTokenizer:
    """Load a pinned dir, checking first that it holds exactly what the pin recorded."""
    assert {p.name for p in dest.iterdir()} == set(record["files"]) | {FINGERPRINT_FILE}
    return load_pinned(dest)


# ---------------------------------------------------------------- pinning from a path


def test_pin_from_path_copies_the_tokenizer_files_only_and_records_each_sha256(tmp_path: Path, gpt2_dir: Path):
    src = tmp_path / "src"
    shutil.copytree(gpt2_dir, src)
    (src / "model.safetensors").write_bytes(b"\0" * 64)  # weights and docs beside the tokenizer stay behind
    (src / "README.md").write_text("gpt2", encoding="utf-8")
    record = _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "pinned")
    names = {"merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"}
    assert {p.name for p in (tmp_path / "pinned").iterdir()} == names | {FINGERPRINT_FILE}
    assert record["files"] == {n: _sha256(gpt2_dir / n) for n in sorted(names)}
    assert record["fingerprint"] == _fingerprint(record["files"])
    assert record["source"] == {"mode": "path", "path": str(src)}
    assert json.loads((tmp_path / "pinned" / FINGERPRINT_FILE).read_text(encoding="utf-8")) == record


def test_pin_gpt2_records_its_ids_eos_as_pad_and_no_bos_added(tmp_path: Path, gpt2_dir: Path):
    record = _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, tmp_path / "pinned")
    # GPT-2 adds no BOS of its own (its bos is its eos): none is added, and padding uses the eos id
    assert record["info"] == {
        "fingerprint": record["fingerprint"],
        "vocab_size": 50257,
        "eos_id": 50256,
        "pad_id": 50256,
        "bos_id": 50256,
        "add_bos": False,
        "add_eos": True,
    }


def test_pin_tinyllama_detects_that_it_adds_bos_unless_the_spec_says_not_to(tmp_path: Path):
    src = shared_path("tokenizers/tinyllama")
    auto = _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "auto")["info"]
    assert (auto["bos_id"], auto["eos_id"], auto["add_bos"]) == (1, 2, True)
    off = _pin(TokenizerSpec(path=str(src), add_bos=False, add_eos=False), tmp_path, tmp_path / "off")["info"]
    assert (off["add_bos"], off["add_eos"]) == (False, False)
    assert off["fingerprint"] == auto["fingerprint"]  # the same files: options are not part of the fingerprint


def test_pin_from_a_relative_path_resolves_it_against_the_data_dir(tmp_path: Path, gpt2_dir: Path):
    shutil.copytree(gpt2_dir, tmp_path / "data" / "tokenizers" / "gpt2")
    record = _pin(TokenizerSpec(path="tokenizers/gpt2"), tmp_path / "data", tmp_path / "pinned")
    assert record["source"] == {"mode": "path", "path": "tokenizers/gpt2"}
    assert record["files"]["tokenizer.json"] == _sha256(gpt2_dir / "tokenizer.json")


def test_pin_from_a_path_that_is_not_a_directory_names_the_resolved_path(tmp_path: Path):
    with pytest.raises(TokenizerError, match=r"tokenizer.path 'nowhere' is not a directory \(resolved to .*nowhere\)"):
        _pin(TokenizerSpec(path="nowhere"), tmp_path, tmp_path / "pinned")


def test_pin_from_a_directory_without_tokenizer_files_says_what_it_looked_for(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TokenizerError, match="no tokenizer files found \\(looked for tokenizer.json, "):
        _pin(TokenizerSpec(path="empty"), tmp_path, tmp_path / "pinned")


def test_the_fingerprint_changes_with_any_pinned_file_and_only_then(tmp_path: Path, gpt2_dir: Path):
    src = tmp_path / "src"
    shutil.copytree(gpt2_dir, src)
    first = _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "a")["fingerprint"]
    assert _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "b")["fingerprint"] == first
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    (src / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 4096}), encoding="utf-8")
    assert _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "c")["fingerprint"] != first


# ---------------------------------------------------------------- pinning from the local hub cache


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """An empty hub cache of the test's own, and a record of every call that would reach the Hub (each fails)."""
    cache, calls = tmp_path / "hub", []
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    def network(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"HfApi.{name} reached for the network")

        return call

    for name in ("repo_info", "model_info", "list_repo_tree", "list_repo_files"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, network(name))
    return cache, calls


def test_pin_from_the_hub_cache_copies_the_snapshot_without_the_network(
    tmp_path: Path, gpt2_dir: Path, hub_cache: tuple[Path, list[str]]
):
    cache, calls = hub_cache
    commit = "a" * 40
    shutil.copytree(gpt2_dir, cache / "models--acme--gpt2" / "snapshots" / commit)  # the hub client's layout
    record = _pin(TokenizerSpec(hub_id="acme/gpt2", revision=commit), tmp_path, tmp_path / "pinned")
    assert calls == []
    assert record["source"] == {"mode": "hub", "hub_id": "acme/gpt2", "revision": commit}
    assert record["files"]["tokenizer.json"] == _sha256(gpt2_dir / "tokenizer.json")
    assert record["info"]["vocab_size"] == 50257


def test_hub_tokenizer_not_in_the_local_cache_fails_with_the_remedy_not_a_download(
    tmp_path: Path, hub_cache: tuple[Path, list[str]]
):
    _, calls = hub_cache
    spec = TokenizerSpec(hub_id="acme/never-downloaded", revision="v1.0")
    with pytest.raises(TokenizerError) as err:
        _pin(spec, tmp_path, tmp_path / "pinned")
    assert calls == []
    message = str(err.value)
    assert message.startswith("tokenizer acme/never-downloaded@v1.0 is not in the local hub cache (")
    assert "there is no network at run time: download it beforehand or give `tokenizer.path`" in message
    assert err.value.__cause__ is None and err.value.__suppress_context__  # the hub's traceback is not chained
    assert list((tmp_path / "pinned").iterdir()) == []


# ---------------------------------------------------------------- pinning by training


def test_training_on_the_sample_corpus_is_deterministic_and_records_its_special_ids(data_dir: Path, tmp_path: Path):
    spec = TokenizerSpec(train=TRAIN)
    a = _pin(spec, data_dir, tmp_path / "a")
    b = _pin(spec, data_dir, tmp_path / "b")
    assert a["fingerprint"] == b["fingerprint"] and a["files"] == b["files"]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert a["source"] == {"mode": "train", "files": ["corpus/*.txt"]}
    tok = load_tokenizer(tmp_path / "a")
    info = a["info"]
    assert info["vocab_size"] == len(tok) == 1024
    assert info["eos_id"] == tok.convert_tokens_to_ids("<|endoftext|>") and info["eos_id"] != info["pad_id"]
    assert info["pad_id"] == tok.convert_tokens_to_ids("<|pad|>")
    assert (info["bos_id"], info["add_bos"]) == (None, False)
    text = "The river gauge read 3.2 m at dawn; ünïcödé 🙂 survives.\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text  # byte level: every text round trips


def test_training_on_other_files_gives_another_fingerprint(data_dir: Path, tmp_path: Path):
    base = _pin(TokenizerSpec(train=TRAIN), data_dir, tmp_path / "a")["fingerprint"]
    with_chat = TokenizerSpec(train={**TRAIN, "files": ["corpus/*.txt", "corpus/chat/*.txt"]})
    assert _pin(with_chat, data_dir, tmp_path / "b")["fingerprint"] != base


def test_training_with_add_bos_but_no_bos_token_is_refused(data_dir: Path, tmp_path: Path):
    with pytest.raises(TokenizerError, match="tokenizer.add_bos is true but the tokenizer has no bos_token"):
        _pin(TokenizerSpec(train=TRAIN, add_bos=True), data_dir, tmp_path / "pinned")


def test_training_files_pattern_matching_nothing_names_the_pattern_and_the_data_dir(data_dir: Path, tmp_path: Path):
    spec = TokenizerSpec(train={**TRAIN, "files": ["corpus/*.txt", "corpus/missing/*.txt"]})
    with pytest.raises(TokenizerError, match=r"tokenizer.train.files: 'corpus/missing/\*.txt' matches no file under "):
        _pin(spec, data_dir, tmp_path / "pinned")


def test_training_texts_are_the_non_blank_lines_in_sorted_path_order(tmp_path: Path):
    (tmp_path / "b.txt").write_text("b1\n\n  \nb2\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("a1\na2", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c1\n", encoding="utf-8")
    assert list(iter_training_texts(["*.txt"], tmp_path)) == ["a1\n", "a2", "b1\n", "b2\n"]
    assert list(iter_training_texts(["**/*.txt"], tmp_path))[-1] == "c1\n"  # recursive globs
    absolute = str(tmp_path / "a.txt")
    assert list(iter_training_texts([absolute], tmp_path / "elsewhere")) == ["a1\n", "a2"]


# ---------------------------------------------------------------- the source digest


def test_source_digest_is_recorded_when_pinned(data_dir: Path, tmp_path: Path, gpt2_dir: Path):
    for spec, base in ((TokenizerSpec(train=TRAIN), data_dir), (TokenizerSpec(path=str(gpt2_dir)), tmp_path)):
        dest = tmp_path / f"pinned-{spec.path is None}"
        assert _pin(spec, base, dest)["source_digest"] == source_digest(spec, base)


def test_source_digest_of_training_files_survives_moving_the_data_dir_and_follows_their_bytes(
    data_dir: Path, tmp_path: Path
):
    spec = TokenizerSpec(train=TRAIN)
    before = source_digest(spec, data_dir)
    moved = shutil.copytree(data_dir, tmp_path / "clone" / "data")
    assert source_digest(spec, moved) == before  # keyed relative to the data dir
    with (moved / "corpus" / "sample_corpus.txt").open("a", encoding="utf-8") as f:
        f.write("one more line\n")
    appended = source_digest(spec, moved)
    (moved / "corpus" / "extra.txt").write_text("x\n", encoding="utf-8")
    assert len({before, appended, source_digest(spec, moved)}) == 3  # a changed file counts, and a new one


def test_source_digest_of_a_path_follows_its_tokenizer_files_and_ignores_the_rest(tmp_path: Path, gpt2_dir: Path):
    src = shutil.copytree(gpt2_dir, tmp_path / "src")
    spec = TokenizerSpec(path=str(src))
    before = source_digest(spec, tmp_path)
    (src / "README.md").write_text("notes", encoding="utf-8")
    assert source_digest(spec, tmp_path) == before
    (src / "added_tokens.json").write_text("{}", encoding="utf-8")
    assert source_digest(spec, tmp_path) != before


def test_source_digest_of_a_hub_tokenizer_is_its_id_and_revision_without_the_network(tmp_path: Path):
    one = source_digest(TokenizerSpec(hub_id="acme/tok", revision="a" * 40), tmp_path)
    assert one == source_digest(TokenizerSpec(hub_id="acme/tok", revision="a" * 40), tmp_path / "elsewhere")
    assert one != source_digest(TokenizerSpec(hub_id="acme/tok", revision="b" * 40), tmp_path)


def test_source_digest_counts_the_chat_template_by_its_text_inline_or_from_a_file(tmp_path: Path, gpt2_dir: Path):
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    none = source_digest(TokenizerSpec(path=str(gpt2_dir)), tmp_path)
    inline = source_digest(TokenizerSpec(path=str(gpt2_dir), chat_template=TEMPLATE), tmp_path)
    from_file = source_digest(TokenizerSpec(path=str(gpt2_dir), chat_template_file="t.jinja"), tmp_path)
    assert inline == from_file != none
    (tmp_path / "t.jinja").write_text(TEMPLATE + "\n", encoding="utf-8")
    assert source_digest(TokenizerSpec(path=str(gpt2_dir), chat_template_file="t.jinja"), tmp_path) != from_file


# ---------------------------------------------------------------- chat templates


def test_chat_template_text_inline_from_a_file_relative_to_the_data_dir_or_none(tmp_path: Path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.jinja").write_text(TEMPLATE + "\n", encoding="utf-8")
    assert chat_template_text(TokenizerSpec(path="x"), tmp_path) is None
    assert chat_template_text(TokenizerSpec(path="x", chat_template=TEMPLATE), tmp_path) == TEMPLATE
    from_file = TokenizerSpec(path="x", chat_template_file="templates/t.jinja")
    assert chat_template_text(from_file, tmp_path) == TEMPLATE + "\n"  # the file's text exactly


def test_chat_template_file_that_is_missing_names_the_setting_and_the_resolved_path(tmp_path: Path):
    spec = TokenizerSpec(path="x", chat_template_file="templates/none.jinja")
    with pytest.raises(TokenizerError, match=r"tokenizer.chat_template_file 'templates/none.jinja' is not a file \("):
        chat_template_text(spec, tmp_path)


def test_inline_chat_template_is_pinned_with_the_tokenizer_and_loaded_back(tmp_path: Path, gpt2_dir: Path):
    plain = _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, tmp_path / "plain")
    record = _pin(TokenizerSpec(path=str(gpt2_dir), chat_template=TEMPLATE), tmp_path, tmp_path / "pinned")
    assert (tmp_path / "pinned" / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    assert record["files"]["chat_template.jinja"] == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert record["fingerprint"] != plain["fingerprint"]  # the template is part of what is pinned
    hf = load_pinned(tmp_path / "pinned").hf
    assert hf.chat_template == TEMPLATE
    rendered = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "<user>hi</user>"


def test_the_pinned_tokenizer_is_loaded_once_per_process_until_it_is_pinned_again(tmp_path: Path, gpt2_dir: Path):
    """Gold, its preview and the shards' preview share one load; a tokenizer pinned again with other files (another
    fingerprint) in the same folder is loaded anew, not served from the first."""
    dest = tmp_path / "pinned"
    _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, dest)
    first = pinned_hf(dest)
    assert pinned_hf(dest) is first and load_pinned(dest).hf is first
    shutil.rmtree(dest)
    _pin(TokenizerSpec(path=str(gpt2_dir), chat_template=TEMPLATE), tmp_path, dest)
    again = pinned_hf(dest)
    assert again is not first and again.chat_template == TEMPLATE and first.chat_template != TEMPLATE


def test_chat_template_file_replaces_the_tokenizers_own_template(tmp_path: Path):
    src = shared_path("tokenizers/tinyllama")
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    own = _load_checked(_pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "own"), tmp_path / "own")
    assert own.hf.chat_template == (src / "chat_template.jinja").read_text(encoding="utf-8")
    spec = TokenizerSpec(path=str(src), chat_template_file="t.jinja")
    replaced = _load_checked(_pin(spec, tmp_path, tmp_path / "replaced"), tmp_path / "replaced")
    assert replaced.hf.chat_template == TEMPLATE
    assert (tmp_path / "replaced" / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE


def test_a_spec_template_removes_a_pinned_chat_template_json(tmp_path: Path, gpt2_dir: Path):
    src = shutil.copytree(gpt2_dir, tmp_path / "src")
    (src / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'theirs' }}"}), encoding="utf-8")
    record = _pin(TokenizerSpec(path=str(src), chat_template=TEMPLATE), tmp_path, tmp_path / "pinned")
    assert not (tmp_path / "pinned" / "chat_template.json").exists() and "chat_template.json" not in record["files"]
    assert load_pinned(tmp_path / "pinned").hf.chat_template == TEMPLATE


# ---------------------------------------------------------------- loading the pinned copy


def test_load_pinned_info_is_what_was_recorded_at_pinning(tmp_path: Path, gpt2_dir: Path):
    record = _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, tmp_path / "pinned")
    info = load_pinned_info(tmp_path / "pinned")
    assert isinstance(info, TokenizerInfo) and info == TokenizerInfo(**record["info"])
    assert load_pinned(tmp_path / "pinned").info == info


def test_load_pinned_without_a_pinned_tokenizer_says_to_materialize_it(tmp_path: Path):
    for load in (load_pinned_info, load_pinned):
        with pytest.raises(TokenizerError, match="no pinned tokenizer; materialize the tokenizer asset first"):
            load(tmp_path)


def test_load_pinned_uses_the_lake_copy_only(tmp_path: Path, gpt2_dir: Path):
    src = shutil.copytree(gpt2_dir, tmp_path / "src")
    _pin(TokenizerSpec(path=str(src)), tmp_path, tmp_path / "pinned")
    shutil.rmtree(src)  # the source gone: the pinned copy is all that is read
    pt = load_pinned(tmp_path / "pinned")
    assert pt.encode_batch(["hello world"]) == [[31373, 995]]


def test_pinned_encoder_keeps_special_token_strings_as_plain_text(tmp_path: Path, gpt2_dir: Path):
    _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, tmp_path / "pinned")
    pt = load_pinned(tmp_path / "pinned")
    (injected,) = pt.encode_batch(["<|endoftext|>"])
    assert pt.info.eos_id not in injected and pt.hf.decode(injected) == "<|endoftext|>"
    assert pt.hf("<|endoftext|>", add_special_tokens=False)["input_ids"] == [pt.info.eos_id]  # what it avoids
    texts = ["plain text", " leading space", "tabs\tand\nnewlines", ""]
    assert pt.encode_batch(texts) == [pt.hf(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_continuation_encoder_is_the_encoder_for_byte_level_bpe(tmp_path: Path, gpt2_dir: Path):
    _pin(TokenizerSpec(path=str(gpt2_dir)), tmp_path, tmp_path / "pinned")
    pt = load_pinned(tmp_path / "pinned")
    assert pt.continuation is pt.encoder
    assert pt.encode_batch(["x y"], continuation=True) == pt.encode_batch(["x y"])


def test_continuation_encoder_drops_sentencepieces_word_start_marker(tmp_path: Path):
    _pin(TokenizerSpec(path=str(shared_path("tokenizers/tinyllama"))), tmp_path, tmp_path / "pinned")
    pt = load_pinned(tmp_path / "pinned")
    assert pt.continuation is not pt.encoder
    assert pt.encoder.encode("hello world", add_special_tokens=False).tokens == ["▁hello", "▁world"]
    assert pt.continuation.encode("hello world", add_special_tokens=False).tokens == ["hello", "▁world"]
    # what continuation means: "a" then "hello" encodes as "ahello" does
    (whole,) = pt.encode_batch(["ahello"])
    (head,), (tail,) = pt.encode_batch(["a"]), pt.encode_batch(["hello"], continuation=True)
    assert pt.hf.decode(head + tail) == pt.hf.decode(whole) == "ahello"
    (special,) = pt.encode_batch(["</s>"], continuation=True)
    assert pt.info.eos_id not in special  # special-token strings stay text in the continuation copy too


def test_load_tokenizer_refuses_a_directory_it_cannot_load_offline(tmp_path: Path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="cannot load a tokenizer offline"):
        load_tokenizer(tmp_path)


def test_tokenizer_without_an_eos_token_is_refused_with_the_reason():
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    with pytest.raises(TokenizerError, match="the tokenizer has no eos_token; every example ends with one"):
        tokenizer_info(tok, TokenizerSpec(path="x"), "fp")
