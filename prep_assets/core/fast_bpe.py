"""A faster BPE engine (tiktoken) for byte-level BPE tokenizers shown, at pin time, to encode as HF `tokenizers` does.

`decide` inspects the pinned tokenizer (as transformers loads it) and returns which engine gold may use and why;
the decision is recorded in fingerprint.json (key "engine", outside the hashed files: the fingerprint does not
change). Only the ids are taken from the engine (and chat's token spans derived from their bytes), so output bytes
do not depend on it. Equivalence rests on:
- the structure: a BPE model over GPT-2's byte-to-unicode alphabet, one split regex (ByteLevel's own GPT-2 pattern,
  or a `Split` regex before a regex-free ByteLevel, Llama-3/Qwen style), no normalizer, no prefix space, no
  dropout/unknown/byte-fallback/affixes, only *special* added tokens (the pinned encoder encodes those as plain
  text, as tiktoken's `encode_ordinary` does; a non-special one is matched in text by HF: refused), merges whose
  products' ids rise with the merge order (tiktoken's ranks are ids), each token made by one merge only, and every
  token encoded by HF's own BPE to itself (tiktoken returns a piece that is a token as that token);
- the data: tests compare both engines on every shared dataset, and `FastEncoder` re-encodes a seeded sample of
  every batch with HF and fails the drop (`DropError`) on any difference.
Set PREP_ASSETS_TOKENIZER_ENGINE=hf to encode with HF only (default `auto`: the engine recorded at pin time).
Large batches are encoded by worker processes (`encode_processes`: threads do not scale for short texts).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import tiktoken
from tokenizers import Tokenizer

from prep_assets.core.encode_processes import MIN_CHARS, EncodeProcesses, processes_setting
from prep_assets.core.errors import DropError, TokenizerError

_log = logging.getLogger(__name__)
ENGINE_ENV = "PREP_ASSETS_TOKENIZER_ENGINE"
TIKTOKEN, HF = "tiktoken", "hf"
SPOT_TEXTS = 3  # random texts of each batch re-encoded with HF (and the batch's longest text)
THREADS = 2
# the split regex of the ByteLevel pre-tokenizer with use_regex (tokenizers' byte_level.rs), as tiktoken writes it
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Encoded(NamedTuple):
    """A text's ids and each token's character span (what chat masks read off an HF Encoding)."""

    ids: list[int]
    offsets: list[tuple[int, int]]


@dataclass(frozen=True)
class EngineDecision:
    """Which engine encodes gold's texts, and why; `pattern` is the split regex of a tiktoken decision."""

    engine: str
    reason: str
    pattern: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each of its 256 characters -> the byte it stands for."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _byte_level(node: Any, *, use_regex: bool) -> str | None:
    """Why a pre-tokenizer node is not a plain ByteLevel with that use_regex, None if it is."""
    if not isinstance(node, dict) or node.get("type") != "ByteLevel":
        return f"pre-tokenizer {node and node.get('type')!r} is not ByteLevel"
    if node.get("add_prefix_space"):
        return "ByteLevel add_prefix_space (a space tiktoken would not add)"
    if bool(node.get("use_regex", True)) != use_regex:
        return f"ByteLevel use_regex is {not use_regex} here"
    return None


def _split_pattern(pre: Any) -> tuple[str | None, str]:
    """(the split regex, "") of a supported pre-tokenizer, or (None, why not)."""
    if isinstance(pre, dict) and pre.get("type") == "ByteLevel":
        why = _byte_level(pre, use_regex=True)
        return (None, why) if why else (GPT2_PATTERN, "ByteLevel with GPT-2's split regex")
    if isinstance(pre, dict) and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 2:
        split, level = pre["pretokenizers"]
        pattern = split.get("pattern", {}).get("Regex") if split.get("type") == "Split" else None
        if pattern is None or split.get("behavior") != "Isolated" or split.get("invert"):
            return None, "pre-tokenizer Sequence is not Split(Regex, Isolated) then ByteLevel"
        why = _byte_level(level, use_regex=False)
        return (None, why) if why else (pattern, "a Split regex then ByteLevel without its own regex")
    return None, f"pre-tokenizer {pre and pre.get('type')!r} is not byte-level BPE's (SentencePiece style or other)"


def _model_refusal(model: dict[str, Any], added: dict[str, bool]) -> str | None:
    """Why the BPE model's merges or vocabulary do not match tiktoken's ranks, None if they do."""
    if model.get("type") != "BPE":
        return f"model {model.get('type')!r} is not BPE"
    for key in ("dropout", "unk_token", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE {key} is set ({model[key]!r})"
    vocab: dict[str, int] = model["vocab"]
    alphabet = byte_decoder()
    if any(c not in vocab for c in alphabet):
        return "the vocabulary lacks some of the 256 byte-level symbols"
    if any(c not in alphabet for t in vocab if t not in added for c in t):
        return "a token has characters outside the byte-level alphabet"
    last, made = -1, set()
    for merge in model["merges"]:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(a + b)
        if rank is None or a not in vocab or b not in vocab:
            return f"merge {a!r} {b!r} names a token not in the vocabulary"
        if rank <= last:
            return f"merge {a!r} {b!r}: its token's id {rank} does not rise with the merge order (tiktoken ranks ids)"
        if rank in made:
            return f"token id {rank} is made by two merges"
        last = rank
        made.add(rank)
    return None


def _unreached(tokenizer_json: dict[str, Any], added: dict[str, bool]) -> str | None:
    """A token HF's BPE does not encode to itself (tiktoken would, when a piece equals it), None if there is none."""
    model = Tokenizer.from_str(json.dumps(tokenizer_json)).model
    for token in tokenizer_json["model"]["vocab"]:
        if token not in added and [t.value for t in model.tokenize(token)] != [token]:
            return f"HF's BPE does not encode the token {token!r} to itself"
    return None


def decide(tokenizer_json: dict[str, Any]) -> EngineDecision:
    """tiktoken if the tokenizer is structurally what tiktoken implements, else HF; with the reason."""
    if tokenizer_json.get("normalizer") is not None:
        return EngineDecision(HF, f"normalizer {tokenizer_json['normalizer'].get('type')!r} (tiktoken has none)")
    pattern, why = _split_pattern(tokenizer_json.get("pre_tokenizer"))
    if pattern is None:
        return EngineDecision(HF, why)
    added = {t["content"]: bool(t.get("special")) for t in tokenizer_json.get("added_tokens", [])}
    plain = sorted(t for t, special in added.items() if not special)
    if plain:  # HF matches these in the text even with encode_special_tokens; tiktoken's ordinary encoding never
        return EngineDecision(HF, f"non-special added tokens are matched in text by HF: {plain[:3]}")
    refusal = _model_refusal(tokenizer_json["model"], added) or _unreached(tokenizer_json, added)
    if refusal is not None:
        return EngineDecision(HF, refusal)
    return EngineDecision(
        TIKTOKEN,
        f"byte-level BPE, {why}, no normalizer, only special added tokens (encoded as text), merge ids rising "
        "with the merge order, every token its own encoding",
        pattern,
    )


def build_encoding(tokenizer_json: dict[str, Any], pattern: str) -> tiktoken.Encoding:
    """The tiktoken Encoding of a tokenizer `decide` accepted: each token's bytes ranked by its id, no specials."""
    alphabet = byte_decoder()
    added = {t["content"] for t in tokenizer_json.get("added_tokens", [])}
    ranks = {
        bytes(alphabet[c] for c in token): rank
        for token, rank in tokenizer_json["model"]["vocab"].items()
        if token not in added
    }
    return tiktoken.Encoding("pinned", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


def engine_setting() -> str:
    """PREP_ASSETS_TOKENIZER_ENGINE: `auto` (the engine recorded at pin time, the default) or `hf`."""
    value = os.environ.get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", HF):
        raise TokenizerError(f"{ENGINE_ENV}={value!r}: expected 'auto' or 'hf'")
    return value


def component_config(part: Any) -> Any:
    """A tokenizer component's config (normalizer, pre-tokenizer, post-processor) as `Tokenizer.to_str` writes it,
    without the whole vocabulary's JSON: its pickled state is that JSON (a change of that format fails here, loudly,
    at `json.loads`)."""
    return None if part is None else json.loads(part.__getstate__())


def _trims_offsets(node: Any) -> bool:
    """Does a post-processor trim tokens' spans (ByteLevel `trim_offsets`), which tiktoken-derived spans do not?"""
    if not isinstance(node, dict):
        return False
    if node.get("type") == "Sequence":
        return any(_trims_offsets(n) for n in node.get("processors", []))
    return node.get("type") == "ByteLevel" and bool(node.get("trim_offsets"))


def encode_parallel(encoding: tiktoken.Encoding, texts: list[str], pool: ThreadPoolExecutor) -> list[list[int]]:
    """The texts' ids, THREADS interleaved stripes in parallel (tiktoken releases the GIL): 20-35% faster than its
    `encode_ordinary_batch`, which hands each text on its own to a new pool's threads."""
    if len(texts) < 4 * THREADS:
        return [encoding.encode_ordinary(t) for t in texts]
    ids: list[list[int]] = [[]] * len(texts)
    stripes = pool.map(
        lambda part: [encoding.encode_ordinary(t) for t in part], [texts[k::THREADS] for k in range(THREADS)]
    )
    for k, part in enumerate(stripes):
        ids[k::THREADS] = part
    return ids


class FastEncoder:
    """tiktoken's ordinary encoding (`encode_parallel`); a seeded sample of each batch is re-encoded by HF."""

    def __init__(self, source: tuple[str, str], hf: Tokenizer, seed: int = 0) -> None:
        self.hf, self.seed = hf, seed
        self._lock = threading.Lock()  # one batch's requests reach every worker before the next batch's
        self.spans_as_hf = not _trims_offsets(component_config(hf.post_processor))
        self._source = source  # (tokenizer JSON, split pattern): what this process and the workers build tiktoken from
        self._start_workers = True  # False once they could not start: this process encodes
        self._processes: EncodeProcesses | None = None
        self.min_chars = MIN_CHARS  # a batch of fewer characters is encoded in this process

    @classmethod
    def of(cls, decision: dict[str, Any] | None, hf: Tokenizer, text: str | None = None) -> FastEncoder | None:
        """The fast encoder if the pin-time decision chose it and the environment does not force HF, else None
        (`text`: `hf`'s JSON, where the caller has it)."""
        if not decision or decision.get("engine") != TIKTOKEN or engine_setting() == HF:
            return None
        return cls((hf.to_str() if text is None else text, decision["pattern"]), hf)

    @cached_property
    def encoding(self) -> tiktoken.Encoding:
        """tiktoken's encoding in this process, built when this process first encodes (a small batch, spans, a text
        that is not valid UTF-8); where the workers encode every batch, never (0.2-0.4 s before the first batch)."""
        return build_encoding(json.loads(self._source[0]), self._source[1])

    def _workers(self, texts: list[str]) -> EncodeProcesses | None:
        """The worker processes for a batch this large (started with the first), None to encode it here."""
        if self._processes is None:
            count = processes_setting()
            if not self._start_workers or count < 2 or sum(map(len, texts)) < self.min_chars:
                return None
            try:
                self._processes = EncodeProcesses(*self._source, count)
            except OSError as exc:  # no process can be started here: the threads encode, as before workers
                _log.warning("tiktoken worker processes could not start (%s); encoding in this process", exc)
                self._start_workers = False
                return None
        return self._processes

    def close(self) -> None:
        """End the worker processes, if any were started (a later batch starts them again)."""
        if self._processes is not None:
            self._processes.close()
            self._processes = None

    @cached_property
    def _pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(THREADS, thread_name_prefix="tiktoken")

    @cached_property
    def _token_bytes(self) -> np.ndarray:
        """Each id's length in bytes (0 for ids tiktoken does not know: added tokens, never produced here)."""
        out = np.zeros(self.encoding.max_token_value + 1, dtype=np.int64)
        for rank in range(len(out)):
            try:
                out[rank] = len(self.encoding.decode_single_token_bytes(rank))
            except KeyError:
                pass
        return out

    def encode(self, texts: list[str]) -> list[list[int]] | list[np.ndarray]:
        """The texts' ids: by the worker processes (int32 arrays) for a large batch of valid UTF-8, else here."""
        with self._lock:
            workers = self._workers(texts)
            pending = None
            if workers is not None:
                try:
                    pending = workers.submit(texts)
                except UnicodeEncodeError:  # a lone surrogate: tiktoken's own handling of it, in this process
                    pending = None
        ids = pending() if pending is not None else encode_parallel(self.encoding, texts, self._pool)
        self.spot_check(texts, ids)
        return ids

    def encode_offsets(self, texts: list[str]) -> list[Encoded] | None:
        """Ids with each token's character span as HF gives it (from the character holding its first byte to the one
        holding its last: a character split across tokens is each one's span), spot-checked against HF with
        the ids; None if a text is not valid UTF-8 (lone surrogates) or HF trims spans: the caller encodes with HF."""
        if not self.spans_as_hf:
            return None
        try:
            raw = [t.encode("utf-8") for t in texts]
        except UnicodeEncodeError:
            return None
        ids = encode_parallel(self.encoding, texts, self._pool)
        out = []
        for data, tokens in zip(raw, ids, strict=True):
            buf = np.frombuffer(data, dtype=np.uint8)
            char_of = np.cumsum((buf & 0xC0) != 0x80) - 1  # each byte's character
            ends = np.cumsum(self._token_bytes[np.asarray(tokens, dtype=np.int64)])
            starts = ends - self._token_bytes[np.asarray(tokens, dtype=np.int64)]
            spans = np.stack([char_of[starts], char_of[ends - 1] + 1], axis=1) if tokens else np.zeros((0, 2), int)
            out.append(Encoded(tokens, [(a, b) for a, b in spans.tolist()]))
        self.spot_check(texts, ids, [e.offsets for e in out])
        return out

    def spot_check(
        self,
        texts: list[str],
        ids: list[list[int]] | list[np.ndarray],
        offsets: list[list[tuple[int, int]]] | None = None,
    ) -> None:
        """Re-encode SPOT_TEXTS seeded texts and the longest with HF; a difference (ids, or offsets when given) fails
        the drop. The draw is seeded by the texts' lengths, not by the order of the calls: gold encodes two batches
        at once, and a batch with a long text makes several calls, so calls may come in either order."""
        if not texts:
            return
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        rng = random.Random(self.seed * 1_000_003 + zlib.crc32(lengths.tobytes()))
        picks = sorted(
            {
                *rng.sample(range(len(texts)), min(SPOT_TEXTS, len(texts))),
                max(range(len(texts)), key=lambda i: len(texts[i])),
            }
        )
        encode = self.hf.encode_batch_fast if offsets is None else self.hf.encode_batch  # only the latter has spans
        for i, e in zip(picks, encode([texts[i] for i in picks], add_special_tokens=False), strict=True):
            ours: list[Any] = [int(x) for x in ids[i]]  # ids come as lists or int32 arrays
            theirs: list[Any] = e.ids
            if ours == theirs and offsets is not None:
                ours, theirs = list(offsets[i]), e.offsets
            if ours != theirs:
                at = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                raise DropError(
                    f"the fast BPE engine (tiktoken) and HF tokenizers encode a text differently (from token {at}: "
                    f"{ours[at : at + 5]} vs {theirs[at : at + 5]}; text starts {texts[i][:60]!r}); no ids "
                    f"were written: report it, and set {ENGINE_ENV}=hf to encode with HF only"
                )
