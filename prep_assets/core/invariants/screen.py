"""The shard gates' screen: one pass over the shards and one over gold, in numpy, that shows every shard row holds
exactly what gold and its own layout say it should; or else sends the gates to their exact DuckDB passes.

Per shard row, the sum (modulo 2^64) of a hash of each of its tokens' (place in the row, id, mask, type,
position, segment), padding included, against the same sum over what the row should hold: the gold tokens its
segments name, laid out as its seq_lengths say (positions from 0 in each segment, segments numbered from 1, each
segment's leading tokens masked: its first, or a window's overlap), then padding (pad id, mask 0, the padding
type, position 0, segment 0) to max_seq_len. A row whose sums agree keeps the rules of `fixed_length`,
`positions_restart`, `padding_masked` and `match_gold`'s checksum, but for odds of about 2^-64 per row.

The screen answers for every row or for none. Whatever it does not expect (a list of another type, a NULL, a
position or segment number out of range, lists of one row that disagree in length, a segment gold lacks or holds
twice, one reaching past its example) makes it answer None, and the gates judge every row exactly, which names
the violations. The two sides read different files and run in two threads; each holds one batch at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prep_assets.core.records import GOLD_SCHEMA, SHARD_SCHEMA, TYPE_PADDING

_log = logging.getLogger(__name__)

_TOKEN_LISTS = ("input_ids", "loss_mask", "token_type_ids", "position_ids", "segment_ids")
_LAYOUT = ("seq_lengths", "example_ids", "example_offsets", "num_loss_tokens")
_GOLD_LISTS = ("token_ids", "loss_mask", "token_type_ids")
# place, position and segment number share one 64-bit word of the hash's input: each below 2^21
_BITS = 21
_CHUNK = 1 << 16  # tokens hashed at once (their arrays stay in cache)
_BATCH_TOKENS = 1 << 21  # tokens read at once a side, unless one row or example holds more
_BATCH_ROWS = 1024

_U = np.uint64
_MIX = (_U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB), _U(0xD6E8FEB86659FD93))


class _Unscreened(Exception):
    """The screen cannot vouch for the shards; the gates judge every row exactly."""


def token_hashes(
    ids: np.ndarray, mask: np.ndarray, types: np.ndarray, place: np.ndarray, pos: np.ndarray, seg: np.ndarray
) -> np.ndarray:
    """uint64 per token of (place, id, mask, type, position, segment): ids int32, mask and types uint8; place,
    position and segment non-negative integers below 2^21 (the caller checks). Both words go through an odd
    multiply and xor-shifts, so tokens swapped between places change the row's sum."""
    w = ids.view(np.uint32).astype(np.uint64)
    w <<= _U(32)
    w |= mask.astype(np.uint64) << _U(8)
    w |= types.astype(np.uint64)
    at = place.astype(np.uint64)
    at |= pos.astype(np.uint64) << _U(_BITS)
    at |= seg.astype(np.uint64) << _U(2 * _BITS)
    at *= _MIX[0]
    at ^= at >> _U(31)
    w ^= at
    w *= _MIX[1]
    w ^= w >> _U(32)
    w *= _MIX[2]
    w ^= w >> _U(29)
    return w


def _values(column: pa.Array, want: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets from 0) of a list column of `want`, with no NULL list or value."""
    if column.type != pa.list_(want) or column.null_count:
        raise _Unscreened
    offsets = np.asarray(column.offsets, dtype=np.int64)
    flat = column.values.slice(offsets[0], offsets[-1] - offsets[0])
    if flat.null_count:
        raise _Unscreened
    return flat.to_numpy(zero_copy_only=False), offsets - offsets[0]


def _in_range(values: np.ndarray) -> None:
    if len(values) and (values.min() < 0 or values.max() >= 1 << _BITS):
        raise _Unscreened


def _schema(pf: pq.ParquetFile, schema: pa.Schema, names: tuple[str, ...]) -> None:
    """The file holds each of `names` as `schema` types it."""
    found = pf.schema_arrow
    for name in names:
        at = found.get_field_index(name)
        if at < 0 or found.field(at).type != schema.field(name).type:
            raise _Unscreened


@dataclass(frozen=True)
class _Gold:
    """Gold's examples: their ids (unique), their num_tokens, and the first example of each row group."""

    path: Path
    keys: pa.Array
    num_tokens: np.ndarray
    group_starts: np.ndarray

    @classmethod
    def read(cls, path: Path) -> _Gold:
        pf = pq.ParquetFile(path)
        _schema(pf, GOLD_SCHEMA, ("example_id", "num_tokens", *_GOLD_LISTS))
        scalars = pf.read(columns=["example_id", "num_tokens"], use_threads=False).combine_chunks()
        keys, num_tokens = (_only_chunk(scalars, name) for name in ("example_id", "num_tokens"))
        if keys.null_count or num_tokens.null_count or pc.count_distinct(keys).as_py() != len(keys):
            raise _Unscreened  # ids that are not unique keys, or a count that is missing
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
        return cls(path, keys, num_tokens.to_numpy().astype(np.int64), np.cumsum([0, *sizes]))

    def longest(self, group: int) -> int:
        """The most tokens an example of row group `group` holds (by num_tokens: it sizes the batches only)."""
        lo, hi = self.group_starts[group], self.group_starts[group + 1]
        return int(self.num_tokens[lo:hi].max()) if hi > lo else 1


@dataclass(frozen=True)
class _Segments:
    """Every segment of every shard row (rows numbered across the files in order): the gold example it names (its
    row in gold), where in it it starts, its length, where in its row it starts, its number in the row (from 1),
    how many of its leading tokens are masked, and its row; and per row, the tokens its segments cover and its
    num_loss_tokens. 28 bytes a segment: ids are looked up in gold file by file, and not kept."""

    example: np.ndarray
    off: np.ndarray
    length: np.ndarray
    at: np.ndarray
    number: np.ndarray
    masked: np.ndarray
    row: np.ndarray
    used: np.ndarray
    loss_tokens: np.ndarray
    rows_per_file: list[int]


def _only_chunk(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks else pa.array([], column.type)


def _segments(files: list[Path], gold: _Gold, max_seq_len: int, overlap: int) -> _Segments:
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("example", "off", "len", "counts", "loss")}
    rows_per_file = []
    for path in files:
        pf = pq.ParquetFile(path)
        _schema(pf, SHARD_SCHEMA, (*_LAYOUT, *_TOKEN_LISTS))
        table = pf.read(columns=list(_LAYOUT), use_threads=False).combine_chunks()
        rows_per_file.append(table.num_rows)
        loss = _only_chunk(table, "num_loss_tokens")
        if loss.null_count:
            raise _Unscreened
        lengths, by_len = _values(_only_chunk(table, "seq_lengths"), pa.int32())
        offs, by_off = _values(_only_chunk(table, "example_offsets"), pa.int32())
        ids = _only_chunk(table, "example_ids")
        id_offsets = np.asarray(ids.offsets, dtype=np.int64)
        flat_ids = ids.values.slice(id_offsets[0], id_offsets[-1] - id_offsets[0])
        if ids.null_count or not (
            np.array_equal(by_len, by_off) and np.array_equal(by_len, id_offsets - id_offsets[0])
        ):
            raise _Unscreened  # a NULL, or lists of one row that disagree in length
        counts = np.diff(by_len)
        if (counts == 0).any():
            raise _Unscreened  # a row of padding only: `positions_restart` judges it exactly
        where = pc.index_in(flat_ids, value_set=gold.keys)  # a NULL id finds nothing
        if where.null_count:
            raise _Unscreened  # a segment names an example gold lacks
        parts["example"].append(where.to_numpy().astype(np.int32))
        parts["off"].append(offs)
        parts["len"].append(lengths)
        parts["counts"].append(counts)
        parts["loss"].append(loss.to_numpy().astype(np.int64))
    empty = np.zeros(0, np.int32)
    example, off, length, counts = (
        np.concatenate(parts[k]) if files else empty for k in ("example", "off", "len", "counts")
    )
    if len(length) and length.min() < 1:
        raise _Unscreened  # a segment of no token (or fewer)
    ends = np.cumsum(length, dtype=np.int64)
    row_first = np.cumsum(counts, dtype=np.int64) - counts  # each row's first segment
    used = np.add.reduceat(length, row_first, dtype=np.int64) if len(length) else np.zeros(0, np.int64)
    if len(used) and used.max() > max_seq_len:
        raise _Unscreened
    row = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    starts = ends - length
    lead = 1 if overlap < 1 else overlap
    return _Segments(
        example=example,
        off=off,
        length=length,
        at=(starts - np.repeat(starts[row_first], counts)).astype(np.int32),  # below max_seq_len
        number=(np.arange(len(length), dtype=np.int64) - np.repeat(row_first, counts) + 1).astype(np.int32),
        masked=np.minimum(length, np.where(off == 0, 1, lead)).astype(np.int32),
        row=row,
        used=used,
        loss_tokens=np.concatenate(parts["loss"]) if files else np.zeros(0, np.int64),
        rows_per_file=rows_per_file,
    )


def _batch_rows(longest: int) -> int:
    """Rows read at once where no row holds more than `longest` tokens: `_BATCH_TOKENS`' worth, at least one."""
    return max(1, min(_BATCH_ROWS, _BATCH_TOKENS // max(1, longest)))


def _batches(path: Path, columns: tuple[str, ...], longest: Callable[[int], int]) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches, read a row group at a time (Arrow's reader over a whole file reads several
    row groups ahead: 120 MB against 15-50 MB over the benchmark's shards), each group's batches sized by the
    longest row `longest(group)` says it holds (one long example slows its own row group only)."""
    pf = pq.ParquetFile(path)
    for group in range(pf.num_row_groups):
        yield from pf.iter_batches(
            row_groups=[group], batch_size=_batch_rows(longest(group)), columns=list(columns), use_threads=False
        )


def _shard_sums(files: list[Path], max_seq_len: int, stop: threading.Event) -> tuple[np.ndarray, np.ndarray]:
    """Per shard row, in file order: the sum of its tokens' hashes, and its loss tokens (its mask's sum). Gives up
    when `stop` is set (the gold side gave up)."""
    L = max_seq_len
    per = max(1, _CHUNK // L)  # rows hashed at once
    place = np.tile(np.arange(1, L + 1, dtype=np.uint64), per)
    sums, losses = [], []
    for path in files:
        for batch in _batches(path, _TOKEN_LISTS, lambda _group: L):
            if stop.is_set():
                raise _Unscreened
            cols = []
            for name in _TOKEN_LISTS:
                values, offsets = _values(batch.column(name), SHARD_SCHEMA.field(name).type.value_type)
                if not (np.diff(offsets) == L).all():
                    raise _Unscreened  # a list of another length than max_seq_len
                cols.append(values)
            ids, mask, types, pos, seg = cols
            _in_range(pos)
            _in_range(seg)
            n = batch.num_rows
            for r in range(0, n, per):
                s, e = r * L, min(n, r + per) * L
                h = token_hashes(ids[s:e], mask[s:e], types[s:e], place[: e - s], pos[s:e], seg[s:e])
                sums.append(h.reshape(-1, L).sum(axis=1, dtype=np.uint64))
            losses.append(mask.reshape(n, L).sum(axis=1, dtype=np.int64))
    empty = np.zeros(0, np.uint64)
    return (np.concatenate(sums) if sums else empty), (np.concatenate(losses) if losses else empty.astype(np.int64))


def _gold_sums(gold: _Gold, segments: _Segments, rows: int) -> np.ndarray:
    """Per shard row: the sum of the hashes of the gold tokens its segments should hold, at their places."""
    order = np.argsort(segments.example, kind="stable")
    ordered = segments.example[order]
    out = np.zeros(rows, dtype=np.uint64)
    types = {name: GOLD_SCHEMA.field(name).type.value_type for name in _GOLD_LISTS}
    first = 0
    for batch in _batches(gold.path, _GOLD_LISTS, gold.longest):
        last = first + batch.num_rows
        ids, offsets = _values(batch.column("token_ids"), types["token_ids"])
        mask, by_mask = _values(batch.column("loss_mask"), types["loss_mask"])
        kinds, by_kind = _values(batch.column("token_type_ids"), types["token_type_ids"])
        if not (
            np.array_equal(offsets, by_mask)
            and np.array_equal(offsets, by_kind)
            and np.array_equal(np.diff(offsets), gold.num_tokens[first:last])
        ):
            raise _Unscreened  # gold's lists of one example disagree in length, or with its num_tokens
        lo, hi = np.searchsorted(ordered, [first, last])
        picked = order[lo:hi]
        example = segments.example[picked].astype(np.int64) - first
        first = last
        if not len(picked):
            continue
        off, length = segments.off[picked].astype(np.int64), segments.length[picked].astype(np.int64)
        if (off < 0).any() or (off + length > offsets[example + 1] - offsets[example]).any():
            raise _Unscreened  # a segment starts before its example or runs past its end
        source = offsets[example] + off
        bucket = (np.cumsum(length) - length) // _CHUNK
        for group in np.split(np.arange(len(picked)), np.flatnonzero(np.diff(bucket)) + 1):
            n = length[group]
            starts = np.cumsum(n) - n
            within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(starts, n)
            at = np.repeat(source[group], n) + within
            masked = mask[at]
            masked[within < np.repeat(segments.masked[picked[group]], n)] = 0
            h = token_hashes(
                ids[at],
                masked,
                kinds[at],
                np.repeat(segments.at[picked[group]], n) + within + 1,
                within,
                np.repeat(segments.number[picked[group]], n),
            )
            np.add.at(out, segments.row[picked[group]], np.add.reduceat(h, starts))
    if first != len(gold.num_tokens):
        raise _Unscreened  # gold's lists hold another count of examples than its ids
    return out


def _padding_tails(max_seq_len: int, pad_id: int) -> np.ndarray:
    """For each count of tokens in segments (0..max_seq_len): the sum of the hashes of the padding after them."""
    L = max_seq_len
    h = token_hashes(
        np.full(L, pad_id, dtype=np.int32),
        np.zeros(L, np.uint8),
        np.full(L, TYPE_PADDING, dtype=np.uint8),
        np.arange(1, L + 1, dtype=np.uint64),
        np.zeros(L, np.int64),
        np.zeros(L, np.int64),
    )
    tails = np.zeros(L + 1, dtype=np.uint64)
    tails[:L] = np.cumsum(h[::-1], dtype=np.uint64)[::-1]
    return tails


def screen(files: list[Path], gold: Path, overlap: int, max_seq_len: int, pad_id: int) -> pa.Table | None:
    """Every shard row's (file, row, length) where every row passed the screen, else None (a row failed, or the
    screen stands aside: a file's columns are not the shard or gold schema's, among the rest)."""
    if not 0 < max_seq_len < 1 << _BITS or not np.iinfo(np.int32).min <= pad_id <= np.iinfo(np.int32).max:
        return None
    stop = threading.Event()
    try:
        examples = _Gold.read(gold)
        segments = _segments(files, examples, max_seq_len, overlap)
        rows = sum(segments.rows_per_file)
        with ThreadPoolExecutor(max_workers=1) as pool:
            shard_side = pool.submit(_shard_sums, files, max_seq_len, stop)
            try:
                expected = _gold_sums(examples, segments, rows)
            except BaseException:
                stop.set()  # the shard side stops at its next batch
                raise
            got, losses = shard_side.result()
    except _Unscreened:
        return None
    except (pa.ArrowException, OSError, ValueError) as exc:
        _log.warning("the shard gates' screen could not read its files (%s: %s)", type(exc).__name__, exc)
        return None
    if len(got) != rows or not np.array_equal(losses, segments.loss_tokens):
        return None
    if not np.array_equal(got, expected + _padding_tails(max_seq_len, pad_id)[segments.used]):
        return None
    names = pa.array([str(p) for p in files], pa.string())
    return pa.table(
        {
            "file": names.take(np.repeat(np.arange(len(files)), segments.rows_per_file)) if files else names,
            "row": pa.array(
                np.concatenate([np.arange(n, dtype=np.int64) for n in segments.rows_per_file])
                if files
                else np.zeros(0, np.int64)
            ),
            "length": pa.array(np.full(rows, max_seq_len, dtype=np.int64)),
        }
    )
