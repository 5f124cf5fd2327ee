"""Packed-shard invariants judged on the shards alone: rows of fixed length, padding masked, positions restarting
at each segment, utilization, preference pairs in one row; and `shard_rows`, the one pass over the shard rows
that three of them (and `shards_gold.shards_match_gold`) read when judged together."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from prep_assets.core.invariants.common import (
    SAMPLE,
    Outcome,
    _bound,
    _files,
    _query,
    _violating_rows,
    file_problems,
)
from prep_assets.core.records import SHARD_SCHEMA, TYPE_PADDING
from prep_assets.core.sql import connect as sql_connect


def shard_files(shards_dir: Path) -> list[Path]:
    return sorted(shards_dir.glob("*/part-*.parquet"))


def _no_shards() -> Outcome:
    return Outcome(0, [], {"files": 0})


# the shard rows named in the registered table `rows_named` (file, row)
_ROWS_NAMED = """
    shard_rows AS (SELECT r.* FROM read_parquet($files, filename = true, file_row_number = true) r
                   SEMI JOIN rows_named b ON r.filename = b.file AND r.file_row_number = b.row)"""
# the tokens of the shard rows named in `rows_named`
_TOKENS_OF_NAMED = f"""
    WITH {_ROWS_NAMED}
    SELECT filename AS file, file_row_number AS row, unnest(input_ids) AS id, unnest(loss_mask) AS m,
           unnest(position_ids) AS pos, unnest(segment_ids) AS seg, unnest(token_type_ids) AS typ,
           generate_subscripts(input_ids, 1) AS i
    FROM shard_rows
"""


# What three row-level shard gates judge, each an expression over one shard row (with `used`, the tokens its
# seq_lengths cover): `shard_rows` evaluates those asked for in one pass over the shards.
_SEG_AT = "coalesce(list_sum(seq_lengths[1 : k - 1]), 0)"  # where segment k starts in its row (0-based)
# fixed_length: the lists are max_seq_len long, and agree with each other and with num_loss_tokens
# (a NULL list or count breaks it: the other terms are then NULL, which coalesce would read as not broken)
_FIXED_BROKEN = """coalesce((len(input_ids) <> $L OR len(loss_mask) <> $L OR len(position_ids) <> $L
    OR len(segment_ids) <> $L OR len(token_type_ids) <> $L OR list_sum(seq_lengths) > $L
    OR len(seq_lengths) <> len(example_ids) OR len(example_offsets) <> len(example_ids)
    OR coalesce(list_sum(loss_mask), 0) <> num_loss_tokens), false)
    OR input_ids IS NULL OR loss_mask IS NULL OR position_ids IS NULL OR segment_ids IS NULL
    OR token_type_ids IS NULL OR seq_lengths IS NULL OR example_ids IS NULL OR example_offsets IS NULL
    OR num_loss_tokens IS NULL"""
# positions_restart, step one: is the row laid out otherwise than its seq_lengths say (segments 1..k of those
# lengths, positions 0..n-1 in each, zeros after, every segment start masked)? Built only from sane seq_lengths
# (no NULL, none below 1, their sum within the row); any other row is judged token by token.
_LAYOUT_DIFFERS = f"""CASE WHEN list_count(seq_lengths) = len(seq_lengths) AND coalesce(list_min(seq_lengths), 1) >= 1
                   AND coalesce(list_sum(seq_lengths), 0) <= len(segment_ids)
              THEN coalesce(
                   segment_ids <> list_concat(flatten(list_transform(generate_series(1, len(seq_lengths)),
                                       lambda k: list_resize([]::INTEGER[], seq_lengths[k], k::INTEGER))),
                                              list_resize([]::INTEGER[], len(segment_ids) - used, 0))
                   OR position_ids <> list_concat(flatten(list_transform(seq_lengths, lambda n: range(n)::INTEGER[])),
                                                  list_resize([]::INTEGER[], len(segment_ids) - used, 0))
                   OR list_sum(list_transform(generate_series(1, len(seq_lengths)),
                                              lambda k: loss_mask[({_SEG_AT})::BIGINT + 1])) <> 0,
                   true)
              ELSE true END"""
# match_gold, step one: the sum, over the tokens the row's segments cover, of a hash of (position in the row, id,
# mask, type), modulo 2^64 (`shards_gold._GOLD_ROW_SUMS` is the same sum over gold)
_MOD_2_64 = "% 18446744073709551616"
_ROW_HASH = f"""(list_sum(list_transform(list_zip(input_ids, loss_mask, token_type_ids),
                  lambda x, i: CASE WHEN i <= used THEN hash(i::BIGINT, x[1]::BIGINT, x[2]::BIGINT, x[3]::BIGINT)
                                    ELSE 0 END)) {_MOD_2_64})::UBIGINT"""
# padding_masked, step one: could the row's padding break the rule? Where the row is laid out as its seq_lengths say
# (not `layout_differs`), its padding (segment 0) is exactly its tokens past `used`: their ids, masks, positions
# and types compared at once (list_min and list_max skip NULLs: a row holding one is suspect); any other row is
# judged token by token
_PAD_SUSPECT = """layout_differs OR coalesce(
    list_count(input_ids) <> len(input_ids) OR list_count(loss_mask) <> len(loss_mask)
    OR list_count(token_type_ids) <> len(token_type_ids)
    OR list_min(input_ids[used + 1 :]) <> $pad OR list_max(input_ids[used + 1 :]) <> $pad
    OR list_max(loss_mask[used + 1 :]) <> 0 OR list_min(position_ids[used + 1 :]) <> 0
    OR list_max(position_ids[used + 1 :]) <> 0 OR list_min(token_type_ids[used + 1 :]) <> $padding
    OR list_max(token_type_ids[used + 1 :]) <> $padding, false)"""
ROW_PARTS = {
    "fixed": f"{_FIXED_BROKEN} AS fixed_broken",
    "layout": f"{_LAYOUT_DIFFERS} AS layout_differs",
    "checksum": f"{_ROW_HASH} AS h",
    "padding": f"{_PAD_SUSPECT} AS pad_suspect",
}
# each part's column in `shard_rows`
ROW_PART_COLUMNS = {"fixed": "fixed_broken", "layout": "layout_differs", "checksum": "h", "padding": "pad_suspect"}


def shard_rows(
    files: list[Path], parts: Iterable[str], max_seq_len: int | None = None, pad_id: int | None = None
) -> pa.Table:
    """Per shard row (`file`, `row`, `length`), in one pass: `fixed_broken` ("fixed", against `max_seq_len`),
    `layout_differs` ("layout"), `h` ("checksum"), `pad_suspect` ("padding", against `pad_id`). Four gates read
    it, and each pass decodes every list of every row: one pass for all is the cheaper."""
    wanted = set(parts)
    if (
        wanted - set(ROW_PARTS)
        or ("fixed" in wanted and max_seq_len is None)
        or ("padding" in wanted and pad_id is None)
    ):
        raise ValueError(
            f"shard_rows: parts {sorted(wanted)} (of {sorted(ROW_PARTS)}; 'fixed' needs max_seq_len, 'padding' pad_id)"
        )
    # padding reads layout_differs: computed a level below it
    inner = ", ".join(
        ROW_PARTS[p] for p in ("fixed", "layout", "checksum") if p in wanted or p == "layout" and "padding" in wanted
    )
    columns = ", ".join(
        ROW_PARTS["padding"] if p == "padding" else ROW_PART_COLUMNS[p] for p in ROW_PARTS if p in wanted
    )
    sql = f"""SELECT file, row, length, {columns}
              FROM (SELECT *, {inner}
                    FROM (SELECT *, filename AS file, file_row_number AS row, len(input_ids) AS length,
                                 coalesce(list_sum(seq_lengths), 0)::BIGINT AS used
                          FROM read_parquet($files, filename = true, file_row_number = true)))"""
    p = {"files": _files(files), "L": max_seq_len, "pad": pad_id, "padding": TYPE_PADDING}
    with sql_connect() as con:
        return con.sql(sql, params=_bound(sql, p)).to_arrow_table()


def schema_problems(files: list[Path]) -> list[dict[str, str]]:
    """Per file, each column of the shard schema it lacks or holds as another kind (`file_problems`: the token lists
    as lists of integers, `example_ids` as a list of strings, `num_loss_tokens` as an integer), or the file when it
    is no readable Parquet. A pass over such a file would raise, or read the column cast (a float rounded, a string
    '01' as 1): every shard gate names these rather than judging them (`gates.Gate.cannot_read`)."""
    return [p for path in files for p in file_problems(path, SHARD_SCHEMA, nulls=False)]


def shards_fixed_length(files: list[Path], max_seq_len: int, rows: pa.Table | None = None) -> Outcome:
    """Every file holds the token lists as lists of integers (`schema_problems`); every list column of every row
    is max_seq_len long, the lists agree, and num_loss_tokens = sum(loss_mask). `rows`: the shards' `shard_rows`
    with "fixed" (computed here when not given)."""
    if not files:
        return _no_shards()
    problems = schema_problems(files)
    named = {p["file"] for p in problems}
    readable = [f for f in files if str(f) not in named]  # a file lacking a column or of another type: named, not read
    if rows is None and readable:
        rows = shard_rows(readable, ["fixed"], max_seq_len)
    elif rows is not None and named:  # a pass given over every file: its rows of the files named are not judged
        rows = rows.filter(pc.invert(pc.is_in(rows.column("file"), pa.array(sorted(named)))))
    n, bad = 0, []
    if rows is not None:
        n, bad = _violating_rows(
            "shard_rows", "fixed_broken", "file, row, length", {}, order="file, row", tables={"shard_rows": rows}
        )
    facts = {"rows": 0 if rows is None else rows.num_rows, "max_seq_len": max_seq_len}
    return Outcome(n + len(problems), (problems + bad)[:SAMPLE], facts)


def shards_padding_masked(files: list[Path], pad_id: int, rows: pa.Table | None = None) -> Outcome:
    """Every token of segment 0 (padding) is the pad id, of the padding type, at position 0, with mask 0.
    `rows`: the shards' `shard_rows` with "padding" (computed here when not given)."""
    if not files:
        return _no_shards()
    # Two steps: the rows whose padding could break the rule (`_PAD_SUSPECT`; normally none), then those token by
    # token.
    rows = shard_rows(files, ["padding"], pad_id=pad_id) if rows is None else rows
    suspect = rows.filter(rows.column("pad_suspect")).select(["file", "row"])  # never NULL (coalesce)
    if suspect.num_rows == 0:
        return Outcome(0)
    p = {"files": _files(files), "pad": pad_id, "padding": TYPE_PADDING}
    where = "seg = 0 AND NOT coalesce(m = 0 AND id = $pad AND typ = $padding AND pos = 0, false)"  # NULL breaks it
    n, bad = _violating_rows(
        f"({_TOKENS_OF_NAMED})",
        where,
        "file, row, i AS token",
        p,
        order="file, row, i",
        tables={"rows_named": suspect},
    )
    return Outcome(n, bad)


def shards_positions_restart(files: list[Path], rows: pa.Table | None = None) -> Outcome:
    """Positions are 0 at each segment start and +1 inside it; segments are 1..k; segment starts are masked; the
    segments are the ones seq_lengths lists (else tokens past them, still numbered and trained, would pass every
    gate: the others judge the tokens seq_lengths covers). `rows`: the shards' `shard_rows` with "layout"."""
    if not files:
        return _no_shards()
    # Two steps. First, whole lists compared at once (`shard_rows`): a row laid out exactly as its seq_lengths say
    # keeps the rule, so only the other rows go on. Then, on the rows that
    # went on (normally none), the rule token by token: the indices of the tokens that break it; a row that went on
    # and breaks no token rule has segments other than its seq_lengths: a violation of its own.
    rows = shard_rows(files, ["layout"]) if rows is None else rows
    differs = rows.filter(rows.column("layout_differs")).select(["file", "row"])  # never NULL (CASE ... ELSE true)
    if differs.num_rows == 0:
        return Outcome(0)
    sql = f"""
        WITH {_ROWS_NAMED},
        c AS (SELECT filename AS file, file_row_number AS row, segment_ids, position_ids, loss_mask FROM shard_rows),
        v AS (SELECT file, row, token, segment_ids[token] AS seg, position_ids[token] AS pos, loss_mask[token] AS m,
                     NULL::VARCHAR AS detail FROM (
            SELECT file, row, segment_ids, position_ids, loss_mask,
                   unnest(list_filter(generate_series(1, len(segment_ids)), lambda i:
                       segment_ids[i] > 0 AND (
                           ((i = 1 OR segment_ids[i] <> segment_ids[i - 1])
                            AND (position_ids[i] <> 0 OR loss_mask[i] <> 0
                                 OR segment_ids[i] <> (CASE WHEN i = 1 THEN 0 ELSE segment_ids[i - 1] END) + 1))
                           OR (i > 1 AND segment_ids[i] = segment_ids[i - 1]
                               AND position_ids[i] <> position_ids[i - 1] + 1)))) AS token
            FROM c))
        SELECT * FROM v
        UNION ALL  -- a row that went on and keeps the rule token by token: its segments are not its seq_lengths
        SELECT file, row, NULL, NULL, NULL, NULL,
               'segment_ids lay out other segments than seq_lengths lists (their number or lengths differ, or '
               || 'seq_lengths is not a list of lengths >= 1 within the row)' FROM c
        WHERE NOT EXISTS (SELECT 1 FROM v WHERE v.file = c.file AND v.row = c.row)
    """
    n, bad = _violating_rows(
        f"({sql})", "true", "*", {"files": _files(files)}, order="file, row, token", tables={"rows_named": differs}
    )
    return Outcome(n, bad)


def shards_pairs_together(files: list[Path], gold_dir: Path) -> Outcome:
    """Both examples of a preference pair are in the same row (so the same file, row group and split)."""
    if not files:
        return _no_shards()
    sql = """
        WITH s AS (SELECT filename AS file, file_row_number AS row, unnest(example_ids) AS example_id
                   FROM read_parquet($files, filename = true, file_row_number = true)),
             g AS (SELECT example_id, pair_id FROM read_parquet($g) WHERE pair_id IS NOT NULL)
        SELECT pair_id, count(DISTINCT (file, row)) AS rows, min(file) AS file, min(row) AS row
        FROM g JOIN s USING (example_id) GROUP BY pair_id HAVING count(DISTINCT (file, row)) <> 1
    """
    p = {"files": _files(files), "g": str(gold_dir / "examples.parquet")}
    n, bad = _violating_rows(f"({sql})", "true", "*", p, order="pair_id")
    return Outcome(n, bad)


def shards_utilization(files: list[Path], max_seq_len: int, min_utilization: float) -> Outcome:
    """Tokens in segments / (rows * max_seq_len) >= `min_utilization`."""
    if not files:
        return _no_shards()
    # the tokens in segments, from seq_lengths (one short list per row, not the row-long segment_ids);
    # fixed_length bounds their sum, tokens_conserved holds them against gold
    row = _query(
        "SELECT count(*) AS rows, coalesce(sum(list_sum(seq_lengths)), 0)::BIGINT AS tokens FROM read_parquet($files)",
        {"files": _files(files)},
    )[0]
    util = row["tokens"] / (row["rows"] * max_seq_len) if row["rows"] else 0.0
    facts = {"sequence_utilization": round(util, 6), "min_sequence_utilization": min_utilization, **row}
    return Outcome(int(util < min_utilization), [], facts)
