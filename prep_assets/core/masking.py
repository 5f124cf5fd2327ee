"""Tokenize + mask: content records to token ids, loss masks and token types, in batches.

Rules (DESIGN §4): text trains on every token; instruction masks prompts and trains completions,
with one EOS after each completion, trained. At most one BOS, at the start. Special-token strings in
content are encoded as plain text. The first token of every example has loss_mask 0: in a packed row
it starts a segment and has no context to be predicted from. Overflow beyond `max_seq_len` follows
`sequence.overflow`; an example left without a trained token is rejected (`no_trained_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from prep_assets.core.arrays import offsets_from_lengths, ranges_index
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.tokenizer import PinnedTokenizer

_TEXT, _SPECIAL = 0, 1


@dataclass(frozen=True)
class Piece:
    """A span of an example: a text to encode, or one special token id."""

    kind: int
    text: str
    token_id: int
    train: bool
    token_type: int


@dataclass(frozen=True)
class TokenizedBatch:
    """Kept examples as flat arrays with offsets, plus the rejected ones."""

    kept: np.ndarray  # indices into the input batch
    token_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    token_type_ids: np.ndarray  # uint8
    offsets: np.ndarray  # int64, len(kept) + 1
    rejects: list[tuple[int, str, str, int]]  # (index, reason, detail, num_tokens before overflow)
    tokens_dropped: int  # tokens removed by truncation or dropped examples


def trainable_types(spec: DatasetSpec) -> tuple[int, ...]:
    """The token types that may carry loss under this spec (what the mask/type gate allows)."""
    if spec.input.type == "text":
        return (TYPE_COMPLETION, TYPE_EOS) if spec.mask_action("text") == "train" else ()
    types = [TYPE_PROMPT] if spec.mask_action("prompt") == "train" else []
    if spec.mask_action("completion") == "train":
        types += [TYPE_COMPLETION, TYPE_EOS]
    return tuple(types)


def example_pieces(content: dict[str, Any], spec: DatasetSpec, pt: PinnedTokenizer) -> list[Piece]:
    info = pt.info
    pieces: list[Piece] = []
    if info.add_bos and info.bos_id is not None:
        pieces.append(Piece(_SPECIAL, "", info.bos_id, False, TYPE_PROMPT))
    if spec.input.type == "text":
        train = spec.mask_action("text") == "train"
        pieces.append(Piece(_TEXT, content["text"], 0, train, TYPE_COMPLETION))
        if info.add_eos:
            pieces.append(Piece(_SPECIAL, "", info.eos_id, train, TYPE_EOS))
        return pieces
    inp = spec.input
    train_prompt = spec.mask_action("prompt") == "train"
    train_completion = spec.mask_action("completion") == "train"
    for turn in content["turns"]:
        prompt = f"{inp.prompt_prefix}{turn['prompt']}{inp.prompt_postfix}"
        if prompt:
            pieces.append(Piece(_TEXT, prompt, 0, train_prompt, TYPE_PROMPT))
        pieces.append(Piece(_TEXT, turn["completion"], 0, train_completion, TYPE_COMPLETION))
        if info.add_eos:
            pieces.append(Piece(_SPECIAL, "", info.eos_id, train_completion, TYPE_EOS))
    return pieces


def _first_text_flags(pieces: list[Piece]) -> list[bool]:
    flags, seen = [], False
    for p in pieces:
        flags.append(p.kind == _TEXT and not seen)
        seen = seen or p.kind == _TEXT
    return flags


def tokenize_batch(contents: list[dict[str, Any]], spec: DatasetSpec, pt: PinnedTokenizer) -> TokenizedBatch:
    per_example = [example_pieces(c, spec, pt) for c in contents]
    flat_pieces = list(chain.from_iterable(per_example))
    # The first text of an example is encoded as an input start; every later one as a continuation.
    first = [_first_text_flags(p) for p in per_example]
    is_first = list(chain.from_iterable(first))
    starts = iter(pt.encode_batch([p.text for p, f in zip(flat_pieces, is_first) if p.kind == _TEXT and f]))
    rests = iter(pt.encode_batch([p.text for p, f in zip(flat_pieces, is_first) if p.kind == _TEXT and not f],
                                 continuation=True))
    piece_ids = [
        (next(starts) if f else next(rests)) if p.kind == _TEXT else [p.token_id] for p, f in zip(flat_pieces, is_first)
    ]
    piece_lens = np.fromiter((len(ids) for ids in piece_ids), dtype=np.int64, count=len(piece_ids))
    ids = np.fromiter(chain.from_iterable(piece_ids), dtype=np.int32, count=int(piece_lens.sum()))
    mask = np.repeat(np.fromiter((p.train for p in flat_pieces), dtype=np.uint8, count=len(flat_pieces)), piece_lens)
    types = np.repeat(np.fromiter((p.token_type for p in flat_pieces), dtype=np.uint8, count=len(flat_pieces)), piece_lens)
    owner = np.repeat(np.arange(len(contents)), [len(p) for p in per_example])
    lengths = np.bincount(owner, weights=piece_lens, minlength=len(contents)).astype(np.int64)
    head = 1 if pt.info.add_bos and pt.info.bos_id is not None else 0
    return apply_overflow(ids, mask, types, lengths, spec, head=head)


def apply_overflow(
    ids: np.ndarray, mask: np.ndarray, types: np.ndarray, lengths: np.ndarray, spec: DatasetSpec, *, head: int = 0
) -> TokenizedBatch:
    """Cut or drop examples longer than max_seq_len, mask each first token, reject untrainable ones.

    `head` tokens (the BOS) always stay at the front: truncate_left keeps them plus the last tokens.
    """
    max_len = spec.sequence.max_seq_len
    policy = spec.sequence.overflow
    starts = offsets_from_lengths(lengths)[:-1]
    over = lengths > max_len
    head_len = np.zeros(len(lengths), dtype=np.int64)
    keep_start = starts.copy()
    keep_len = lengths.copy()
    rejects: list[tuple[int, str, str, int]] = []
    if policy == "drop":
        keep_len[over] = 0
        rejects.extend(
            (int(i), "too_long", f"{int(lengths[i])} tokens > max_seq_len {max_len}", int(lengths[i]))
            for i in np.flatnonzero(over)
        )
    elif policy == "truncate_right":
        keep_len[over] = max_len
    elif policy == "truncate_left":
        head_len[over] = head
        keep_start[over] = starts[over] + lengths[over] - (max_len - head)
        keep_len[over] = max_len - head
    # each example is its head range followed by its kept range
    range_starts = np.column_stack([starts, keep_start]).ravel()
    range_lens = np.column_stack([head_len, keep_len]).ravel()
    index = ranges_index(range_starts, range_lens)
    keep_len = keep_len + head_len
    out_ids, out_mask, out_types = ids[index], mask[index].copy(), types[index]
    out_offsets = offsets_from_lengths(keep_len)
    firsts = out_offsets[:-1][keep_len > 0]
    out_mask[firsts] = 0
    cum = np.concatenate([[0], np.cumsum(out_mask, dtype=np.int64)])
    loss = cum[out_offsets[1:]] - cum[out_offsets[:-1]]
    dropped = over if policy == "drop" else np.zeros(len(lengths), dtype=bool)
    for i in np.flatnonzero((loss == 0) & ~dropped):
        rejects.append((int(i), "no_trained_tokens", f"no loss token left of {int(lengths[i])} tokens", int(lengths[i])))
    rejected = np.zeros(len(lengths), dtype=bool)
    rejected[[r[0] for r in rejects]] = True
    kept = np.flatnonzero(~rejected)
    final_index = ranges_index(out_offsets[:-1][kept], keep_len[kept])
    rejects.sort()
    return TokenizedBatch(
        kept=kept,
        token_ids=out_ids[final_index],
        loss_mask=out_mask[final_index],
        token_type_ids=out_types[final_index],
        offsets=offsets_from_lengths(keep_len[kept]),
        rejects=rejects,
        tokens_dropped=int(lengths.sum() - keep_len[kept].sum()),
    )
