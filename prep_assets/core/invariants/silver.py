"""Silver invariants: kept records unique (within the drop, and across drops for `dedup_scope: dataset`), within
the length bounds, each in the split the spec draws for it, and every bronze record accounted for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prep_assets.core.invariants.common import (
    _LOCATION,
    SAMPLE,
    Outcome,
    _one_to_one,
    _query,
    _scalar,
    _violating_rows,
)
from prep_assets.core.spec_sections import SplitSpec

# the upper bound where `clean.max_chars` sets none: past any record's length
_NO_MAX_CHARS = 2**62


def silver_unique(silver_dir: Path) -> Outcome:
    """No two kept records have the same content (hash and bytes; within the drop)."""
    # same content => same hash: contents are grouped only for hashes held more than once (grouping every
    # content holds a drop's text in memory)
    source = (
        "(SELECT content_sha256, list(record_id ORDER BY source_line) AS record_ids, count(*) AS copies "
        "FROM read_parquet($s) WHERE content_sha256 IN "
        "(SELECT content_sha256 FROM read_parquet($s) GROUP BY content_sha256 HAVING count(*) > 1) "
        "GROUP BY content_sha256, content)"
    )
    n, dup = _violating_rows(
        source,
        "copies > 1",
        "content_sha256, record_ids, copies",
        {"s": str(silver_dir / "records.parquet")},
        order="content_sha256",
    )
    return Outcome(n, dup)


def silver_unique_across_drops(silver_dir: Path, earlier: list[Path]) -> Outcome:
    """No kept record's content is held by an earlier drop's dedup index (dedup_scope: dataset); an index that
    is missing fails the check (it cannot be verified)."""
    missing = [str(p) for p in earlier if not p.is_file()]
    facts: dict[str, Any] = {"earlier_drops": len(earlier)}
    if missing:
        return Outcome(len(missing), [{"missing_index": m} for m in missing[:SAMPLE]], facts)
    if not earlier:
        return Outcome(0, [], facts)
    # an index row of no hash or content joins nothing: the index cannot vouch for the drop
    unreadable = _query(
        "SELECT filename AS index_file, count(*) AS rows_without_hash_or_content "
        "FROM read_parquet($i, filename = true) WHERE content_sha256 IS NULL OR content IS NULL "
        "GROUP BY filename ORDER BY filename",
        {"i": [str(p) for p in earlier]},
    )
    if unreadable:
        return Outcome(len(unreadable), unreadable[:SAMPLE], facts)
    source = (
        "(SELECT s.record_id, any_value(s.source_file || ':' || s.source_line) AS location, "
        "any_value(s.source_line) AS source_line, min(i.record_id) AS earlier_record_id "
        "FROM read_parquet($s) AS s JOIN read_parquet($i) AS i "
        "ON s.content_sha256 = i.content_sha256 AND s.content = i.content GROUP BY s.record_id)"
    )
    n, bad = _violating_rows(
        source,
        "true",
        "record_id, location, earlier_record_id",
        {"s": str(silver_dir / "records.parquet"), "i": [str(p) for p in earlier]},
    )
    return Outcome(n, bad, facts)


def silver_lengths(silver_dir: Path, min_chars: int, max_chars: int | None) -> Outcome:
    """Every kept record has min_chars <= chars <= max_chars (and at least one)."""
    p = {
        "s": str(silver_dir / "records.parquet"),
        "lo": min_chars,
        "hi": max_chars if max_chars is not None else _NO_MAX_CHARS,
    }
    n, bad = _violating_rows(
        "read_parquet($s)",
        "num_chars < $lo OR num_chars > $hi OR num_chars <= 0",
        f"record_id, {_LOCATION}, num_chars",
        p,
    )
    return Outcome(n, bad, {"min_chars": min_chars, "max_chars": max_chars})


# the split hash: the first 8 bytes of sha256('<seed>:<content_sha256>') as an unsigned integer
_SPLIT_HASHED = (
    "SELECT record_id, source_file, source_line, split, file_row_number AS pos, "
    "('0x' || substr(sha256($seed || ':' || content_sha256), 1, 16))::UBIGINT AS h "
    "FROM read_parquet($s, file_row_number = true)"
)
_SPLIT_SHARE = "(h::DOUBLE / 18446744073709551616.0)"  # the split hash as a share of [0, 1)
# with counts: the records of the drop ranked by split hash (ties in drop order); the first $a validation, the
# next up to $b test
_SPLIT_BY_COUNT = f"""(SELECT *, CASE WHEN r <= $a THEN 'validation' WHEN r <= $b THEN 'test' ELSE 'train' END
                          AS drawn_split
                      FROM (SELECT *, row_number() OVER (ORDER BY h, pos) AS r FROM ({_SPLIT_HASHED})))"""
# with ratios: validation below $a, test below $b
_SPLIT_BY_RATIO = f"""(SELECT *, CASE WHEN {_SPLIT_SHARE} < $a THEN 'validation' WHEN {_SPLIT_SHARE} < $b THEN 'test'
                                 ELSE 'train' END AS drawn_split
                      FROM ({_SPLIT_HASHED}))"""


def silver_split_drawn(silver_dir: Path, split: SplitSpec) -> Outcome:
    """Every kept record is in the split drawn from its content hash: with ratios, by where its split hash falls
    in [0, 1); with counts, by its rank among the drop's split hashes (ties in drop order). Recomputed in SQL from
    `content_sha256`, apart from silver's code; for drops whose split is keyed by content (no `tabular.group_by`)."""
    if split.by_count:
        n_val, n_test = split.validation_count or 0, split.test_count or 0
        source, bounds = _SPLIT_BY_COUNT, {"a": n_val, "b": n_val + n_test}
    else:
        source = _SPLIT_BY_RATIO
        bounds = {"a": split.validation_ratio, "b": split.validation_ratio + split.test_ratio}
    n, bad = _violating_rows(
        source,
        "split <> drawn_split",
        f"record_id, {_LOCATION}, split, drawn_split",
        {"s": str(silver_dir / "records.parquet"), "seed": str(split.seed), **bounds},
    )
    return Outcome(n, bad)


# silver's rejects that repeat a kept record (here or in an earlier drop): a drop of repeats alone is no mistake
_REPEATS = ("duplicate", "near_duplicate")


def silver_not_emptied(silver_dir: Path) -> Outcome:
    """A drop keeps at least one record, unless it had none or was mostly repeats: cleaning (filters, bounds,
    caps) rejecting every record is most often a spec edit gone wrong, and would empty the drop's shards
    silently. A drop redelivered whole (repeats) with a few records cleaning rejects is no such mistake."""
    kept = _scalar("SELECT count(*) FROM read_parquet($s)", {"s": str(silver_dir / "records.parquet")})
    reasons = _query(
        "SELECT reason, count(*) AS records FROM read_parquet($r) GROUP BY reason ORDER BY records DESC, reason",
        {"r": str(silver_dir / "rejects.parquet")},
    )
    repeats = sum(r["records"] for r in reasons if r["reason"] in _REPEATS)
    cleaning = [r for r in reasons if r["reason"] not in _REPEATS]
    cleaned = sum(r["records"] for r in cleaning)
    facts = {"kept": kept, "rejected_by_cleaning": cleaned, "repeats": repeats}
    if kept or cleaned <= repeats:
        return Outcome(0, [], facts)
    by_reason = ", ".join(f"{r['reason']} {r['records']}" for r in cleaning)
    return Outcome(
        1,
        cleaning[:SAMPLE],
        facts,
        f"the drop kept none of its {cleaned + repeats} records: cleaning rejected {cleaned} ({by_reason})"
        f"{f', {repeats} repeated kept ones' if repeats else ''}; check the spec's `clean` section (a threshold "
        "edited too far?), or retire the drop if none of it belongs in training",
    )


def silver_accounted(silver_dir: Path, bronze_dir: Path) -> Outcome:
    """Each bronze record is exactly once in silver records or silver rejects."""
    return _one_to_one(
        bronze_dir / "records.parquet",
        (silver_dir / "records.parquet", silver_dir / "rejects.parquet"),
    )
