"""Silver transforms: normalization, length and quality filters, the content hash and the deterministic split.

Each filter returns keep or a reason; the caller writes every dropped record to the rejects table.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import regex

from prep_assets.core.lake import canonical_json
from prep_assets.core.record_types import record_type
from prep_assets.core.records import WEIGHT, content_texts, map_content_texts
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import CleanSpec, NormalizeSpec, QualitySpec, SplitSpec

# C0 and C1 controls and DEL, except tab and newline (carriage return is kept only when line endings
# are not normalized, so a record never silently changes its line structure).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f]")
_CONTROL_NO_CR = re.compile(r"[\x00-\x08\x0b\x0c\x0d\x0e-\x1f\x7f-\x84\x86-\x9f]")


def normalize_text(text: str, norm: NormalizeSpec, *, strip_end: bool = True) -> str:
    """One text field normalized. `strip_end=False` keeps the whitespace at the field's end: a prompt's last
    space or newline is what separates it from the completion joined after it."""
    if norm.newlines:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if norm.nfc:
        text = unicodedata.normalize("NFC", text)
    if norm.control_chars:
        control = _CONTROL_NO_CR if norm.newlines else _CONTROL
        if control.search(text):
            text = control.sub("", text)
    if norm.trailing_whitespace:
        if " \n" in text or "\t\n" in text:  # spaces/tabs before a line end (a regex lookahead is 50x slower)
            lines = text.split("\n")
            text = "\n".join([line.rstrip(" \t") for line in lines[:-1]] + lines[-1:])
        if strip_end:
            text = text.rstrip()
    return text


def normalize_content(content: dict[str, Any], norm: NormalizeSpec) -> dict[str, Any]:
    """Every text field normalized on its own. A field's end is stripped only where no other field's text is
    joined right after it: a document, a completion (its EOS follows), a message (the template's delimiters
    follow); a prompt keeps its trailing whitespace, so cleaning never glues a prompt to its completion."""
    if "turns" in content:
        return {
            **content,
            "turns": [
                {
                    "prompt": normalize_text(t["prompt"], norm, strip_end=False),
                    "completion": normalize_text(t["completion"], norm),
                }
                for t in content["turns"]
            ],
        }
    return map_content_texts(content, lambda s: normalize_text(s, norm))


# In a record's canonical JSON (ensure_ascii=False: only control characters, quotes and backslashes are escaped),
# what any normalization step could change shows up as one of these: an escape for CR, a control character or any
# other \u escape; DEL; a space or tab before an escaped newline; whitespace before a string's closing quote
# (what rstrip removes). A backslash that is itself escaped can only match more, never less.
_MAY_CHANGE = r'\\u|\\b|\\f|\\r|\x7f| \\n|\\t\\n| "|\\n"|\\t"'


# Beyond ASCII, what a step other than NFC could change shows up as itself: a C1 control (JSON escapes C0 only;
# NEL, 0x85, is included though only rstrip removes it) or, before a closing quote, a whitespace character above
# ASCII (`str.isspace`'s, what rstrip removes; test_clean checks the list against Python's).
SPACES_ABOVE_ASCII = "\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_MAY_CHANGE_BEYOND_ASCII = _MAY_CHANGE + "|[\u0080-\u009f]|[" + SPACES_ABOVE_ASCII + ']"'


def normalization_screen(canonical: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Per record (its canonical JSON, as bronze writes it): (left as is, NFC alone decides).

    Left as is: normalization provably changes none of its texts, so its silver content is the same string and
    neither normalization nor re-serialisation needs to run. Only all-ASCII records qualify (NFC never changes
    ASCII), and only where no text holds what `normalize_text` could remove or rewrite (`_MAY_CHANGE`, matched on
    the JSON text by Arrow's RE2 over the whole batch). NFC alone decides: a record with text beyond ASCII that
    holds none of that, nor a C1 control or Unicode whitespace before a closing quote (`_MAY_CHANGE_BEYOND_ASCII`,
    the same one pass), so only NFC could change it: `nfc_stable` then tells on its texts. Anything else takes
    the record-by-record path."""
    if len(canonical) == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    ascii_only = pc.string_is_ascii(canonical)
    quiet = pc.invert(pc.match_substring_regex(canonical, _MAY_CHANGE_BEYOND_ASCII))
    return (
        pc.and_(ascii_only, quiet).to_numpy(zero_copy_only=False),
        pc.and_(pc.invert(ascii_only), quiet).to_numpy(zero_copy_only=False),
    )


def left_as_is(canonical: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per record: True where normalization provably changes none of its texts (`normalization_screen`'s first)."""
    return normalization_screen(canonical)[0]


def nfc_stable(content: dict[str, Any], norm: NormalizeSpec) -> bool:
    """For a record `normalization_screen` leaves to NFC: True where normalizing changes none of its texts (each is
    NFC already, or NFC is off), so it is left as is as well. Table rows take the record-by-record path."""
    if "values" in content:
        return False
    return not norm.nfc or all(unicodedata.is_normalized("NFC", t) for t in content_texts(content))


def content_digest(canonical: str) -> str:
    """sha256 (hex) of a record's canonical JSON: what exact dedup keys on (confirmed on the bytes)."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def content_sha256(content: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of every training-relevant field (not a prefix, not one field)."""
    return content_digest(canonical_json(content))


@dataclass(frozen=True)
class Verdict:
    reason: str
    detail: str


def trained_roles(spec: DatasetSpec) -> frozenset[str]:
    """The chat roles whose messages are training targets under a spec (none for other types)."""
    if not record_type(spec.input.type).roles:
        return frozenset()
    return frozenset(r for r in spec.mask_keys if spec.mask_action(r) == "train")


@dataclass(frozen=True)
class Record:
    """What silver's filters look at: a record's normalized content, its text fields, and the spec's view of it."""

    content: dict[str, Any]
    texts: list[str]
    clean: CleanSpec
    trained: frozenset[str]  # the chat roles that are training targets (`trained_roles`)

    @property
    def num_chars(self) -> int:
        return sum(map(len, self.texts))


Filter = Callable[[Record], "Verdict | None"]


def empty_turn(r: Record) -> Verdict | None:
    """A trained turn with no characters but whitespace would teach the model to answer with nothing."""
    if r.clean.keep_empty_turns:
        return None
    content = r.content
    if "turns" in content:  # prompt/completion turns: no branches, no messages
        empty = [i + 1 for i, t in enumerate(content["turns"]) if not t["completion"].strip()]
        if empty:
            return Verdict(
                "empty_completion",
                f"turn(s) {empty} have an empty or whitespace-only completion "
                "(clean.keep_empty_turns: true keeps them)",
            )
        return None
    for branch in ("chosen", "rejected"):
        if branch in content and not any(m["content"].strip() for m in content[branch]):
            return Verdict(
                "empty_completion",
                f"the {branch} branch is empty or whitespace only (clean.keep_empty_turns: true keeps it)",
            )
    for key in ("messages", "chosen", "rejected"):
        empty = [
            f"{key}[{i}] ({m['role']})"
            for i, m in enumerate(content.get(key, []))
            if m["role"] in r.trained and m.get(WEIGHT, 1) != 0 and not m["content"].strip()
        ]
        if empty:
            return Verdict(
                "empty_completion",
                f"trained message(s) {', '.join(empty[:5])} are empty or whitespace "
                "only (clean.keep_empty_turns: true keeps them)",
            )
    return None


def identical_branches(r: Record) -> Verdict | None:
    if "chosen" in r.content and r.content["chosen"] == r.content["rejected"]:
        return Verdict("identical_branches", "chosen and rejected are the same after normalization")
    return None


def length(r: Record) -> Verdict | None:
    n = r.num_chars
    if n == 0:
        return Verdict("empty", "no characters left after normalization")
    if n < r.clean.min_chars:
        return Verdict("too_short", f"{n} chars < min_chars {r.clean.min_chars}")
    if r.clean.max_chars is not None and n > r.clean.max_chars:
        return Verdict("too_long", f"{n} chars > max_chars {r.clean.max_chars}")
    return None


def quality(r: Record) -> Verdict | None:
    """The text heuristics (`clean.quality`); table rows are data, not prose, and get none."""
    if "values" in r.content or not r.clean.quality.enabled:
        return None
    return heuristic_verdict("\n".join(r.texts), r.clean.quality)


# Silver's filters, in order: each returns None to keep the record or the reason it is rejected.
FILTERS: tuple[Filter, ...] = (empty_turn, identical_branches, length, quality)


def active_filters(clean: CleanSpec) -> tuple[Filter, ...]:
    """`FILTERS` less those that keep every record under `clean` (the quality heuristics when none is set,
    `empty_turn` with `keep_empty_turns`): what silver asks of each record, decided once per drop."""
    off = {quality} if not clean.quality.enabled else set()
    if clean.keep_empty_turns:
        off.add(empty_turn)
    return tuple(f for f in FILTERS if f not in off)


def quality_verdict(
    content: dict[str, Any],
    clean: CleanSpec,
    texts: list[str] | None = None,
    trained: frozenset[str] = frozenset(),
    filters: tuple[Filter, ...] = FILTERS,
) -> Verdict | None:
    """None to keep the record, else why it goes to the rejects table (the first of `filters` that rejects it).
    `texts`: its `content_texts`, if at hand; `trained`: the chat roles that are training targets; `filters`:
    `active_filters(clean)` where a caller judges many records."""
    record = Record(content, content_texts(content) if texts is None else texts, clean, trained)
    for keep_or_reason in filters:
        verdict = keep_or_reason(record)
        if verdict is not None:
            return verdict
    return None


# Letters, combining marks (Indic vowel signs, ...) and digits: `\w` alone splits Devanagari or Tamil words.
WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+")
_NON_ALNUM = regex.compile(r"[^\p{L}\p{M}\p{N}\s]")


def repeated_ngram_fraction(words: list[str], n: int) -> float:
    """The fraction of word characters inside word n-grams that occur more than once (Gopher's duplicate
    n-gram character fraction)."""
    if len(words) < n:
        return 0.0
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(grams)
    starts = np.fromiter((counts[g] > 1 for g in grams), dtype=bool, count=len(grams))
    if not starts.any():
        return 0.0
    # word i is covered when an n-gram starting in [i-n+1, i] repeats
    hits = np.concatenate([[0], np.cumsum(starts)])
    lo = np.maximum(np.arange(len(words)) - n + 1, 0)
    hi = np.minimum(np.arange(len(words)) + 1, len(grams))
    covered = hits[hi] - hits[lo] > 0
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    return float(lengths[covered].sum() / lengths.sum())


def heuristic_verdict(text: str, q: QualitySpec) -> Verdict | None:
    """Gopher/C4-style quality heuristics, each with its own reason; None when all pass (or are off)."""
    if q.min_words is not None or q.max_repeated_ngram_fraction is not None:
        words = WORD.findall(text.lower())
        if q.min_words is not None and len(words) < q.min_words:
            return Verdict("too_few_words", f"{len(words)} words < min_words {q.min_words}")
        if q.max_repeated_ngram_fraction is not None:
            frac = repeated_ngram_fraction(words, q.repeated_ngram_size)
            if frac > q.max_repeated_ngram_fraction:
                return Verdict(
                    "repeated_ngrams",
                    f"{frac:.3f} of word characters in repeated "
                    f"{q.repeated_ngram_size}-grams > {q.max_repeated_ngram_fraction}",
                )
    if q.max_repeated_line_fraction is not None:
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        frac = (len(lines) - len(set(lines))) / len(lines) if lines else 0.0
        if frac > q.max_repeated_line_fraction:
            return Verdict(
                "repeated_lines", f"{frac:.3f} of lines repeat an earlier line > {q.max_repeated_line_fraction}"
            )
    if q.max_non_alnum_fraction is not None and text:
        frac = (len(text) - len(_NON_ALNUM.sub("", text))) / len(text)
        if frac > q.max_non_alnum_fraction:
            return Verdict(
                "non_alphanumeric",
                f"{frac:.3f} of characters are neither alphanumeric nor space > {q.max_non_alnum_fraction}",
            )
    return None


def split_hash(key: str, seed: int) -> int:
    """A record's split hash: the first 8 bytes of sha256(`<seed>:<key>`), an unsigned 64-bit integer."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big")


def assign_split(key: str, split: SplitSpec) -> str:
    """A split from a hash of the record's content: stable across runs, batch sizes and drop orders.

    Keying on content puts exact duplicates in one split, so dedup across splits is never needed. With
    `split.validation_count` / `test_count` every record is `train` here; `splits_by_count` then holds out the
    counts once the drop's kept records are known.
    """
    if split.validation_ratio == 0 and split.test_ratio == 0:  # the default: no draw can leave train
        return "train"
    u = split_hash(key, split.seed) / 2**64
    if u < split.validation_ratio:
        return "validation"
    if u < split.validation_ratio + split.test_ratio:
        return "test"
    return "train"


def splits_by_count(hashes: np.ndarray, split: SplitSpec) -> np.ndarray:
    """Each kept record's split code (an index into `SPLITS`) when the held-out splits are counts.

    The `validation_count` records with the smallest split hashes are validation, the next `test_count` test,
    the rest train; equal hashes (copies kept by `clean.dedup: none`) are taken in drop order. Memory: the
    hashes (uint64) and their ranking. `ValueError` when the counts would leave nothing to train.

    >>> splits_by_count(np.array([30, 10, 20, 40], dtype=np.uint64), SplitSpec(validation_count=1, test_count=2))
    array([2, 1, 2, 0], dtype=uint8)
    """
    n_val, n_test = split.validation_count or 0, split.test_count or 0
    if n_val + n_test >= len(hashes) and n_val + n_test > 0:
        raise ValueError(
            f"the drop keeps {len(hashes)} records, but split.validation_count + test_count = {n_val + n_test} "
            "must leave at least one to train: lower the counts, or give ratios (split.validation_ratio, "
            "test_ratio) for drops of any size"
        )
    codes = np.zeros(len(hashes), dtype=np.uint8)
    order = np.argsort(hashes, kind="stable")
    codes[order[:n_val]] = 1
    codes[order[n_val : n_val + n_test]] = 2
    return codes
