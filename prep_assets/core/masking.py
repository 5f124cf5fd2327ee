"""Tokenize + mask: content records to token ids, loss masks and token types, in batches.

Rules (the `mask` keys of docs/spec.md): text trains on every token; instruction masks prompts and trains completions,
with one EOS after each completion, trained. Chat and preference records render through the chat
template (see `chat`): each role's characters train or not per the spec, a trained turn with its
end-of-turn text. Preference records become two examples (chosen, rejected) whose shared prompt is
masked in both; a pair is kept or rejected as a whole. At most one BOS, at the start. Special-token strings in
content are encoded as plain text. The first token of every example has loss_mask 0: in a packed row
it starts a segment and has no context to be predicted from. Overflow beyond `max_seq_len` follows
`sequence.overflow`; an example left without a trained token is rejected (`no_trained_tokens`). A text over
`tokenizer.LONG_TEXT_CHARS` is encoded in pieces whose ids are exactly the whole text's (`tokenizer.PieceCutter`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple, TypeVar

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, ranges_index, segment_sums
from prep_assets.core.chat import ChatTemplate, EncodedChat
from prep_assets.core.record_types import shape_of
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT, WEIGHT, Invalid
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.tokenizer import PinnedTokenizer

_TEXT, _SPECIAL = 0, 1
K = TypeVar("K")


class Piece(NamedTuple):
    """A span of an example: a text to encode, or one special token id (a tuple: one per text of every record)."""

    kind: int
    text: str
    token_id: int
    train: bool
    token_type: int


@dataclass(frozen=True)
class TokenizedBatch:
    """Kept examples as flat arrays with offsets, plus the rejected records.

    `kept` holds, per kept example, the index of its record in the input batch (a preference record
    gives two consecutive examples, `branches` says which is which).
    """

    kept: np.ndarray  # record index per kept example
    token_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    token_type_ids: np.ndarray  # uint8
    offsets: np.ndarray  # int64, len(kept) + 1
    rejects: list[tuple[int, str, str, int]]  # (record index, reason, detail, num_tokens before overflow)
    tokens_dropped: int  # tokens lost to overflow: cut from kept examples, plus all of `lost`
    cut: np.ndarray | None = None  # per kept example: tokens cut from it by truncation
    lost: list[tuple[int, int]] | None = None  # (record index, tokens) of records rejected because of overflow
    branches: list[str | None] | None = None  # per kept example: "chosen"/"rejected" for preference
    shared_prefix: np.ndarray | None = None  # preference: per kept example, the shared prompt's tokens
    split_at_turn_boundary: int = 0  # chat: kept examples whose ids differ from tokenizer(rendering) (chat.encode)


def trainable_types(spec: DatasetSpec) -> tuple[int, ...]:
    """The token types that may carry loss under this spec (what the mask/type gate allows)."""
    if shape_of(spec) in ("messages", "pair", "rows"):
        return (TYPE_COMPLETION, TYPE_EOS)  # tabular: records and their BOS (completion), EOS
    if shape_of(spec) == "text":
        return (TYPE_COMPLETION, TYPE_EOS) if spec.mask_action("text") == "train" else ()
    types = [TYPE_PROMPT] if spec.mask_action("prompt") == "train" else []
    if spec.mask_action("completion") == "train":
        types += [TYPE_COMPLETION, TYPE_EOS]
    return tuple(types)


@dataclass(frozen=True)
class _Trained:
    """Which texts train under a spec (looked up once per batch, not per record)."""

    text: bool
    prompt: bool
    completion: bool

    @classmethod
    def of(cls, spec: DatasetSpec) -> _Trained:
        return cls(*(spec.mask_action(k) == "train" for k in ("text", "prompt", "completion")))


def example_pieces(
    content: dict[str, Any], spec: DatasetSpec, pt: PinnedTokenizer, trained: _Trained | None = None
) -> list[Piece]:
    info = pt.info
    trained = trained or _Trained.of(spec)
    pieces: list[Piece] = []
    if info.add_bos and info.bos_id is not None:
        pieces.append(Piece(_SPECIAL, "", info.bos_id, False, TYPE_PROMPT))
    if shape_of(spec) == "text":
        pieces.append(Piece(_TEXT, content["text"], 0, trained.text, TYPE_COMPLETION))
        if info.add_eos:
            pieces.append(Piece(_SPECIAL, "", info.eos_id, trained.text, TYPE_EOS))
        return pieces
    inp = spec.input
    for turn in content["turns"]:
        source, completion = turn["prompt"], turn["completion"]
        if inp.space_separator and source:  # gdp's rule; without a prompt no space is added (gdp adds one)
            source, completion = source.rstrip(" "), " " + completion.lstrip(" ") if completion else completion
        prompt = f"{inp.prompt_prefix}{source}{inp.prompt_postfix}"
        if prompt:
            pieces.append(Piece(_TEXT, prompt, 0, trained.prompt, TYPE_PROMPT))
        pieces.append(Piece(_TEXT, completion, 0, trained.completion, TYPE_COMPLETION))
        if info.add_eos:
            pieces.append(Piece(_SPECIAL, "", info.eos_id, trained.completion, TYPE_EOS))
    return pieces


def _first_text_flags(pieces: list[Piece]) -> list[bool]:
    flags, seen = [], False
    for p in pieces:
        flags.append(p.kind == _TEXT and not seen)
        seen = seen or p.kind == _TEXT
    return flags


@dataclass(frozen=True)
class _Prepared:
    """A batch's pieces, before encoding. `is_first` flags each piece that starts its example's text (encoded as
    an input start; later texts as continuations); None when the tokenizer encodes both alike (one call)."""

    per_example: list[list[Piece]]
    flat: list[Piece]
    is_first: list[bool] | None


def _prepare(contents: list[dict[str, Any]], spec: DatasetSpec, pt: PinnedTokenizer) -> _Prepared:
    trained = _Trained.of(spec)
    per_example = [example_pieces(c, spec, pt, trained) for c in contents]
    flat = list(chain.from_iterable(per_example))
    if pt.continuation is pt.encoder:  # one call, texts in record order: ~8% faster than two (less idle tail)
        return _Prepared(per_example, flat, None)
    return _Prepared(per_example, flat, list(chain.from_iterable(_first_text_flags(p) for p in per_example)))


_Ids = list[int] | np.ndarray  # a long text's ids come as an int32 array (encoded in pieces), others as lists
_Encoded = tuple[list[_Ids], list[_Ids]]


def _encode(prep: _Prepared, pt: PinnedTokenizer) -> _Encoded:
    """The ids of the batch's texts: (starts, continuations). The Rust tokenizer runs without the GIL."""
    if prep.is_first is None:
        return pt.encode_texts([p.text for p in prep.flat if p.kind == _TEXT]), []
    flags = prep.is_first
    starts = [p.text for p, f in zip(prep.flat, flags, strict=True) if p.kind == _TEXT and f]
    rests = [p.text for p, f in zip(prep.flat, flags, strict=True) if p.kind == _TEXT and not f]
    return pt.encode_texts(starts), pt.encode_texts(rests, continuation=True)


def _assemble(prep: _Prepared, encoded: _Encoded, spec: DatasetSpec, pt: PinnedTokenizer) -> TokenizedBatch:
    starts, rests = iter(encoded[0]), iter(encoded[1])
    flat = prep.flat
    if prep.is_first is None:
        piece_ids = [next(starts) if p.kind == _TEXT else [p.token_id] for p in flat]
    else:
        piece_ids = [
            (next(starts) if f else next(rests)) if p.kind == _TEXT else [p.token_id]
            for p, f in zip(flat, prep.is_first, strict=True)
        ]
    piece_lens = np.fromiter((len(ids) for ids in piece_ids), dtype=np.int64, count=len(piece_ids))
    if any(type(x) is np.ndarray for x in piece_ids):  # a long text: joined as arrays, never as Python ints
        ids = np.concatenate(piece_ids, dtype=np.int32, casting="same_kind")  # ids < 2**31
    else:
        ids = np.fromiter(chain.from_iterable(piece_ids), dtype=np.int32, count=int(piece_lens.sum()))
    mask = np.repeat(np.fromiter((p.train for p in flat), dtype=np.uint8, count=len(flat)), piece_lens)
    types = np.repeat(np.fromiter((p.token_type for p in flat), dtype=np.uint8, count=len(flat)), piece_lens)
    n = len(prep.per_example)
    owner = np.repeat(np.arange(n), [len(p) for p in prep.per_example])
    lengths = np.bincount(owner, weights=piece_lens, minlength=n).astype(np.int64)
    head = 1 if pt.info.add_bos and pt.info.bos_id is not None else 0
    return apply_overflow(
        ids,
        mask,
        types,
        lengths,
        policy=spec.gold_overflow,
        max_len=spec.sequence.max_seq_len,
        head=head,
        keep_untrained=spec.sequence.keep_prompt_only_sequences,
    )


def tokenize_batch(
    contents: list[dict[str, Any]], spec: DatasetSpec, pt: PinnedTokenizer, chat: ChatTemplate | None = None
) -> TokenizedBatch:
    if shape_of(spec) in ("messages", "pair"):
        return _tokenize_chat(contents, spec, pt, chat or ChatTemplate(pt))
    prep = _prepare(contents, spec, pt)
    return _assemble(prep, _encode(prep, pt), spec, pt)


# batches being encoded while one is assembled, with tiktoken's worker processes: with one, each worker waited for
# the next batch after every batch (measured: 1.6-1.8 s of its 7.3-7.6 s on the 100 MB benchmark); with two, the
# next is already in its pipe. HF encodes in this process' threads: one batch at a time uses every core.
AHEAD_OF_WORKERS = 2


def tokenize_batches(
    items: Iterable[tuple[K, list[dict[str, Any]]]],
    spec: DatasetSpec,
    pt: PinnedTokenizer,
    chat: ChatTemplate | None = None,
) -> Iterator[tuple[K, TokenizedBatch]]:
    """`tokenize_batch` over a stream of (key, contents), pipelined: while a worker thread encodes batch k+1
    (Rust, no GIL), this thread assembles batch k and the caller writes it and reads the next. With tiktoken's
    worker processes, batch k+2 is sent too (`AHEAD_OF_WORKERS`), so they never wait between batches. Same results,
    in order. Chat and preference records are tokenized one batch after the other."""
    if shape_of(spec) in ("messages", "pair"):
        for key, contents in items:
            yield key, tokenize_batch(contents, spec, pt, chat)
        return
    ahead = AHEAD_OF_WORKERS if pt.fast is not None else 1
    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="encode") as pool:
        pending: deque[tuple[K, _Prepared, Future[_Encoded]]] = deque()
        for key, contents in items:
            prep = _prepare(contents, spec, pt)
            pending.append((key, prep, pool.submit(_encode, prep, pt)))
            if len(pending) > ahead:
                k, p, f = pending.popleft()
                yield k, _assemble(p, f.result(), spec, pt)
        while pending:
            k, p, f = pending.popleft()
            yield k, _assemble(p, f.result(), spec, pt)


def chat_examples(
    content: dict[str, Any], spec: DatasetSpec
) -> list[tuple[str | None, list[dict[str, str]], list[bool]]]:
    """(branch, messages, trained flags) of each example of a chat or preference record. A message of `weight` 0
    is not trained whatever its role; the template sees each message's role and content only."""
    train = {role: spec.mask_action(role) == "train" for role in spec.mask_keys}
    default = spec.mask_default == "train"

    def flags(msgs: list[dict[str, Any]]) -> list[bool]:
        return [train.get(m["role"], default) and m.get(WEIGHT, 1) != 0 for m in msgs]

    def shown(msgs: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [{k: v for k, v in m.items() if k != WEIGHT} if WEIGHT in m else m for m in msgs]

    if "messages" in content:
        msgs = content["messages"]
        return [(None, shown(msgs), flags(msgs))]
    prompt = shown(content["prompt"])
    out = []
    for branch in ("chosen", "rejected"):
        msgs = content[branch]
        out.append((branch, prompt + shown(msgs), [False] * len(prompt) + flags(msgs)))
    return out


@dataclass(frozen=True)
class PairPlan:
    limits: np.ndarray  # per example (2 per pair): its length after overflow
    shared: np.ndarray  # per pair: shared prompt tokens left after overflow
    reject: np.ndarray  # per pair: bool, does not fit and cannot be cut without cutting into the responses


def plan_pairs(lengths: np.ndarray, shared: np.ndarray, heads: np.ndarray, max_len: int, policy: str) -> PairPlan:
    """How each preference pair fits one row, its shared prompt (`shared` tokens, head included) identical.

    - fits: nothing cut.
    - truncate_left: the same number of tokens is cut after the head from both branches, only from the
      shared prompt; a pair that would need more is rejected (too_long).
    - truncate_right: the shorter branch is kept whole if the longer one still keeps the shared prompt and a
      token more; otherwise both get half a row.
    - drop: a pair that does not fit is rejected.
    """
    c, r = lengths[0::2], lengths[1::2]
    fits = c + r <= max_len
    head = heads[0::2]
    if policy == "truncate_left":
        cut = np.where(fits, 0, (c + r - max_len + 1) // 2)
        reject = cut > shared - head
        cut = np.where(reject, 0, cut)
        return PairPlan(np.column_stack([c - cut, r - cut]).ravel(), shared - cut, reject)
    if policy == "truncate_right":
        short = np.minimum(c, r)
        keep_short = short + shared + 1 <= max_len
        lim_short = np.where(fits | keep_short, short, max_len // 2)
        lim_long = np.where(fits, np.maximum(c, r), max_len - lim_short)
        c_short = c <= r
        lim_c, lim_r = np.where(c_short, lim_short, lim_long), np.where(c_short, lim_long, lim_short)
        return PairPlan(
            np.column_stack([lim_c, lim_r]).ravel(),
            np.minimum(shared, np.minimum(lim_c, lim_r)),
            np.zeros(len(c), dtype=bool),
        )
    return PairPlan(lengths.copy(), shared, ~fits)


def _shared_prefix(a: EncodedChat, b: EncodedChat, text_a: str, text_b: str) -> int:
    """The shared prompt's tokens: wholly in the renderings' common character prefix, before any trained token."""
    n = len(os.path.commonprefix([text_a, text_b]))
    firsts = [int(np.argmax(e.loss_mask)) if e.loss_mask.any() else len(e.loss_mask) for e in (a, b)]
    return int(min(np.count_nonzero(a.char_ends <= n), np.count_nonzero(b.char_ends <= n), *firsts))


def _tokenize_chat(
    contents: list[dict[str, Any]], spec: DatasetSpec, pt: PinnedTokenizer, chat: ChatTemplate
) -> TokenizedBatch:
    rejects: list[tuple[int, str, str, int]] = []
    rendered, source, branches = [], [], []
    for i, content in enumerate(contents):
        examples = chat_examples(content, spec)
        spans = [chat.spans(msgs, flags, content.get("tools")) for _, msgs, flags in examples]
        bad = next((s for s in spans if isinstance(s, Invalid)), None)
        if bad is not None:
            rejects.append((i, bad.reason, bad.detail, 0))
            continue
        rendered += spans
        source += [i] * len(spans)
        branches += [b for b, _, _ in examples]
    bos = pt.info.bos_id if pt.info.add_bos else None
    encoded = [_with_bos(e, bos) for e in chat.encode(rendered)]
    lengths = np.fromiter((len(e.token_ids) for e in encoded), dtype=np.int64, count=len(encoded))
    heads = np.fromiter(
        (
            int(pt.info.bos_id is not None and len(e.token_ids) > 0 and e.token_ids[0] == pt.info.bos_id)
            for e in encoded
        ),
        dtype=np.int64,
        count=len(encoded),
    )
    paired = shape_of(spec) == "pair"
    limits = shared = None
    lost_pairs: list[tuple[int, int]] = []
    if paired:
        prefix = np.array(
            [
                _shared_prefix(encoded[k], encoded[k + 1], rendered[k].text, rendered[k + 1].text)
                for k in range(0, len(encoded), 2)
            ],
            dtype=np.int64,
        )
        plan = plan_pairs(lengths, prefix, heads, spec.sequence.max_seq_len, spec.sequence.overflow)
        for k in np.flatnonzero(plan.reject):
            n = int(lengths[2 * k] + lengths[2 * k + 1])
            rejects.append(
                (
                    source[2 * k],
                    "too_long",
                    f"the pair has {n} tokens > max_seq_len "
                    f"{spec.sequence.max_seq_len} and its shared prompt ({int(prefix[k])} tokens) is too short "
                    f"to cut ({spec.sequence.overflow})",
                    n,
                )
            )
        keep = np.repeat(~plan.reject, 2)
        lost_pairs = [(source[2 * k], int(lengths[2 * k] + lengths[2 * k + 1])) for k in np.flatnonzero(plan.reject)]
        encoded = [e for e, k in zip(encoded, keep, strict=True) if k]
        source = [x for x, k in zip(source, keep, strict=True) if k]
        branches = [x for x, k in zip(branches, keep, strict=True) if k]
        lengths, heads = lengths[keep], heads[keep]
        limits, shared = plan.limits[keep], np.repeat(plan.shared[~plan.reject], 2)

    def cat(name: str, dtype: type) -> np.ndarray:
        return np.concatenate([getattr(e, name) for e in encoded]) if encoded else np.zeros(0, dtype)

    tb = apply_overflow(
        cat("token_ids", np.int32),
        cat("loss_mask", np.uint8),
        cat("token_type_ids", np.uint8),
        lengths,
        policy=spec.gold_overflow,
        max_len=spec.sequence.max_seq_len,
        head=heads,
        limits=limits,
        pairs=paired,
        keep_untrained=spec.sequence.keep_prompt_only_sequences,
    )
    src = np.array(source, dtype=np.int64)
    seen: set[int] = set()
    for e, reason, detail, n in tb.rejects:  # one reject row per record (a pair is rejected once)
        if int(src[e]) not in seen:
            seen.add(int(src[e]))
            rejects.append((int(src[e]), reason, detail, n))
    rejects.sort()
    lost: dict[int, int] = {}
    for e, n in [*((int(src[e]), n) for e, n in tb.lost or []), *lost_pairs]:
        lost[e] = lost.get(e, 0) + n
    return TokenizedBatch(
        kept=src[tb.kept],
        token_ids=tb.token_ids,
        loss_mask=tb.loss_mask,
        token_type_ids=tb.token_type_ids,
        offsets=tb.offsets,
        rejects=rejects,
        tokens_dropped=int(tb.cut.sum()) + sum(lost.values()),
        cut=tb.cut,
        lost=sorted(lost.items()),
        branches=[branches[e] for e in tb.kept] if paired else None,
        shared_prefix=shared[tb.kept] if shared is not None else None,
        split_at_turn_boundary=sum(encoded[e].split for e in tb.kept.tolist()),
    )


def _with_bos(e: EncodedChat, bos: int | None) -> EncodedChat:
    """Exactly one BOS at the start: added when the tokenizer wants one and the template did not emit it."""
    if bos is None or (len(e.token_ids) and e.token_ids[0] == bos):
        return e
    return EncodedChat(
        np.concatenate([[bos], e.token_ids]).astype(np.int32),
        np.concatenate([[0], e.loss_mask]).astype(np.uint8),
        np.concatenate([[TYPE_PROMPT], e.token_type_ids]).astype(np.uint8),
        np.concatenate([[0], e.char_ends]).astype(np.int64),
        e.split,
    )


def apply_overflow(
    ids: np.ndarray,
    mask: np.ndarray,
    types: np.ndarray,
    lengths: np.ndarray,
    *,
    policy: str,
    max_len: int,
    head: int | np.ndarray = 0,
    limits: np.ndarray | None = None,
    pairs: bool = False,
    keep_untrained: bool = False,
) -> TokenizedBatch:
    """Cut or drop examples longer than their limit, mask each first token, reject untrainable ones.

    `policy` is drop, truncate_right, truncate_left or keep (no limit: `full` packing and windows split
    long examples later). The limit is `max_len` unless `limits` gives one per example. `head` tokens (the
    BOS) always stay at the front: truncate_left keeps them plus the last tokens. With `pairs`, examples 2k
    and 2k+1 are one pair: when one is rejected both are (the reject names the branch). `keep_untrained` (gdp's
    keep_prompt_only_sequences) keeps an example left without a trained token instead of rejecting it.
    """
    n = len(lengths)
    limit = np.full(n, max_len, dtype=np.int64) if limits is None else limits.astype(np.int64)
    if policy == "keep":
        limit = np.maximum(limit, lengths)
    max_len = limit
    heads = np.broadcast_to(np.asarray(head, dtype=np.int64), (n,))
    starts = offsets_from_lengths(lengths)[:-1]
    over = lengths > max_len
    head_len = np.zeros(n, dtype=np.int64)
    keep_start = starts.copy()
    keep_len = lengths.copy()
    rejects: list[tuple[int, str, str, int]] = []
    if policy == "drop":
        keep_len[over] = 0
        rejects.extend(
            (int(i), "too_long", f"{int(lengths[i])} tokens > limit {int(max_len[i])}", int(lengths[i]))
            for i in np.flatnonzero(over)
        )
    elif policy == "truncate_right":
        keep_len[over] = max_len[over]
    elif policy == "truncate_left":
        head_len[over] = heads[over]
        keep_start[over] = starts[over] + lengths[over] - (max_len[over] - heads[over])
        keep_len[over] = max_len[over] - heads[over]
    if over.any():  # each example is its head range followed by its kept range
        range_starts = np.column_stack([starts, keep_start]).ravel()
        range_lens = np.column_stack([head_len, keep_len]).ravel()
        index = ranges_index(range_starts, range_lens)
        out_ids, out_mask, out_types = ids[index], mask[index], types[index]
    else:  # nothing cut: the examples as they are (no gather)
        out_ids, out_mask, out_types = ids, mask.copy(), types
    keep_len = keep_len + head_len
    out_offsets = offsets_from_lengths(keep_len)
    firsts = out_offsets[:-1][keep_len > 0]
    out_mask[firsts] = 0
    loss = segment_sums(out_mask, out_offsets)
    dropped = over if policy == "drop" else np.zeros(n, dtype=bool)
    for i in np.flatnonzero((loss == 0) & ~dropped & (not keep_untrained)):
        cause = (
            f"truncated to {int(max_len[i])} (sequence.overflow {policy}), none of the trained tokens is left"
            if over[i]
            else "no token is trained: the record has no text of a trained role or field (see `mask`"
            " / `mask_default`) beyond the first token, which is never trained"
        )
        rejects.append(
            (int(i), "no_trained_tokens", f"no loss token left of {int(lengths[i])} tokens: {cause}", int(lengths[i]))
        )
    rejected = np.zeros(n, dtype=bool)
    rejected[[r[0] for r in rejects]] = True
    if pairs:
        rejects = [(i, reason, f"{('chosen', 'rejected')[i % 2]}: {detail}", k) for i, reason, detail, k in rejects]
        rejected = np.repeat(rejected.reshape(-1, 2).any(axis=1), 2)
    kept = np.flatnonzero(~rejected)
    if len(kept) < n:
        final_index = ranges_index(out_offsets[:-1][kept], keep_len[kept])
        out_ids, out_mask, out_types = out_ids[final_index], out_mask[final_index], out_types[final_index]
    rejects.sort()
    cut = (lengths - keep_len)[kept]
    # a record rejected after its overflow (dropped, or truncated to nothing trainable) lost its tokens to it
    lost = [(int(i), int(lengths[i])) for i in np.flatnonzero(over & rejected)]
    return TokenizedBatch(
        kept=kept,
        token_ids=out_ids,
        loss_mask=out_mask,
        token_type_ids=out_types,
        offsets=offsets_from_lengths(keep_len[kept]),
        rejects=rejects,
        tokens_dropped=int(cut.sum()) + sum(n for _, n in lost),
        cut=cut,
        lost=lost,
    )
