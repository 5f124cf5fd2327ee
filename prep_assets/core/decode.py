"""Decode a packed row back to text with its masked spans, segments and padding marked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.tokenizer import pinned_hf

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MASK_OPEN, MASK_CLOSE = "«", "»"


def tokenizer_dir_for(shard: Path) -> Path:
    """lake/<dataset>/shards/<drop>/<split>/part-*.parquet -> lake/<dataset>/tokenizer."""
    return shard.resolve().parents[3] / "tokenizer"


def _decoder(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    """The pinned tokenizer for decoding only (its encoders for gold are not built: a third of the load time); a
    clear error where nothing is pinned."""
    return pinned_hf(tokenizer_dir)


_ROWS_PER_READ = 64


# what a row needs to be decoded: a packed shard's columns (a gold examples file has no segments)
_SHARD_COLUMNS = ("input_ids", "loss_mask", "segment_ids", "example_ids")


def open_shard(shard: Path, *, pre_buffer: bool = True) -> pq.ParquetFile:
    """A packed shard file, or a clear error: no such file, not Parquet, or Parquet without a shard's columns."""
    if not shard.is_file():
        raise PrepAssetsError(f"{shard}: no such shard file")
    try:
        pf = pq.ParquetFile(str(shard), pre_buffer=pre_buffer)
    except (pa.ArrowException, OSError) as exc:
        raise PrepAssetsError(
            f"{shard}: not a Parquet file ({exc}); give a packed shard, lake/<dataset>/shards/…"
        ) from None
    missing = [c for c in _SHARD_COLUMNS if c not in pf.schema_arrow.names]
    if missing:
        raise PrepAssetsError(
            f"{shard}: not a packed shard (no {', '.join(missing)} column); give a file of lake/<dataset>/shards/"
        )
    return pf


def decode_row(shard: Path, row: int, tokenizer_dir: Path | None = None) -> dict[str, Any]:
    pf = open_shard(shard, pre_buffer=False)
    meta = pf.metadata
    if not 0 <= row < meta.num_rows:
        raise PrepAssetsError(f"{shard}: row {row} out of range (0..{meta.num_rows - 1})")
    # only the row group holding the row (a whole shard file decoded can be GBs), and of it only the batches up
    # to the row
    first = 0
    for group in range(meta.num_row_groups):
        n = meta.row_group(group).num_rows
        if row < first + n:
            break
        first += n
    tok = _decoder(tokenizer_dir or tokenizer_dir_for(shard))
    at = row - first
    for batch in pf.iter_batches(batch_size=_ROWS_PER_READ, row_groups=[group]):
        if at < batch.num_rows:
            return _decode(shard, row, batch.slice(at, 1).to_pylist()[0], tok)
        at -= batch.num_rows
    raise PrepAssetsError(f"{shard}: row group {group} ends before row {row}")  # metadata and data disagree


def decode_rows(shard: Path, tokenizer_dir: Path | None = None) -> Iterator[dict[str, Any]]:
    """Every row of a shard decoded (the file and the tokenizer loaded once)."""
    pf, i = open_shard(shard), 0
    tok = _decoder(tokenizer_dir or tokenizer_dir_for(shard))
    for group in range(pf.metadata.num_row_groups):  # a row group at a time: memory stays bounded
        for r in pf.read_row_group(group).to_pylist():
            yield _decode(shard, i, r, tok)
            i += 1


def _spans(ids: np.ndarray, mask: np.ndarray, tok: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """`ids` decoded as runs of equal loss mask: each run's text, token count and whether it is trained."""
    spans = []
    start = 0
    while start < len(ids):
        end = start
        while end + 1 < len(ids) and mask[end + 1] == mask[start]:
            end += 1
        tokens = ids[start : end + 1].tolist()
        text = tok.decode(tokens, skip_special_tokens=False)
        spans.append({"trained": bool(mask[start]), "tokens": len(tokens), "text": text})
        start = end + 1
    return spans


def _decode(shard: Path, row: int, r: dict[str, Any], tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    ids, mask, seg = np.array(r["input_ids"]), np.array(r["loss_mask"]), np.array(r["segment_ids"])
    segments = []
    offsets = r.get("example_offsets") or [0] * len(r["example_ids"])
    for n, (example_id, offset) in enumerate(zip(r["example_ids"], offsets, strict=True), start=1):
        idx = np.flatnonzero(seg == n)
        segments.append(
            {
                "segment": n,
                "example_id": example_id,
                "example_offset": int(offset),
                "tokens": int(len(idx)),
                "spans": _spans(ids[idx], mask[idx], tok),
            }
        )
    return {
        "shard": str(shard),
        "row": row,
        "length": len(ids),
        "num_loss_tokens": int(mask.sum()),
        "padding_tokens": int(np.count_nonzero(seg == 0)),
        "segments": segments,
    }


def marked(spans: list[dict[str, Any]]) -> str:
    """Spans as one text, the masked (untrained) ones in «…»."""
    return "".join(sp["text"] if sp["trained"] else f"{MASK_OPEN}{sp['text']}{MASK_CLOSE}" for sp in spans)


# The UI shows a few thousand characters of an example: only its first tokens are decoded (a 6 MB document's
# 1.4M ids as Python ints, decoded whole, took 240 MiB and seconds to show 2,000 characters)
DECODE_TOKENS = 4096


def decode_examples(
    examples: Path, tokenizer_dir: Path, n: int = 3, max_tokens: int = DECODE_TOKENS
) -> list[dict[str, Any]]:
    """The first `n` gold examples decoded: id, split, counts and spans (masked ones marked by `marked`), each
    from at most its first `max_tokens` tokens (`decoded_tokens`), cut in Arrow before any reaches Python."""
    pf = pq.ParquetFile(str(examples))
    if pf.metadata.num_rows == 0:
        return []
    columns = ["example_id", "split", "token_ids", "loss_mask", "num_tokens", "num_loss_tokens"]
    batch = next(pf.iter_batches(batch_size=n, columns=columns)).slice(0, n)
    cut = {c: pc.list_slice(batch.column(c), 0, max_tokens) for c in ("token_ids", "loss_mask")}
    rows = pa.RecordBatch.from_arrays([cut.get(c, batch.column(c)) for c in columns], names=columns).to_pylist()
    tok = _decoder(tokenizer_dir)
    return [
        {
            **{k: r[k] for k in ("example_id", "split", "num_tokens", "num_loss_tokens")},
            "decoded_tokens": len(r["token_ids"]),
            "spans": _spans(np.array(r["token_ids"]), np.array(r["loss_mask"]), tok),
        }
        for r in rows
    ]


def render_examples(decoded: list[dict[str, Any]], max_chars: int = 2000) -> str:
    """Decoded gold examples as text: a header per example, its text with masked spans in «…», long text cut
    with a note (the UI shows a few examples, not whole documents)."""
    lines = []
    for e in decoded:
        lines.append(
            f"--- {e['example_id']} · {e['split']} · {e['num_tokens']} tokens, {e['num_loss_tokens']} trained "
            f"(masked text in {MASK_OPEN}{MASK_CLOSE}) ---"
        )
        text, left = marked(e["spans"]), []
        if len(text) > max_chars:
            text, left = text[:max_chars], [f"{len(text) - max_chars} more characters"]
        unread = e["num_tokens"] - e.get("decoded_tokens", e["num_tokens"])  # tokens past those decoded
        left += [f"{unread} more tokens"] if unread > 0 else []
        lines.append(text + (f"\n… ({' and '.join(left)})" if left else ""))
    return "\n".join(lines)


def render_text(decoded: dict[str, Any]) -> str:
    """Human-readable: masked text in «…», one header line per segment, padding counted at the end."""
    lines = [
        f"{decoded['shard']} row {decoded['row']}: {decoded['length']} tokens, "
        f"{decoded['num_loss_tokens']} trained, {decoded['padding_tokens']} padding "
        f"(masked text in {MASK_OPEN}{MASK_CLOSE})"
    ]
    for s in decoded["segments"]:
        where = f" from token {s['example_offset']}" if s["example_offset"] else ""
        lines.append(f"--- segment {s['segment']} · {s['example_id']}{where} · {s['tokens']} tokens ---")
        lines.append(marked(s["spans"]))
    if decoded["padding_tokens"]:
        lines.append(f"--- padding × {decoded['padding_tokens']} ---")
    return "\n".join(lines)
