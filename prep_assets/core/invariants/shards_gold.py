"""Packed-shard invariants that hold the shards against gold: tokens conserved per split with every example
placed as the packing layout requires, and every shard token equal to the gold token it came from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from prep_assets.core.invariants.common import SAMPLE, Outcome, _bound, _files, _rows_in, _violations_in
from prep_assets.core.invariants.screen import screen
from prep_assets.core.invariants.shards import (
    _MOD_2_64,
    _ROWS_NAMED,
    _SEG_AT,
    _no_shards,
    shard_rows,
)
from prep_assets.core.records import TYPE_COMPLETION
from prep_assets.core.sql import connect as sql_connect
from prep_assets.core.sql import joins_as_written


@dataclass(frozen=True)
class Layout:
    """How the packer may place gold examples: what the conservation gates expect (from the spec)."""

    max_seq_len: int
    strategy: str = "bfd"
    overflow: str = "drop"
    overlap: int = 0
    drops_prompt_only_rows: bool = False  # full: rows without a completion token are left out (`shards`)

    @property
    def windowed(self) -> bool:
        return self.overflow == "window" and self.strategy != "full"

    @property
    def params(self) -> dict[str, Any]:
        return {
            "L": self.max_seq_len,
            "overlap": self.overlap,
            "stride": self.max_seq_len - self.overlap,
            "windowed": self.windowed,
        }


_SPLIT_OF_FILE = "regexp_extract(filename, '([a-z]+)/part-[0-9]+\\.parquet$', 1)"
# one row per segment of every shard row: where it came from (example, offset) and where it sits (file, row, seg)
_SEGMENTS = f"""
    SELECT {_SPLIT_OF_FILE} AS split, filename AS file, file_row_number AS row, unnest(example_ids) AS example_id,
           unnest(example_offsets) AS off, unnest(seq_lengths) AS len, generate_subscripts(example_ids, 1) AS seg
    FROM read_parquet($files, filename = true, file_row_number = true)
"""
_NO_SEGMENTS = (
    "(SELECT NULL::VARCHAR AS split, NULL::VARCHAR AS file, NULL::BIGINT AS row, NULL::VARCHAR AS "
    "example_id, NULL::INTEGER AS off, NULL::INTEGER AS len, NULL::BIGINT AS seg WHERE false)"
)
# The pieces each gold example should become, from gold's scalar columns where they suffice: `num_tokens` and
# `num_loss_tokens`, which gold's mask_aligned gate holds equal to the lists (the shards are only built from gold
# that passed it), so no list is decoded for them. Itself ...
_EXPECTED_WHOLE = (
    "SELECT example_id, split, num_tokens AS n, 0 AS k, 0 AS off, num_tokens AS len, true AS kept "
    "FROM read_parquet($g)"
)
# ... or (windowed) its windows that keep a loss token: one, the whole example, where it fits a row (kept if it has
# a loss token); the loss mask is read only for the examples longer than a row
_EXPECTED = """
    WITH g AS (SELECT example_id, split, num_tokens AS n, loss_mask FROM read_parquet($g) WHERE num_tokens > $L),
    w AS (SELECT *, unnest(range(0, 1 + (n - $L + $stride - 1) // $stride)) AS k FROM g),
    e AS (SELECT example_id, split, n, k, k * $stride AS off, least($L, n - k * $stride) AS len,
                 CASE WHEN k = 0 THEN 0 ELSE greatest($overlap, 1) END AS masked, loss_mask FROM w)
    SELECT example_id, split, n, k, off, len,
           coalesce(list_sum(list_slice(loss_mask, off + masked + 1, off + len)), 0) > 0 AS kept
    FROM e
    UNION ALL
    SELECT example_id, split, num_tokens, 0, 0, num_tokens, num_loss_tokens > 0 FROM read_parquet($g)
    WHERE num_tokens <= $L
"""
# per split: gold tokens, and of the expected kept pieces their tokens and those repeated from the previous one
_GOLD_TOTALS = (
    "SELECT split, sum(num_tokens)::BIGINT AS gold, sum(num_tokens)::BIGINT AS tokens, "
    "0::BIGINT AS dropped, 0::BIGINT AS overlap FROM read_parquet($g) GROUP BY split"
)


def _full_gaps(segments: str) -> str:
    """`full` where rows holding no completion token are left out: the CTEs `a` (per example: its segments' first
    offset, end, tokens, overlaps and splits), `g` (gold) and `ga` (per example: its `gaps`, the ranges of its
    tokens in no segment, that hold a completion token, and the tokens of all its gaps). `segments`: our own SQL."""
    return f"""
    s AS (SELECT *, lag(off + len) OVER (PARTITION BY example_id ORDER BY off, file, row) AS prev_end
          FROM {segments}),
    a AS (SELECT example_id, min(off) AS first, max(off + len) AS last_end, sum(len) AS total,
                 count(*) FILTER (prev_end IS NOT NULL AND prev_end > off) AS overlaps,
                 count(DISTINCT split) AS splits, any_value(split) AS shard_split FROM s GROUP BY example_id),
    g AS (SELECT example_id, split, num_tokens AS n FROM read_parquet($g)),
    gaps AS (SELECT example_id, prev_end AS lo, off AS hi FROM s WHERE prev_end < off
             UNION ALL SELECT example_id, 0, first FROM a WHERE first > 0
             UNION ALL SELECT a.example_id, a.last_end, g.n FROM a JOIN g USING (example_id) WHERE a.last_end < g.n
             UNION ALL SELECT example_id, 0, n FROM g ANTI JOIN a USING (example_id) WHERE n > 0),
    gt AS (SELECT gaps.example_id, gaps.hi - gaps.lo AS len,
                  list_contains(e.token_type_ids[gaps.lo + 1 : gaps.hi], $completion) AS trained
           FROM gaps JOIN (SELECT example_id, token_type_ids FROM read_parquet($g)) e USING (example_id)),
    ga AS (SELECT example_id, count(*) FILTER (trained) AS trained_gaps, sum(len) AS gap_tokens
           FROM gt GROUP BY example_id)"""


_EXPECTED_TOTALS = """
    WITH e AS (SELECT * FROM expected WHERE kept),
    r AS (SELECT split, len, greatest(0, coalesce(lag(off + len) OVER (PARTITION BY example_id ORDER BY off), 0)
                                         - off) AS repeated FROM e),
    t AS (SELECT split, sum(len)::BIGINT AS tokens, sum(repeated)::BIGINT AS overlap FROM r GROUP BY split),
    g AS (SELECT split, sum(n)::BIGINT AS gold FROM expected WHERE k = 0 GROUP BY split)
    SELECT g.split, g.gold, coalesce(t.tokens, 0) AS tokens, g.gold - coalesce(t.tokens - t.overlap, 0) AS dropped,
           coalesce(t.overlap, 0) AS overlap
    FROM g LEFT JOIN t USING (split)
"""


def shards_tokens_conserved(
    files: list[Path], gold_dir: Path, layout: Layout, reported: dict[str, Any] | None = None
) -> Outcome:
    """Every gold example is in the shards exactly as the layout says, and the token counts add up per split.

    bfd/ffd/single: each example is one segment at offset 0. Windows: the example's windows that keep a loss
    token, at offsets k * (max_seq_len - overlap). full: the example's segments tile it from 0 to its length.
    Per split: shard tokens = gold tokens - tokens dropped by packing + overlap tokens; and `reported` (the
    shards' stats.json splits), where given, must carry the same dropped and overlap figures.
    """
    p = {"g": str(gold_dir / "examples.parquet"), "completion": TYPE_COMPLETION, **layout.params}
    if files:
        p["files"] = _files(files)
    segments = f"({_SEGMENTS})" if files else _NO_SEGMENTS
    if layout.strategy == "full":
        sql = f"""
            WITH s AS (SELECT *, lag(off + len) OVER (PARTITION BY example_id ORDER BY off, file, row) AS prev_end
                       FROM {segments}),
            a AS (SELECT example_id, min(off) AS first, max(off + len) AS last_end, sum(len) AS total,
                         count(*) FILTER (prev_end IS NOT NULL AND prev_end <> off) AS gaps,
                         count(DISTINCT split) AS splits, any_value(split) AS shard_split FROM s GROUP BY example_id),
            g AS (SELECT example_id, split, num_tokens AS n FROM read_parquet($g))
            SELECT coalesce(g.example_id, a.example_id) AS example_id, g.n AS gold_tokens, a.total AS shard_tokens,
                   a.first, a.last_end, a.gaps, g.split, a.shard_split
            FROM g FULL OUTER JOIN a USING (example_id)
            WHERE a.example_id IS NULL OR g.example_id IS NULL OR a.first <> 0 OR a.last_end <> g.n
               OR a.total <> g.n OR a.gaps > 0 OR a.splits <> 1 OR a.shard_split <> g.split
        """
        expected_sql = _GOLD_TOTALS
        if layout.drops_prompt_only_rows:  # segments in order, within the example; what none holds is untrained
            gaps = _full_gaps(segments)
            sql = f"""
                WITH {gaps}
                SELECT coalesce(g.example_id, a.example_id) AS example_id, g.n AS gold_tokens, a.total AS shard_tokens,
                       a.first, a.last_end, coalesce(ga.trained_gaps, 0) AS gaps, a.overlaps, g.split, a.shard_split
                FROM g FULL OUTER JOIN a USING (example_id) LEFT JOIN ga USING (example_id)
                WHERE g.example_id IS NULL OR a.first < 0 OR a.last_end > g.n OR a.overlaps > 0 OR a.splits <> 1
                   OR a.shard_split <> g.split OR coalesce(ga.trained_gaps, 0) > 0
            """
            expected_sql = f"""
                WITH {gaps}
                SELECT g.split, sum(g.n)::BIGINT AS gold,
                       (sum(g.n) - coalesce(sum(ga.gap_tokens), 0))::BIGINT AS tokens,
                       coalesce(sum(ga.gap_tokens), 0)::BIGINT AS dropped, 0::BIGINT AS overlap
                FROM g LEFT JOIN ga USING (example_id) GROUP BY g.split
            """
    else:
        sql = f"""
            WITH e AS (SELECT * FROM expected WHERE kept),
            s AS (SELECT *, count(*) OVER (PARTITION BY example_id, off) AS copies FROM {segments})
            SELECT coalesce(e.example_id, s.example_id) AS example_id, coalesce(e.off, s.off) AS offset,
                   e.len AS expected_tokens, s.len AS shard_tokens, e.split, s.split AS shard_split, s.copies
            FROM e FULL OUTER JOIN s ON e.example_id = s.example_id AND e.off = s.off
            WHERE e.example_id IS NULL OR s.example_id IS NULL OR e.len <> s.len OR e.split <> s.split
               OR s.copies > 1
        """
        expected_sql = _EXPECTED_TOTALS if layout.windowed else _GOLD_TOTALS  # whole examples: nothing dropped
    with sql_connect() as con:
        if layout.strategy != "full":  # the pieces both queries compare with, worked out once
            pieces = _EXPECTED if layout.windowed else _EXPECTED_WHOLE
            create = f"CREATE TEMP TABLE expected AS {pieces}"
            con.execute(create, _bound(create, p))
        n, bad = _violations_in(con, f"({sql})", "true", "*", p, order="example_id")
        expected = {r["split"]: r for r in _rows_in(con, expected_sql, p)}
        shard = {
            r["split"]: r["tokens"]
            for r in _rows_in(con, f"SELECT split, sum(len)::BIGINT AS tokens FROM {segments} GROUP BY split", p)
        }
    gold = {split: r["gold"] for split, r in expected.items()}
    offending: list[dict[str, Any]] = []
    for split in sorted(set(expected) | set(shard)):
        e = expected.get(split, {})
        want = gold.get(split, 0) - (e.get("dropped") or 0) + (e.get("overlap") or 0)
        if want != shard.get(split, 0) or (e.get("tokens") or 0) != shard.get(split, 0):
            offending.append(
                {
                    "split": split,
                    "gold_tokens": gold.get(split, 0),
                    "dropped": e.get("dropped"),
                    "overlap": e.get("overlap"),
                    "expected": want,
                    "shard_tokens": shard.get(split, 0),
                }
            )
        r = (reported or {}).get(split)
        if r is not None and (r["tokens_dropped_by_packing"], r["overlap_tokens"]) != (
            e.get("dropped") or 0,
            e.get("overlap") or 0,
        ):
            offending.append(
                {
                    "split": split,
                    "reported_dropped": r["tokens_dropped_by_packing"],
                    "reported_overlap": r["overlap_tokens"],
                    "dropped": e.get("dropped"),
                    "overlap": e.get("overlap"),
                }
            )
    facts = {
        s: {
            "gold_tokens": gold.get(s, 0),
            "shard_tokens": shard.get(s, 0),
            "tokens_dropped_by_packing": expected.get(s, {}).get("dropped") or 0,
            "overlap_tokens": expected.get(s, {}).get("overlap") or 0,
        }
        for s in sorted(set(gold) | set(shard))
    }
    return Outcome(n + len(offending), (offending + bad)[:SAMPLE], facts)


# every segment of the shard rows in `shard_rows` (a CTE the query defines), with its slices of the row's lists
_SEGMENTS_WITH_SLICES = f"""
    SELECT filename AS file, file_row_number AS row, unnest(list_transform(
        generate_series(1, len(example_ids)), lambda k: struct_pack(
            seg := k, example_id := example_ids[k], off := example_offsets[k], len := seq_lengths[k],
            at := {_SEG_AT},
            ids := input_ids[{_SEG_AT} + 1 : {_SEG_AT} + seq_lengths[k]],
            m := loss_mask[{_SEG_AT} + 1 : {_SEG_AT} + seq_lengths[k]],
            typ := token_type_ids[{_SEG_AT} + 1 : {_SEG_AT} + seq_lengths[k]]))) AS s
    FROM shard_rows"""

# Gold meets the shard segments in two ways. An example of up to GOLD_CHUNK tokens is joined whole (its lists go
# with each segment it fills: a few rows' worth). A longer one is unnested to one row per token, joined to its
# segments by the chunk of GOLD_CHUNK tokens it falls in, and summed per segment: a join carries each matching
# row's lists, so a long document's whole lists would go along once per segment it fills. The joins run as written
# (`joins_as_written`): segments are the hash tables, gold's lists and tokens stream past.
GOLD_CHUNK = 4096
# a segment longer than this is broken (no row is that long); it bounds the chunks one corrupt length asks for
SEGMENT_CAP = 1 << 24
# `_HASHES`, the CTEs of `seg_gold` (file, row, seg, broken, h) from the segments `n` (file, row, seg, example_id,
# off, len, at, k0): per segment, the sum of per-token hashes of (position in the row, id, mask, type) over the gold
# tokens it should hold, its first k0 tokens masked; `broken` where it names no gold example, starts before it or
# runs past its end. Routed by num_tokens (gold's mask_aligned gate holds it equal to the lists); either route
# judges the lists. The token hash is `shards._ROW_HASH`'s, with the mask of the segment's first k0 tokens as 0.
_HASHES = """
    gi AS (SELECT example_id, num_tokens > $C AS long FROM read_parquet($g)),
    nk AS (SELECT n.*, gi.long FROM n LEFT JOIN gi ON gi.example_id = n.example_id),
    short AS (SELECT nk.file, nk.row, nk.seg, nk.off < 0 OR nk.off + nk.len > len(g.token_ids) AS broken,
                     coalesce(list_sum(list_transform(list_zip(g.token_ids[nk.off + 1 : nk.off + nk.len],
                                                               g.loss_mask[nk.off + 1 : nk.off + nk.len],
                                                               g.token_type_ids[nk.off + 1 : nk.off + nk.len]),
                         lambda x, i: hash((nk."at" + i)::BIGINT, (x[1])::BIGINT,
                                           (CASE WHEN i <= nk.k0 THEN 0 ELSE x[2] END)::BIGINT,
                                           (x[3])::BIGINT))), 0)::HUGEINT AS h
              FROM (SELECT example_id, token_ids, loss_mask, token_type_ids FROM read_parquet($g)
                    WHERE num_tokens <= $C) g JOIN nk ON g.example_id = nk.example_id
              WHERE NOT nk.long),
    pc AS (SELECT file, row, seg, example_id, off, len, "at", k0,
                  unnest(range(off // $C, (off + CASE WHEN len > $cap THEN $cap WHEN len < 1 THEN 1
                                                      ELSE len END - 1) // $C + 1)) AS c
           FROM nk WHERE nk.long),  -- CASE, not greatest/least, which skip NULLs: no length, no chunks
    lt AS (SELECT example_id, unnest(token_ids) AS t, unnest(loss_mask) AS tm, unnest(token_type_ids) AS ty,
                  generate_subscripts(token_ids, 1) AS j FROM read_parquet($g) WHERE num_tokens > $C),
    lsum AS (SELECT pc.file, pc.row, pc.seg, count(*) AS matched,
                    sum(hash((pc."at" + lt.j - pc.off)::BIGINT, (lt.t)::BIGINT,
                             (CASE WHEN lt.j - pc.off <= pc.k0 THEN 0 ELSE lt.tm END)::BIGINT,
                             (lt.ty)::BIGINT))::HUGEINT AS h
             FROM lt JOIN pc ON lt.example_id = pc.example_id AND (lt.j - 1) // $C = pc.c
                            AND lt.j > pc.off AND lt.j <= pc.off + pc.len
             GROUP BY pc.file, pc.row, pc.seg),
    seg_gold AS (SELECT file, row, seg, broken, h FROM short
                 UNION ALL
                 SELECT nk.file, nk.row, nk.seg, nk.off < 0 OR nk.len > $cap
                        OR coalesce(lsum.matched, 0) <> nk.len, coalesce(lsum.h, 0)::HUGEINT
                 FROM nk LEFT JOIN lsum ON lsum.file = nk.file AND lsum.row = nk.row AND lsum.seg = nk.seg
                 WHERE nk.long
                 UNION ALL
                 SELECT file, row, seg, true, 0::HUGEINT FROM nk WHERE nk.long IS NULL)"""


# Per shard row: the sum of `_HASHES`' token hashes over the gold tokens its segments should hold, at their places in
# the row, the segments' leading tokens (the first; a window's overlap) masked; `broken` when a segment names no
# gold example or reaches past its end. `_ROW_SUMS_HEAD` + `_HASHES` + `_ROW_SUMS_TAIL`.
_ROW_SUMS_HEAD = f"""
    WITH s AS (SELECT filename AS file, file_row_number AS row, unnest(example_ids) AS example_id,
                      unnest(example_offsets) AS off, unnest(seq_lengths) AS len,
                      unnest(list_transform(generate_series(1, len(seq_lengths)), lambda k: {_SEG_AT})) AS "at",
                      unnest(range(1, 1 + greatest(len(example_ids), len(example_offsets), len(seq_lengths)))) AS seg
               FROM read_parquet($files, filename = true, file_row_number = true)),
    n AS (SELECT *, least(len, CASE WHEN off = 0 THEN 1 ELSE greatest($overlap, 1) END) AS k0 FROM s),"""
_ROW_SUMS_TAIL = f"""
    SELECT file, row, bool_or(broken) AS broken, (sum(h) {_MOD_2_64})::UBIGINT AS h FROM seg_gold GROUP BY file, row"""
# `shard_rows`' checksum of each row, over the gold tokens it should hold
_GOLD_ROW_SUMS = _ROW_SUMS_HEAD + _HASHES + _ROW_SUMS_TAIL
# `screened_rows`' column: every row passed the screen
SCREENED = "screened"
# the parts of `shard_rows` the screen stands in for, when all of them are asked for
SCREENED_PARTS = frozenset({"layout", "checksum", "padding"})


def _against_gold(files: list[Path], gold_dir: Path, overlap: int) -> dict[str, Any]:
    """The parameters of `_HASHES` and the row sums: the shards, gold, the overlap, the chunk and the cap (read
    when called: tests set a small GOLD_CHUNK)."""
    return {
        "files": _files(files),
        "g": str(gold_dir / "examples.parquet"),
        "overlap": overlap,
        "C": GOLD_CHUNK,
        "cap": SEGMENT_CAP,
    }


def screened_rows(
    files: list[Path], gold_dir: Path, overlap: int, max_seq_len: int, pad_id: int, parts: Iterable[str]
) -> pa.Table:
    """`shard_rows` of `parts` (all of "layout", "checksum" and "padding", and maybe "fixed") through the screen:
    where every row passes it, no row broken or suspect of any rule (a `SCREENED` column, all true, says so to
    match_gold); else the exact `shard_rows` of every row, as each gate judged alone reads
    them. A screen that cannot read its files logs why, and leaves the gates their exact pass."""
    screened = screen(files, gold_dir / "examples.parquet", overlap, max_seq_len, pad_id)
    if screened is None:
        return shard_rows(files, parts, max_seq_len, pad_id)
    n = screened.num_rows
    false = pa.repeat(pa.scalar(False), n)
    return pa.table(
        {
            "file": screened.column("file"),
            "row": screened.column("row"),
            "length": screened.column("length"),
            "fixed_broken": false,
            "layout_differs": false,
            "h": pa.nulls(n, pa.uint64()),
            "pad_suspect": false,
            SCREENED: pa.repeat(pa.scalar(True), n),
        }
    )


def shards_match_gold(files: list[Path], gold_dir: Path, overlap: int = 0, rows: pa.Table | None = None) -> Outcome:
    """Token by token, every segment equals its gold example's tokens and types at its offset, with the gold
    loss mask except its leading tokens (the first; a window's overlap), which are masked. `rows`: the shards'
    `shard_rows` with "checksum"."""
    if not files:
        return _no_shards()
    # Pass 1, row by row: each row's sum of per-token hashes (position, id, mask, type) against the same sum over
    # the gold tokens its segments should hold (`_HASHES`). Equal tokens give equal sums, so a pass is a
    # pass; a changed token changes its row's sum but for odds of ~1e-19.
    # Pass 2, only for the rows that failed: the same sums segment by segment, to name the bad segments; then the
    # first bad token of the sampled ones. A failed row without a bad listed segment (its seq_lengths cover tokens
    # no segment names) is a violation of its own.
    if rows is not None and SCREENED in rows.column_names:
        return Outcome(0)  # every row passed the screen (`screened_rows` gives the column only then)
    p = _against_gold(files, gold_dir, overlap)
    sums = shard_rows(files, ["checksum"]) if rows is None else rows
    rows_sql = f"""
        SELECT coalesce(a.file, b.file) AS file, coalesce(a.row, b.row) AS row
        FROM shard_sums a FULL OUTER JOIN ({_GOLD_ROW_SUMS}) b ON a.file = b.file AND a.row = b.row
        WHERE coalesce(a.h, 0) <> coalesce(b.h, 0) OR coalesce(b.broken, false)
    """
    with sql_connect() as con, joins_as_written(con):
        con.register("shard_sums", sums.select(["file", "row", "h"]))
        found = con.execute(rows_sql, _bound(rows_sql, p)).fetchall()
    if not found:
        return Outcome(0)
    failed = pa.table(
        {"file": [r[0] for r in found], "row": [r[1] for r in found]},
        schema=pa.schema([("file", pa.string()), ("row", pa.int64())]),
    )
    segments = f"""
        WITH {_ROWS_NAMED},
        segs AS ({_SEGMENTS_WITH_SLICES}),
        n AS (SELECT file, row, s.seg AS seg, s.example_id AS example_id, s.off AS off, s.len AS len, s.at AS "at",
                     least(s.len, CASE WHEN s.off = 0 THEN 1 ELSE greatest($overlap, 1) END) AS k0,
                     coalesce(list_sum(list_transform(list_zip(s.ids, s.m, s.typ), lambda x, i: hash(
                         (s.at + i)::BIGINT, x[1]::BIGINT, x[2]::BIGINT, x[3]::BIGINT))), 0) {_MOD_2_64} AS shard_h
              FROM segs),
        {_HASHES},
        v AS (SELECT n.file, n.row, n.seg, n.example_id, n.off, n.len, n."at", n.k0
              FROM n JOIN seg_gold sg ON sg.file = n.file AND sg.row = n.row AND sg.seg = n.seg
              WHERE coalesce(sg.broken, false) OR n.shard_h <> sg.h {_MOD_2_64})
        SELECT * FROM v
        UNION ALL  -- a failed row where no listed segment differs: its tokens and its segment lists disagree
        SELECT b.file, b.row, NULL, NULL, NULL, NULL, NULL, NULL FROM rows_named b
        WHERE NOT EXISTS (SELECT 1 FROM v WHERE v.file = b.file AND v.row = b.row)
    """
    with sql_connect() as con, joins_as_written(con):
        con.register("rows_named", failed)
        n, bad = _violations_in(con, f"({segments})", "true", "*", p, order="file, row, seg NULLS LAST")
    located = {
        (r["file"], r["row"], r["seg"]): r
        for r in _first_bad_tokens([b for b in bad if b["seg"] is not None], files, gold_dir)
    }
    out = [
        located.get((b["file"], b["row"], b["seg"]))
        or {
            "file": b["file"],
            "row": b["row"],
            "token": None,
            "detail": "the row's tokens covered by seq_lengths differ from the gold tokens its example_ids and "
            "example_offsets name, though no listed segment does (seq_lengths, example_ids and "
            "example_offsets disagree)",
        }
        for b in bad
    ]
    return Outcome(n, out)


def _first_bad_tokens(bad: list[dict[str, Any]], files: list[Path], gold_dir: Path) -> list[dict[str, Any]]:
    """Pass 2, for the sampled failing segments only: the row position of each one's first bad token (the
    segment's first where none differs, e.g. its gold example is missing). Token against token, both unnested."""
    if not bad:  # every sampled failure is a row without a bad listed segment
        return []
    sample = pa.Table.from_pylist(bad)
    sql = f"""
        WITH {_ROWS_NAMED},
        segs AS (SELECT x.file, x.row, x.s FROM ({_SEGMENTS_WITH_SLICES}) x
                 SEMI JOIN sample v ON x.file = v.file AND x.row = v.row AND x.s.seg = v.seg),
        st AS (SELECT v.file, v.row, v.seg, v.example_id, v.off, v.k0, unnest(segs.s.ids) AS sid,
                      unnest(segs.s.m) AS sm, unnest(segs.s.typ) AS styp, generate_subscripts(segs.s.ids, 1) AS x
               FROM sample v JOIN segs ON segs.file = v.file AND segs.row = v.row AND segs.s.seg = v.seg),
        gt AS (SELECT example_id, unnest(token_ids) AS t, unnest(loss_mask) AS tm, unnest(token_type_ids) AS ty,
                      generate_subscripts(token_ids, 1) AS j
               FROM read_parquet($g) WHERE example_id IN (SELECT example_id FROM sample)),
        bad AS (SELECT st.file, st.row, st.seg, min(st.x) AS first
                FROM gt JOIN st ON gt.example_id = st.example_id AND gt.j = st.off + st.x
                WHERE NOT (st.sid = gt.t AND st.styp = gt.ty AND st.sm = CASE WHEN st.x <= st.k0 THEN 0 ELSE gt.tm END)
                GROUP BY st.file, st.row, st.seg)
        SELECT v.file, v.row, v.seg, v.example_id, v.off, v.len, v."at" + coalesce(bad.first, 1) AS token
        FROM sample v LEFT JOIN bad ON bad.file = v.file AND bad.row = v.row AND bad.seg = v.seg
        ORDER BY v.file, v.row, v.seg
    """
    with sql_connect() as con, joins_as_written(con):
        con.register("sample", sample)
        con.register("rows_named", sample)
        cur = con.execute(sql, {"files": _files(files), "g": str(gold_dir / "examples.parquet")})
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
