"""The pinned tokenizer: resolved from a local path, the local hub cache, or trained; loaded offline.

The tokenizer asset copies (or trains) the tokenizer files into the lake and records the sha256 of
each file; the fingerprint (a hash over those) is its data version and goes into every manifest.
Downstream layers load the lake's pinned copy only, never a worker's cache. Never `trust_remote_code`.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

if TYPE_CHECKING:  # transformers is imported where a tokenizer is loaded (0.4 s a process that needs none)
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from prep_assets.core.errors import TokenizerError  # noqa: E402
from prep_assets.core.fast_bpe import FastEncoder, component_config, decide  # noqa: E402
from prep_assets.core.lake import canonical_json, read_json, sha256_file, write_json_atomic  # noqa: E402
from prep_assets.core.spec_sections import TokenizerSpec, TrainTokenizerSpec  # noqa: E402

FINGERPRINT_FILE = "fingerprint.json"
# an Encoding costs ~500 B a token (6 MB of text in one call: +720 MiB): long texts go in pieces, a few a call
LONG_TEXT_CHARS = 64 * 1024
PIECE_CHARS = 16 * 1024
PIECES_PER_CALL = 8
CUT_WINDOW = 64  # characters either side of a cut that the tokenizer's own normalizer and pre-tokenizer check
CUT_TRIES = 64  # candidate cuts refused in a row before giving up on a text's remaining cuts (its tail: one piece)
_CANDIDATE = re.compile(r"(?<=\S) (?=\S)")  # a space between two non-spaces
_log = logging.getLogger(__name__)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class TokenizerInfo:
    """What the tokenize and pack steps need to know about a tokenizer."""

    fingerprint: str
    vocab_size: int
    eos_id: int
    pad_id: int
    bos_id: int | None
    add_bos: bool
    add_eos: bool


def is_tokenizer_file(name: str) -> bool:
    return name in TOKENIZER_FILES or fnmatch.fnmatch(name, "chat_template*.jinja")


def _copy_tokenizer_files(src: Path, dest: Path) -> None:
    names = sorted(p.name for p in src.iterdir() if p.is_file() and is_tokenizer_file(p.name))
    if not names:
        raise TokenizerError(f"{src}: no tokenizer files found (looked for {', '.join(TOKENIZER_FILES[:3])}, ...)")
    for name in names:
        shutil.copyfile(src / name, dest / name)


def _resolve_hub_snapshot(hub_id: str, revision: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=hub_id, revision=revision, local_files_only=True))
    except Exception as exc:  # the hub client raises several types for "not in the cache"
        raise TokenizerError(
            f"tokenizer {hub_id}@{revision} is not in the local hub cache ({exc.__class__.__name__}); "
            "there is no network at run time: download it beforehand or give `tokenizer.path`"
        ) from None


def iter_training_texts(patterns: list[str], base: Path) -> Iterator[str]:
    """Lines of the configured files (globs relative to the data dir), in sorted path order."""
    paths: list[Path] = []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else str(base / pattern)
        matched = sorted(Path(p) for p in glob.glob(full, recursive=True))
        if not matched:
            raise TokenizerError(f"tokenizer.train.files: {pattern!r} matches no file under {base}")
        paths.extend(matched)
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line


def train_bpe(train: TrainTokenizerSpec, base: Path, dest: Path) -> None:
    """Train a byte-level BPE tokenizer deterministically and save it as a transformers tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=train.vocab_size,
        min_frequency=train.min_frequency,
        special_tokens=list(train.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_training_texts(train.files, base), trainer)
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=train.eos_token, pad_token=train.pad_token, bos_token=train.bos_token
    )
    wrapped.save_pretrained(str(dest))


def source_digest(spec: TokenizerSpec, base: Path) -> str:
    """A hash of what the tokenizer is made from: training files, or the source directory's tokenizer files.

    Recorded when pinned; a different digest later means the pinned copy is out of date.
    """
    if spec.train is not None:
        paths = [
            Path(p)
            for pattern in spec.train.files
            for p in sorted(glob.glob(pattern if os.path.isabs(pattern) else str(base / pattern), recursive=True))
        ]
        # keyed relative to the data dir, so a moved or cloned data dir keeps its digest
        files = {(p.relative_to(base) if p.is_relative_to(base) else p).as_posix(): sha256_file(p) for p in paths}
    elif spec.path is not None:
        src = resolve_path(spec.path, base)
        files = (
            {p.name: sha256_file(p) for p in sorted(src.iterdir()) if p.is_file() and is_tokenizer_file(p.name)}
            if src.is_dir()
            else {}
        )
    else:
        files = {"hub": f"{spec.hub_id}@{spec.revision}"}
    template = chat_template_text(spec, base)
    if template is not None:
        files["chat_template"] = hashlib.sha256(template.encode("utf-8")).hexdigest()
    return hashlib.sha256(canonical_json(files).encode("utf-8")).hexdigest()


def chat_template_text(spec: TokenizerSpec, base: Path) -> str | None:
    """The spec's chat template (inline or from a file relative to the data dir), None if it gives none."""
    if spec.chat_template_file is not None:
        path = resolve_path(spec.chat_template_file, base)
        if not path.is_file():
            raise TokenizerError(f"tokenizer.chat_template_file {spec.chat_template_file!r} is not a file ({path})")
        return path.read_text(encoding="utf-8")
    return spec.chat_template


def resolve_path(value: str, base: Path) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (base / path)


def pin_tokenizer(spec: TokenizerSpec, *, base: Path, dest: Path) -> dict[str, Any]:
    """Write the tokenizer's files into `dest` (an empty staging dir) and a fingerprint.json."""
    if spec.train is not None:
        train_bpe(spec.train, base, dest)
        source = {"mode": "train", "files": spec.train.files}
    elif spec.path is not None:
        src = resolve_path(spec.path, base)
        if not src.is_dir():
            raise TokenizerError(f"tokenizer.path {spec.path!r} is not a directory (resolved to {src})")
        _copy_tokenizer_files(src, dest)
        source = {"mode": "path", "path": spec.path}
    else:
        assert spec.hub_id is not None and spec.revision is not None
        _copy_tokenizer_files(_resolve_hub_snapshot(spec.hub_id, spec.revision), dest)
        source = {"mode": "hub", "hub_id": spec.hub_id, "revision": spec.revision}
    template = chat_template_text(spec, base)
    if template is not None:  # the spec's template replaces the tokenizer's own, pinned with it
        (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
        (dest / "chat_template.json").unlink(missing_ok=True)
    files = {p.name: sha256_file(p) for p in sorted(dest.iterdir()) if p.is_file()}
    fingerprint = hashlib.sha256(canonical_json(files).encode("utf-8")).hexdigest()
    tok = load_tokenizer(dest)
    info = tokenizer_info(tok, spec, fingerprint)
    record = {
        "fingerprint": fingerprint,
        "files": files,
        "source": source,
        "info": asdict(info),
        "source_digest": source_digest(spec, base),
        # which engine gold encodes with, and why (outside the hashed files: it never changes the ids)
        "engine": decide(json.loads(tok.backend_tokenizer.to_str())).to_json(),
    }
    write_json_atomic(dest / FINGERPRINT_FILE, record)
    return record


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError/ValueError/... for unloadable dirs
        raise TokenizerError(f"{path}: cannot load a tokenizer offline: {exc}") from None
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(f"{path}: only fast (Rust) tokenizers are supported; add a tokenizer.json")
    return tok


def tokenizer_info(tok: PreTrainedTokenizerBase, spec: TokenizerSpec, fingerprint: str) -> TokenizerInfo:
    eos_id = tok.eos_token_id
    if eos_id is None:
        raise TokenizerError("the tokenizer has no eos_token; every example ends with one (set it in its config)")
    bos_id = tok.bos_token_id
    add_bos = spec.add_bos
    if add_bos is None:
        ids = tok("a", add_special_tokens=True)["input_ids"]
        add_bos = bos_id is not None and bool(ids) and ids[0] == bos_id and bos_id != eos_id
    if add_bos and bos_id is None:
        raise TokenizerError("tokenizer.add_bos is true but the tokenizer has no bos_token")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_id
    return TokenizerInfo(
        fingerprint=fingerprint,
        vocab_size=len(tok),
        eos_id=int(eos_id),
        pad_id=int(pad_id),
        bos_id=None if bos_id is None else int(bos_id),
        add_bos=bool(add_bos),
        add_eos=spec.add_eos,
    )


def _without_word_start(node: Any) -> Any:
    """A normalizer/pre-tokenizer config with the word-start marker removed (None to drop the node)."""
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "Prepend":
        return None
    if kind == "Metaspace":
        return {**node, "prepend_scheme": "never"}
    if kind == "ByteLevel" and node.get("add_prefix_space"):
        return {**node, "add_prefix_space": False}
    if kind == "Sequence":
        key = "normalizers" if "normalizers" in node else "pretokenizers"
        children = [c for c in (_without_word_start(x) for x in node.get(key, [])) if c is not None]
        return {**node, key: children}
    return node


def continuation_encoder(encoder: Tokenizer) -> Tokenizer:
    """A copy that encodes text as it would be encoded *after* other text of the same example.

    SentencePiece-style tokenizers mark the start of an input with a word-start symbol (a `Prepend`
    normalizer or Metaspace `prepend_scheme`); encoding a completion on its own would add that symbol at
    every prompt/completion boundary. Byte-level BPE without `add_prefix_space` is unaffected: then the encoder
    itself is returned, so callers can tell (`continuation is encoder`) and encode all texts in one call.
    """
    # the two components' own configs: the whole tokenizer's JSON, 50k words and merges, is only needed when one
    # changes (~0.07 s a load for byte-level BPE)
    parts = {key: component_config(getattr(encoder, key)) for key in ("normalizer", "pre_tokenizer")}
    stripped = {key: _without_word_start(node) for key, node in parts.items()}
    if stripped == parts:
        return encoder
    out = Tokenizer.from_str(json.dumps({**json.loads(encoder.to_str()), **stripped}))
    out.encode_special_tokens = True
    return out


class PieceCutter:
    """Where a long text may be cut so that its pieces' ids, concatenated, are exactly the ids of the whole text
    (the first piece encoded as the text is, the later ones as continuations).

    A cut goes before a space that follows a non-space character and precedes one, and only where the tokenizer
    itself shows that no token can span it, on a window of text around the cut: the continuation's normalizer gives
    the two sides apart the characters it gives them together, and either its pre-tokenizer puts a boundary there
    (every model encodes each pre-token on its own) or, when it does not split there (SentencePiece-style BPE), no
    BPE merge joins a symbol that does not end with the space's symbol to one that starts with it.
    """

    def __init__(self, continuation: Tokenizer) -> None:
        self.tokenizer = continuation
        self.normalizer, self.pre_tokenizer = continuation.normalizer, continuation.pre_tokenizer

    @classmethod
    def of(cls, encoder: Tokenizer, continuation: Tokenizer) -> PieceCutter | None:
        """None when no cut can be trusted: a non-special added token is matched in the raw text, across any cut."""
        if any(not t.special for t in encoder.get_added_tokens_decoder().values()):
            return None
        return cls(continuation)

    def _norm(self, text: str) -> str:
        return text if self.normalizer is None else self.normalizer.normalize_str(text)

    def _pre(self, text: str) -> list[str]:
        return [text] if self.pre_tokenizer is None else [t for t, _ in self.pre_tokenizer.pre_tokenize_str(text)]

    @cached_property
    def merge_free_space(self) -> str | None:
        """The space's symbol if no BPE merge can join across the start of one, else None (read once, when needed)."""
        model = json.loads(self.tokenizer.model.__getstate__())
        if (
            model.get("type") != "BPE"
            or model.get("dropout")
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or model.get("ignore_merges")
        ):
            return None
        space = self._pre(self._norm(" a"))[0][:1]
        if space not in model["vocab"]:  # an unknown space could fuse with the unknown symbol before it
            return None
        for merge in model["merges"]:
            a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
            if b.startswith(space) and not a.endswith(space):
                return None
        return space

    def is_safe(self, text: str, at: int) -> bool:
        """Can `text` be cut before character `at`?"""
        if not (
            0 < at < len(text) - 1 and text[at] == " " and not text[at - 1].isspace() and not text[at + 1].isspace()
        ):
            return False
        left, right = text[max(0, at - CUT_WINDOW) : at], text[at : at + CUT_WINDOW]
        nl, nr = self._norm(left), self._norm(right)
        if nl + nr != self._norm(left + right):
            return False
        pl, pr, pw = self._pre(nl), self._pre(nr), self._pre(nl + nr)
        if pl + pr == pw:
            return True
        space = self.merge_free_space
        return (
            space is not None
            and pw == [*pl[:-1], pl[-1] + pr[0], *pr[1:]]
            and pr[0].startswith(space)
            and not pl[-1].endswith(space)
        )

    def cuts(self, text: str, every: int) -> list[int]:
        """Cut positions about `every` characters apart; after CUT_TRIES refused candidates in a row the rest of the
        text stays one piece (exact still, only larger)."""
        out: list[int] = []
        at = every
        while at < len(text):
            tries = 0
            for match in _CANDIDATE.finditer(text, at):
                if self.is_safe(text, match.start()):
                    out.append(match.start())
                    break
                tries += 1
                if tries >= CUT_TRIES:
                    return out
            else:
                return out
            at = out[-1] + every
        return out


@dataclass(frozen=True)
class PinnedTokenizer:
    info: TokenizerInfo
    encoder: Tokenizer  # a private copy that encodes special-token strings as plain text
    continuation: Tokenizer  # the same, for text that follows other text of the example
    hf: PreTrainedTokenizerBase
    fast: FastEncoder | None = None  # tiktoken, when pinning found it equivalent (`fast_bpe`); then no continuation

    def close(self) -> None:
        """End what encoding started beside this process (the fast engine's worker processes)."""
        if self.fast is not None:
            self.fast.close()

    @cached_property
    def cutter(self) -> PieceCutter | None:
        cutter = PieceCutter.of(self.encoder, self.continuation)
        if cutter is None:
            _log.warning(
                "this tokenizer has non-special added tokens: texts over %d characters are encoded whole",
                LONG_TEXT_CHARS,
            )
        return cutter

    def encode_texts(self, texts: list[str], *, continuation: bool = False) -> list[list[int] | np.ndarray]:
        """Batch-encode with the Rust tokenizer's parallelism, no special tokens added; a text over LONG_TEXT_CHARS
        comes back as an int32 array, encoded in pieces (`PieceCutter`) with the same ids as encoding it whole."""
        encoder = self.continuation if continuation else self.encoder
        if max(map(len, texts), default=0) <= LONG_TEXT_CHARS:
            return list(self._ids(encoder, texts))
        long = [i for i, t in enumerate(texts) if len(t) > LONG_TEXT_CHARS]
        out: list[list[int] | np.ndarray] = list(
            self._ids(encoder, ["" if len(t) > LONG_TEXT_CHARS else t for t in texts])
        )
        for i, ids in zip(long, self._encode_long([texts[i] for i in long], continuation), strict=True):
            out[i] = ids
        return out

    def _ids(self, encoder: Tokenizer, texts: list[str]) -> list[list[int]]:
        """The one place that chooses the engine: tiktoken if pinning chose it (then `encoder` is the only one)."""
        if self.fast is not None:
            return self.fast.encode(texts)
        return [e.ids for e in encoder.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_offsets(self, encoder: Tokenizer, texts: list[str]) -> list[Any]:
        """Encodings with `ids` and character `offsets` (chat masks): tiktoken's if chosen (HF's spans), else HF's."""
        fast = self.fast.encode_offsets(texts) if self.fast is not None else None
        return fast if fast is not None else encoder.encode_batch(texts, add_special_tokens=False)

    def encode_batch(self, texts: list[str], *, continuation: bool = False) -> list[list[int]]:
        """`encode_texts` as lists."""
        return [
            x.tolist() if isinstance(x, np.ndarray) else x for x in self.encode_texts(texts, continuation=continuation)
        ]

    def encode_long(self, text: str, *, continuation: bool = False) -> np.ndarray:
        """The ids of one text as int32, encoded in pieces (whole if it cannot be cut)."""
        return self._encode_long([text], continuation)[0]

    def _encode_long(self, texts: list[str], continuation: bool) -> list[np.ndarray]:
        """The texts' pieces, PIECES_PER_CALL at a time across texts (short texts' calls would leave a core idle)."""
        cutter = self.cutter
        firsts: list[tuple[int, int, int]] = []  # (text, start, end) of pieces that start an input
        rests: list[tuple[int, int, int]] = []
        starts_input = not continuation and self.continuation is not self.encoder
        for t, text in enumerate(texts):
            bounds = [0, *(cutter.cuts(text, PIECE_CHARS) if cutter is not None else []), len(text)]
            spans = [(t, a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            firsts += spans[:1] if starts_input else []
            rests += spans[1:] if starts_input else spans
        parts: list[list[np.ndarray]] = [[] for _ in texts]
        for encoder, jobs in ((self.encoder, firsts), (self.continuation, rests)):  # firsts first: parts in order
            for k in range(0, len(jobs), PIECES_PER_CALL):
                chunk = jobs[k : k + PIECES_PER_CALL]
                for (t, _, _), ids in zip(
                    chunk, self._ids(encoder, [texts[t][a:b] for t, a, b in chunk]), strict=True
                ):
                    parts[t].append(np.array(ids, dtype=np.int32))
        return [np.concatenate(p) for p in parts]


def load_pinned_info(tokenizer_dir: Path) -> TokenizerInfo:
    """What was recorded when the lake's tokenizer was pinned (ids, vocab size, fingerprint), without loading it."""
    fp_path = tokenizer_dir / FINGERPRINT_FILE
    if not fp_path.is_file():
        raise TokenizerError(f"{tokenizer_dir}: no pinned tokenizer; materialize the tokenizer asset first")
    return TokenizerInfo(**read_json(fp_path)["info"])


def pinned_hf(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    """The lake's pinned tokenizer as transformers loads it, once per process and fingerprint: gold's encoders, its
    preview and the shards' preview each loaded it anew (0.17-0.29 s for GPT-2's, 0.42-0.46 s for Llama's). Callers
    only read it (templates, vocabulary, decoding); an encoder that changes settings is built from a copy."""
    return _pinned_hf(str(tokenizer_dir.resolve()), load_pinned_info(tokenizer_dir).fingerprint)


@lru_cache(maxsize=2)  # a long-lived worker process (Celery) holds at most two
def _pinned_hf(path: str, fingerprint: str) -> PreTrainedTokenizerBase:
    return load_tokenizer(Path(path))


def load_pinned(tokenizer_dir: Path) -> PinnedTokenizer:
    """Load the lake's pinned tokenizer with the info recorded when it was pinned."""
    info = load_pinned_info(tokenizer_dir)
    engine = read_json(tokenizer_dir / FINGERPRINT_FILE).get("engine")
    hf = pinned_hf(tokenizer_dir)
    text = hf.backend_tokenizer.to_str()
    encoder = Tokenizer.from_str(text)
    encoder.no_padding()
    encoder.no_truncation()
    encoder.encode_special_tokens = True
    continuation = continuation_encoder(encoder)
    fast = FastEncoder.of(engine, encoder, text) if continuation is encoder else None
    return PinnedTokenizer(info=info, encoder=encoder, continuation=continuation, hf=hf, fast=fast)
