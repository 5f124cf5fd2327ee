"""Manifest invariants: over the drops a manifest includes, one tokenizer, and every removed duplicate naming a
record that is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prep_assets.core.invariants.common import SAMPLE, Outcome, _violating_rows, file_problems
from prep_assets.core.records import GOLD_SCHEMA, SILVER_REJECT_SCHEMA, SILVER_SCHEMA


def duplicates_resolve_to_kept(silver_dirs: list[Path]) -> Outcome:
    """Every record removed as a (near) duplicate from the given drops names a record kept in them, directly or
    through one removed as a near duplicate of a kept one: no record is lost to a copy that is not shipped (nor to
    a duplicate's reject that names none)."""
    facts: dict[str, Any] = {"drops": len(silver_dirs)}
    if not silver_dirs:
        return Outcome(0, [], facts)
    # Files of another writer (or none) are named, not judged: a column missing would raise, a NULL record id of a
    # kept record would pass for no record (as every layer's gates, `file_problems`)
    problems = [
        problem
        for d in silver_dirs
        for name, schema in (("records.parquet", SILVER_SCHEMA), ("rejects.parquet", SILVER_REJECT_SCHEMA))
        for problem in file_problems(d / name, schema)
    ]
    if problems:
        return Outcome(
            len(problems),
            problems[:SAMPLE],
            facts,
            "not judged: a silver file of the manifest's drops is missing, lacks a column, holds one as another type "
            "or holds a NULL where silver's schema allows none (listed); rematerialize that drop's silver",
        )
    # A duplicate's reject that names no record (a NULL `duplicate_of`) is a violation too: a NULL joins nothing,
    # and `NOT IN` a set holding a NULL is never true, hence NOT EXISTS.
    source = """(WITH kept AS (SELECT record_id FROM read_parquet($records)),
                      rej AS (SELECT record_id, duplicate_of, source_file, source_line FROM read_parquet($rejects)
                              WHERE duplicate_of IS NOT NULL OR reason IN ('duplicate', 'near_duplicate'))
                 SELECT r.record_id, r.source_file || ':' || r.source_line AS location, r.source_line, r.duplicate_of
                 FROM rej AS r LEFT JOIN rej AS via ON r.duplicate_of = via.record_id
                 WHERE NOT EXISTS (SELECT 1 FROM kept WHERE kept.record_id = r.duplicate_of)
                   AND NOT EXISTS (SELECT 1 FROM kept WHERE kept.record_id = via.duplicate_of))"""
    params = {
        "records": [str(d / "records.parquet") for d in silver_dirs],
        "rejects": [str(d / "rejects.parquet") for d in silver_dirs],
    }
    n, bad = _violating_rows(source, "true", "record_id, location, duplicate_of", params, order="record_id")
    return Outcome(n, bad, facts)


def shards_one_tokenizer(shards_stats: list[dict[str, Any]], pinned_fingerprint: str) -> Outcome:
    """All shards listed in the manifest were made with the pinned tokenizer."""
    offending = [
        {"partition": s["partition"], "tokenizer_fingerprint": s["tokenizer_fingerprint"]}
        for s in shards_stats
        if s["tokenizer_fingerprint"] != pinned_fingerprint
    ]
    return Outcome(len(offending), offending[:SAMPLE], {"pinned": pinned_fingerprint})


def tabular_one_schema(schemas: dict[str, list[str]]) -> Outcome:
    """Every drop a tabular manifest holds has the same columns in the same order (`schemas`: partition -> columns,
    read from each partition's gold stats; a drop of no record is left out): the manifest states one schema and its
    schema prompt, which a drop of other columns never trained on. The drops that differ from the first are the
    violations."""
    items = sorted(schemas.items())
    if not items:
        return Outcome(0, [], {"drops": 0})
    first_partition, first = items[0]
    offending = [
        {"partition": k, "columns": ", ".join(cols), "first_drop": first_partition, "its_columns": ", ".join(first)}
        for k, cols in items[1:]
        if cols != first
    ]
    return Outcome(len(offending), offending[:SAMPLE], {"drops": len(items), "columns": first})


def groups_in_one_split(gold_dirs: list[Path]) -> Outcome:
    """Every group (`tabular.group_by`) of the given drops' gold examples is in one split: a group held out in one
    drop and trained in another would reach the test split and the train shards both. Per drop a group is never
    split; across drops a holdout of a count of groups (`tabular.holdout`) draws each drop apart."""
    facts: dict[str, Any] = {"drops": len(gold_dirs)}
    problems = [p for d in gold_dirs for p in file_problems(d / "examples.parquet", GOLD_SCHEMA)]
    if problems:
        return Outcome(len(problems), problems[:SAMPLE], facts, "not judged: a gold file of the manifest's drops is "
                       "missing or not as gold writes it (listed); rematerialize that drop's gold")  # fmt: skip
    if not gold_dirs:
        return Outcome(0, [], facts)
    source = """(SELECT g AS group_key, count(DISTINCT split) AS n,
                        string_agg(DISTINCT split, ', ' ORDER BY split) AS splits,
                        string_agg(DISTINCT "drop", ', ' ORDER BY "drop") AS drops
                 FROM (SELECT unnest(group_keys) AS g, split, "drop" FROM read_parquet($files)) WHERE g IS NOT NULL
                 GROUP BY g)"""
    files = [str(d / "examples.parquet") for d in gold_dirs]
    n, bad = _violating_rows(source, "n > 1", "group_key, splits, drops", {"files": files}, order="group_key")
    said = (
        f"{n} group(s) are in more than one split across the manifest's drops: tabular.holdout draws each drop's "
        "test groups apart; give each group one drop, or hold out by split ratios (drawn by the group's value)"
        if n
        else ""
    )
    return Outcome(n, bad, facts, said)
