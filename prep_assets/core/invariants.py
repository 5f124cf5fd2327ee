"""Invariants between layers, as DuckDB queries over the published Parquet files.

Written once; the Dagster asset checks and the tests both call these. Each returns an `Outcome`:
the number of violations, up to `SAMPLE` offending rows (ids and file:line where the layer has
them) and the figures it measured. Paths and values are always bound as parameters, never
interpolated into SQL.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv

from prep_assets.core.lake import read_json
from prep_assets.core.sql import connect as sql_connect
from prep_assets.core.sql import joins_as_written

SAMPLE = 20


@dataclass(frozen=True)
class Outcome:
    name: str
    violations: int
    offending: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def passed(self) -> bool:
        return self.violations == 0


def _query(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run `sql` with the named parameters it uses (`$name`); values are always bound, never interpolated."""
    with sql_connect() as con:
        return _rows_in(con, sql, params)


def _scalar(sql: str, params: dict[str, Any]) -> Any:
    rows = _query(sql, params)
    return next(iter(rows[0].values())) if rows else None


def _files(paths: list[Path]) -> list[str]:
    return [str(p) for p in paths]


def _violating_rows(
    source: str,
    where: str,
    columns: str,
    params: dict[str, Any],
    order: str = "source_line",
    tables: dict[str, pa.Table] | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """(count, first SAMPLE rows) of `source` matching `where`; `source` and `where` are our own SQL text, and
    `tables` Arrow tables the SQL names (registered under those fixed names).

    One pass over the data: the violating rows (normally none) are kept in a temp table, then counted and sampled."""
    with sql_connect() as con:
        for table_name, table in (tables or {}).items():
            con.register(table_name, table)
        return _violations_in(con, source, where, columns, params, order)


def _bound(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters `sql` uses (`$name`): DuckDB refuses unused ones."""
    used = set(re.findall(r"\$([A-Za-z_]\w*)", sql))
    return {k: v for k, v in params.items() if k in used}


def _violations_in(
    con: Any, source: str, where: str, columns: str, params: dict[str, Any], order: str
) -> tuple[int, list[dict[str, Any]]]:
    """`_violating_rows` on an open connection (whose temp tables `source` may name)."""
    sql = f"CREATE TEMP TABLE violations AS SELECT * FROM {source} WHERE {where}"
    con.execute(sql, _bound(sql, params))
    count = con.execute("SELECT count(*) FROM violations").fetchall()[0][0]
    cur = con.execute(f"SELECT {columns} FROM violations ORDER BY {order} LIMIT $n", {"n": SAMPLE})
    cols = [d[0] for d in cur.description]
    return int(count), [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def _rows_in(con: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, _bound(sql, params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


_LOCATION = "source_file || ':' || source_line AS location"


def _one_to_one(
    upstream: Path,
    outputs: tuple[Path, Path],
    name: str,
    description: str,
    kept_where: str = "true",
    kept_ids: str = "record_id",
) -> Outcome:
    """Each upstream record_id is exactly once among the two output tables (kept + rejected); `kept_ids` is the
    SQL naming the kept rows' record ids (our own text, e.g. an unnest of a list column)."""
    p = {"u": str(upstream), "a": str(outputs[0]), "b": str(outputs[1])}
    sql = f"""
        WITH out AS (SELECT {kept_ids} AS record_id FROM read_parquet($a) WHERE {kept_where}
                     UNION ALL SELECT record_id FROM read_parquet($b)),
             cnt AS (SELECT record_id, count(*) AS n FROM out GROUP BY record_id),
             up AS (SELECT record_id, {_LOCATION} FROM read_parquet($u))
        SELECT coalesce(up.record_id, cnt.record_id) AS record_id, up.location, coalesce(cnt.n, 0) AS times_out
        FROM up FULL OUTER JOIN cnt USING (record_id) WHERE coalesce(cnt.n, 0) <> 1 OR up.record_id IS NULL
    """
    n, bad = _violating_rows(f"({sql})", "true", "*", p, order="record_id")
    facts = {
        k: _scalar(f"SELECT count(*) FROM (SELECT {ids} FROM read_parquet($x) WHERE {w})", {"x": v})
        for k, v, w, ids in (
            ("upstream", p["u"], "true", "record_id"),
            ("kept", p["a"], kept_where, kept_ids),
            ("rejected", p["b"], "true", "record_id"),
        )
    }
    return Outcome(name, n, bad, facts, description)


# ---------------------------------------------------------------- bronze


def count_lines(path: Path, fmt: str, limit: int | None = None) -> int | None:
    """Physical lines of a line-format drop, counted independently of the reader.

    None where the stream itself is broken (a truncated or corrupt gzip) or inflates past `limit` (where the
    reader stopped too): the reader's count then stands.
    """
    opener = gzip.open if fmt == "jsonl.gz" else open
    n, last, size = 0, b"\n", 0
    try:
        with opener(path, "rb") as f:
            while block := f.read(1 << 20):
                n += block.count(b"\n")
                last = block[-1:]
                size += len(block)
                if limit is not None and size > limit:
                    return None
    except (EOFError, OSError, zlib.error):
        return None
    return n + (0 if last == b"\n" else 1)


def count_elements(path: Path) -> int | None:
    """Elements of a JSON-array drop, parsed independently of the reader; None if it is no valid array.

    orjson first: its nesting limit (1024) does not depend on how deep the caller's stack is, as json's does."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:  # also what orjson refuses and json reads: NaN, lone surrogates
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
    return len(value) if isinstance(value, list) else None


def count_csv_rows(path: Path) -> int | None:
    """Data rows of a CSV (header excluded, blank lines skipped), parsed by Arrow rather than the reader;
    None where Arrow cannot parse it (ragged rows), and the reader's count then stands."""
    try:
        with pacsv.open_csv(
            str(path),
            read_options=pacsv.ReadOptions(block_size=1 << 22),
            convert_options=pacsv.ConvertOptions(column_types={}, strings_can_be_null=False),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
        ) as reader:
            return sum(batch.num_rows for batch in reader)
    except (pa.ArrowInvalid, OSError):
        return None


def count_parquet_rows(path: Path) -> int | None:
    """Rows of a Parquet file by DuckDB (not the reader); None where DuckDB cannot read it."""
    try:
        return int(_scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(path)}))
    except duckdb.Error:
        return None


def bronze_accounted(bronze_dir: Path, source: Path | None) -> Outcome:
    """Every input line is a record, a reject or a blank line (records + rejects + blank = lines in)."""
    acct = read_json(bronze_dir / "accounting.json")
    records = _scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(bronze_dir / "records.parquet")})
    rejects = _scalar("SELECT count(*) FROM read_parquet($p)", {"p": str(bronze_dir / "rejects.parquet")})
    lines_in = acct["lines_in"]
    recount = None
    if source is not None and source.is_file():
        if acct["unit"] == "line":
            recount = count_lines(source, acct["format"], acct.get("gzip_limit"))
        elif acct["unit"] == "row" and acct["format"] == "parquet":
            recount = count_parquet_rows(source)
        elif acct["unit"] == "row":
            recount = count_csv_rows(source)
            recount = None if recount is None else recount + acct["blank_lines"]
        else:
            recount = count_elements(source)
        lines_in = recount if recount is not None else lines_in
    accounted = records + rejects + acct["blank_lines"]
    facts = {
        "lines_in": lines_in,
        "records": records,
        "rejects": rejects,
        "blank_lines": acct["blank_lines"],
        "unit": acct["unit"],
        "independent_line_count": recount,
    }
    offending = [] if lines_in == accounted else [{"lines_in": lines_in, "accounted": accounted, **facts}]
    return Outcome(
        "raw_records_accounted",
        abs(lines_in - accounted),
        offending,
        facts,
        "records + rejects + blank lines = lines (or array elements) in the drop",
    )


def bronze_reject_rate(bronze_dir: Path, max_rate: float) -> Outcome:
    """The share of rejected lines is within the dataset's threshold."""
    p = {"r": str(bronze_dir / "records.parquet"), "j": str(bronze_dir / "rejects.parquet")}
    records = _scalar("SELECT count(*) FROM read_parquet($r)", {"r": p["r"]})
    rejects = _scalar("SELECT count(*) FROM read_parquet($j)", {"j": p["j"]})
    total = records + rejects
    rate = rejects / total if total else 0.0
    offending = []
    if rate > max_rate:
        offending = _query(
            "SELECT source_file || ':' || source_line AS location, byte_offset, reason, detail FROM read_parquet($j) "
            "ORDER BY source_line LIMIT $n",
            {"j": p["j"], "n": SAMPLE},
        )
    by_reason = {
        r["reason"]: r["n"]
        for r in _query(
            "SELECT reason, count(*) AS n FROM read_parquet($j) GROUP BY reason ORDER BY reason", {"j": p["j"]}
        )
    }
    return Outcome(
        "raw_records_reject_rate",
        int(rate > max_rate),
        offending,
        {"reject_rate": round(rate, 6), "max_reject_rate": max_rate, "rejects_by_reason": by_reason},
        "rejects / (records + rejects) <= checks.max_reject_rate",
    )


def bronze_required_fields(bronze_dir: Path) -> Outcome:
    """Every record has its provenance, a unique id and valid JSON content."""
    source = "(SELECT *, count(*) OVER (PARTITION BY record_id) AS copies FROM read_parquet($r))"
    where = (
        "record_id IS NULL OR source_file IS NULL OR source_line IS NULL OR byte_offset IS NULL "
        "OR content IS NULL OR NOT json_valid(content) OR copies > 1"
    )
    n, bad = _violating_rows(source, where, f"record_id, {_LOCATION}", {"r": str(bronze_dir / "records.parquet")})
    return Outcome("raw_records_required_fields", n, bad, {}, "provenance present, record ids unique, content is JSON")


# ---------------------------------------------------------------- silver


def silver_unique(silver_dir: Path) -> Outcome:
    """No two kept records have the same content (hash and bytes; within the drop)."""
    # same content => same hash: contents are grouped only for hashes held more than once (grouping every
    # content of a 400 MB drop took 650 MiB)
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
    return Outcome("clean_records_unique", n, dup, {}, "no two kept records have the same content")


def silver_unique_across_drops(silver_dir: Path, earlier: list[Path]) -> Outcome:
    """No kept record's content is held by an earlier drop's dedup index (dedup_scope: dataset); an index that
    is missing fails the check (it cannot be verified)."""
    name, what = "clean_records_unique_across_drops", "no kept record repeats a record of an earlier drop"
    missing = [str(p) for p in earlier if not p.is_file()]
    facts: dict[str, Any] = {"earlier_drops": len(earlier)}
    if missing:
        return Outcome(name, len(missing), [{"missing_index": m} for m in missing[:SAMPLE]], facts, what)
    if not earlier:
        return Outcome(name, 0, [], facts, what)
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
    return Outcome(name, n, bad, facts, what)


def duplicates_resolve_to_kept(silver_dirs: list[Path]) -> Outcome:
    """Every record removed as a (near) duplicate from the given drops names a record kept in them, directly or
    through one removed as a near duplicate of a kept one: no record is lost to a copy that is not shipped."""
    name = "dataset_manifest_duplicates_kept"
    what = (
        "every duplicate removed from the manifest's drops names a record kept in them (else rebuild the "
        "named drops' silver: its copy was in a drop since replaced or left out)"
    )
    facts: dict[str, Any] = {"drops": len(silver_dirs)}
    if not silver_dirs:
        return Outcome(name, 0, [], facts, what)
    source = """(WITH kept AS (SELECT record_id FROM read_parquet($records)),
                      rej AS (SELECT record_id, duplicate_of, source_file, source_line FROM read_parquet($rejects)
                              WHERE duplicate_of IS NOT NULL)
                 SELECT r.record_id, r.source_file || ':' || r.source_line AS location, r.source_line, r.duplicate_of
                 FROM rej AS r LEFT JOIN rej AS via ON r.duplicate_of = via.record_id
                 WHERE r.duplicate_of NOT IN (SELECT record_id FROM kept)
                   AND (via.duplicate_of IS NULL OR via.duplicate_of NOT IN (SELECT record_id FROM kept)))"""
    params = {
        "records": [str(d / "records.parquet") for d in silver_dirs],
        "rejects": [str(d / "rejects.parquet") for d in silver_dirs],
    }
    n, bad = _violating_rows(source, "true", "record_id, location, duplicate_of", params, order="record_id")
    return Outcome(name, n, bad, facts, what)


def silver_lengths(silver_dir: Path, min_chars: int, max_chars: int | None) -> Outcome:
    p = {
        "s": str(silver_dir / "records.parquet"),
        "lo": min_chars,
        "hi": max_chars if max_chars is not None else 2**62,
    }
    n, bad = _violating_rows(
        "read_parquet($s)",
        "num_chars < $lo OR num_chars > $hi OR num_chars <= 0",
        f"record_id, {_LOCATION}, num_chars",
        p,
    )
    return Outcome(
        "clean_records_length_bounds",
        n,
        bad,
        {"min_chars": min_chars, "max_chars": max_chars},
        "every kept record has min_chars <= chars <= max_chars",
    )


def silver_accounted(silver_dir: Path, bronze_dir: Path) -> Outcome:
    """Each bronze record is exactly once in silver records or silver rejects."""
    return _one_to_one(
        bronze_dir / "records.parquet",
        (silver_dir / "records.parquet", silver_dir / "rejects.parquet"),
        "clean_records_accounted",
        "silver records + silver rejects = bronze records, one to one",
    )


# ---------------------------------------------------------------- gold


@dataclass(frozen=True)
class RowRule:
    """A gold gate judged example by example: the rows where `where` holds (our own SQL over a gold row) are its
    violations, named with `columns` beside their id and location; `params` are bound, `facts` reported."""

    name: str
    where: str
    description: str
    columns: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] | None = None


def gold_rows(gold_dir: Path, rules: list[RowRule]) -> list[Outcome]:
    """The outcomes of several row rules from one pass over gold: every rule's flag is computed per row, the rows
    that break any (normally none) are kept in a temp table, and each rule is counted and sampled from there."""
    p: dict[str, Any] = {"g": str(gold_dir / "examples.parquet")}
    for rule in rules:
        p.update(rule.params)
    flags = ", ".join(f"coalesce(({rule.where}), false) AS broken_{i}" for i, rule in enumerate(rules))
    broken_any = " OR ".join(f"broken_{i}" for i in range(len(rules)))
    create = f"CREATE TEMP TABLE flagged AS SELECT * FROM (SELECT *, {flags} FROM read_parquet($g)) WHERE {broken_any}"
    out = []
    with sql_connect() as con:
        con.execute(create, _bound(create, p))
        for i, rule in enumerate(rules):
            flag = f"broken_{i}"
            n, bad = _violations_in(con, "flagged", flag, f"example_id, {_LOCATION}{rule.columns}", p, "source_line")
            out.append(
                Outcome(rule.name, n, bad, dict(rule.params) if rule.facts is None else rule.facts, rule.description)
            )
            con.execute("DROP TABLE violations")
    return out


def mask_aligned_rule(trainable_types: tuple[int, ...] = (1, 3)) -> RowRule:
    """Equal list lengths; mask in {0,1}; mask 1 only on the types the spec trains; counts match the lists."""
    where = (
        "len(token_ids) <> len(loss_mask) OR len(token_ids) <> len(token_type_ids) OR len(token_ids) <> num_tokens "
        "OR list_max(loss_mask) > 1 OR list_max(token_type_ids) > 3 OR list_sum(loss_mask) <> num_loss_tokens "
        "OR list_count(list_filter(list_zip(loss_mask, token_type_ids), "
        "lambda x: x[1] = 1 AND NOT list_contains($trainable_types, x[2]))) > 0"
    )
    return RowRule(
        "tokenized_examples_mask_aligned",
        where,
        "equal list lengths, mask in {0,1}, mask 1 only on trainable token types, counts match",
        params={"trainable_types": list(trainable_types)},
    )


def loss_tokens_rule() -> RowRule:
    return RowRule(
        "tokenized_examples_have_loss_tokens",
        "coalesce(list_sum(loss_mask), 0) = 0",
        "every example has at least one loss token",
    )


def ids_in_vocab_rule(vocab_size: int) -> RowRule:
    return RowRule(
        "tokenized_examples_ids_in_vocab",
        "list_max(token_ids) >= $vocab_size OR list_min(token_ids) < 0",
        "0 <= id < vocab size",
        ", list_max(token_ids) AS max_id",
        {"vocab_size": vocab_size},
    )


def within_max_len_rule(max_seq_len: int, splits_examples: bool = False) -> RowRule:
    """1 <= tokens <= max_seq_len; with `splits_examples` (packing full, or window overflow) only 1 <= tokens."""
    if splits_examples:
        return RowRule(
            "tokenized_examples_within_max_len",
            "len(token_ids) = 0",
            "1 <= tokens (packing splits longer examples)",
            ", len(token_ids) AS tokens",
            facts={"max_seq_len": max_seq_len, "splits_examples": True},
        )
    return RowRule(
        "tokenized_examples_within_max_len",
        "len(token_ids) > $max_seq_len OR len(token_ids) = 0",
        "1 <= tokens <= sequence.max_seq_len",
        ", len(token_ids) AS tokens",
        {"max_seq_len": max_seq_len},
    )


def gold_mask_aligned(gold_dir: Path, trainable_types: tuple[int, ...] = (1, 3)) -> Outcome:
    return gold_rows(gold_dir, [mask_aligned_rule(trainable_types)])[0]


def gold_loss_tokens(gold_dir: Path) -> Outcome:
    return gold_rows(gold_dir, [loss_tokens_rule()])[0]


def gold_ids_in_vocab(gold_dir: Path, vocab_size: int) -> Outcome:
    return gold_rows(gold_dir, [ids_in_vocab_rule(vocab_size)])[0]


def gold_within_max_len(gold_dir: Path, max_seq_len: int, splits_examples: bool = False) -> Outcome:
    return gold_rows(gold_dir, [within_max_len_rule(max_seq_len, splits_examples)])[0]


def gold_accounted(gold_dir: Path, silver_dir: Path) -> Outcome:
    """Each silver record is exactly once among gold examples or gold rejects (a preference pair counts once; a
    tabular example counts each of its records)."""
    return _one_to_one(
        silver_dir / "records.parquet",
        (gold_dir / "examples.parquet", gold_dir / "rejects.parquet"),
        "tokenized_examples_accounted",
        "gold examples + gold rejects = silver records, one to one "
        "(a preference pair counts once, a tabular example each of its records)",
        kept_where="branch IS NULL OR branch = 'chosen'",
        kept_ids="unnest(coalesce(record_ids, [record_id]))",
    )


REJECT_EXAMPLES = 3  # example rows shown per gold reject reason


def gold_reject_rate(gold_dir: Path, silver_dir: Path, max_rate: float) -> Outcome:
    """Gold rejects / records that entered gold (silver's kept records) <= `max_rate`. Passing or not, the
    rejects are shown by reason (most frequent first), each with its count and a few example rows."""
    p = {"g": str(gold_dir / "rejects.parquet"), "s": str(silver_dir / "records.parquet")}
    records = _scalar("SELECT count(*) FROM read_parquet($s)", {"s": p["s"]})
    by_reason = {
        r["reason"]: r["n"]
        for r in _query(
            "SELECT reason, count(*) AS n FROM read_parquet($g) GROUP BY reason ORDER BY n DESC, reason", {"g": p["g"]}
        )
    }
    rejects = sum(by_reason.values())
    rate = rejects / records if records else 0.0
    examples = _query(
        f"""
        SELECT reason, count(*) OVER (PARTITION BY reason) AS reason_rejects, record_id, {_LOCATION}, detail
        FROM read_parquet($g)
        QUALIFY row_number() OVER (PARTITION BY reason ORDER BY source_file, source_line, record_id) <= $k
        ORDER BY reason_rejects DESC, reason, source_file, source_line, record_id LIMIT $n""",
        {"g": p["g"], "k": REJECT_EXAMPLES, "n": SAMPLE},
    )
    facts = {
        "gold_reject_rate": round(rate, 6),
        "max_gold_reject_rate": max_rate,
        "records_entering_gold": records,
        "rejects": rejects,
        "rejects_by_reason": by_reason,
    }
    return Outcome(
        "tokenized_examples_reject_rate",
        int(rate > max_rate),
        examples,
        facts,
        f"gold rejects / silver records = {rejects} / {records} = {rate:.2%} (at most {max_rate:.2%})",
    )


TABULAR_REMEDIES = (
    "group by another column (tabular.group_by), raise sequence.max_seq_len, or lower "
    "packing.max_sequences_per_example"
)


def gold_tabular_budget(gold_dir: Path, max_seq_len: int) -> Outcome:
    """Tabular: no group (grouped mode) or record (any mode) was left out for not fitting max_seq_len with the
    schema prompt and its BOS/EOS. Fails naming the largest first, with their tokens, the budget and remedies."""
    sql = """
        SELECT CASE WHEN reason = 'group_over_budget' THEN 'group' ELSE 'record' END AS kind,
               CASE WHEN reason = 'group_over_budget' THEN group_key ELSE record_id END AS name,
               max(num_tokens) AS tokens, count(*) AS records, arg_min(source_file || ':' || source_line, source_line)
               AS location
        FROM read_parquet($r) WHERE reason IN ('group_over_budget', 'record_over_budget')
        GROUP BY ALL
    """
    n, bad = _violating_rows(
        f"({sql})", "true", "*", {"r": str(gold_dir / "rejects.parquet")}, order="tokens DESC, kind, name"
    )
    description = (
        f"every record, and in grouped mode every group, fits max_seq_len {max_seq_len} with the schema "
        "prompt and its BOS/EOS"
    )
    if n:
        worst = ", ".join(
            f"{b['kind']} {b['name']!r} ({b['tokens']} tokens, {b['records']} record(s), {b['location']})"
            for b in bad[:5]
        )
        description = (
            f"{n} group(s)/record(s) cannot fit one example of max_seq_len {max_seq_len} tokens with "
            f"the schema prompt and BOS/EOS; largest: {worst}{' ...' if n > 5 else ''}. "
            f"Remedies: {TABULAR_REMEDIES}."
        )
    return Outcome("tokenized_examples_tabular_budget", n, bad, {"max_seq_len": max_seq_len}, description)


def gold_pairs_complete(gold_dir: Path) -> Outcome:
    """Preference pairs: one chosen + one rejected example, one split, the same masked shared prompt tokens."""
    sql = """
        WITH e AS (SELECT pair_id, branch, split, source_file || ':' || source_line AS location,
                          shared_prefix_tokens AS shared, list_slice(token_ids, 1, shared_prefix_tokens) AS prompt,
                          coalesce(list_sum(list_slice(loss_mask, 1, shared_prefix_tokens)), 0) AS prompt_loss
                   FROM read_parquet($g) WHERE pair_id IS NOT NULL)
        SELECT pair_id, any_value(location) AS location, count(*) AS examples,
               count(*) FILTER (branch = 'chosen') AS chosen, count(DISTINCT split) AS splits,
               count(DISTINCT prompt) AS prompts, min(shared) AS shared, max(prompt_loss) AS prompt_loss
        FROM e GROUP BY pair_id
        HAVING count(*) <> 2 OR count(*) FILTER (branch = 'chosen') <> 1 OR count(DISTINCT split) <> 1
            OR count(DISTINCT prompt) <> 1 OR count(DISTINCT shared) <> 1 OR min(coalesce(shared, 0)) < 1
            OR max(prompt_loss) > 0
    """
    n, bad = _violating_rows(f"({sql})", "true", "*", {"g": str(gold_dir / "examples.parquet")}, order="pair_id")
    pairs = _scalar("SELECT count(DISTINCT pair_id) FROM read_parquet($g)", {"g": str(gold_dir / "examples.parquet")})
    return Outcome(
        "tokenized_examples_pairs_complete",
        n,
        bad,
        {"pairs": pairs},
        "one chosen and one rejected example per pair, in one split, whose shared prompt tokens are "
        "identical and masked",
    )


# ---------------------------------------------------------------- packed shards

_TOKENS = """
    SELECT filename AS file, file_row_number AS row, unnest(input_ids) AS id, unnest(loss_mask) AS m,
           unnest(position_ids) AS pos, unnest(segment_ids) AS seg, unnest(token_type_ids) AS typ,
           generate_subscripts(input_ids, 1) AS i
    FROM read_parquet($files, filename = true, file_row_number = true)
"""


def shard_files(shards_dir: Path) -> list[Path]:
    return sorted(shards_dir.glob("*/part-*.parquet"))


def _no_shards(name: str, description: str) -> Outcome:
    return Outcome(name, 0, [], {"files": 0}, description)


# What three row-level shard gates judge, each an expression over one shard row (with `used`, the tokens its
# seq_lengths cover): `shard_rows` evaluates those asked for in one pass over the shards.
_SEG_AT = "coalesce(list_sum(seq_lengths[1 : k - 1]), 0)"  # where segment k starts in its row (0-based)
# fixed_length: the lists are max_seq_len long, and agree with each other and with num_loss_tokens
_FIXED_BROKEN = """coalesce((len(input_ids) <> $L OR len(loss_mask) <> $L OR len(position_ids) <> $L
    OR len(segment_ids) <> $L OR len(token_type_ids) <> $L OR list_sum(seq_lengths) > $L
    OR len(seq_lengths) <> len(example_ids) OR len(example_offsets) <> len(example_ids)
    OR coalesce(list_sum(loss_mask), 0) <> num_loss_tokens), false)"""
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
# mask, type), modulo 2^64 (`_GOLD_ROW_SUMS` is the same sum over gold)
_MOD_2_64 = "% 18446744073709551616"
_ROW_HASH = f"""(list_sum(list_transform(list_zip(input_ids, loss_mask, token_type_ids),
                  lambda x, i: CASE WHEN i <= used THEN hash(i::BIGINT, x[1]::BIGINT, x[2]::BIGINT, x[3]::BIGINT)
                                    ELSE 0 END)) {_MOD_2_64})::UBIGINT"""
ROW_PARTS = {
    "fixed": f"{_FIXED_BROKEN} AS fixed_broken",
    "layout": f"{_LAYOUT_DIFFERS} AS layout_differs",
    "checksum": f"{_ROW_HASH} AS h",
}


def shard_rows(files: list[Path], parts: Iterable[str], max_seq_len: int | None = None) -> pa.Table:
    """Per shard row (`file`, `row`, `length`), in one pass: `fixed_broken` ("fixed", against `max_seq_len`),
    `layout_differs` ("layout"), `h` ("checksum"). Three gates read it: each pass decodes every list of every row,
    and three took 1.24 s of the 100 MB benchmark where one takes 0.92 s."""
    wanted = set(parts)
    if wanted - set(ROW_PARTS) or ("fixed" in wanted and max_seq_len is None):
        raise ValueError(f"shard_rows: parts {sorted(wanted)} (of {sorted(ROW_PARTS)}; 'fixed' needs max_seq_len)")
    columns = ", ".join(ROW_PARTS[part] for part in ROW_PARTS if part in wanted)
    sql = f"""SELECT file, row, length, {columns}
              FROM (SELECT *, filename AS file, file_row_number AS row, len(input_ids) AS length,
                           coalesce(list_sum(seq_lengths), 0) AS used
                    FROM read_parquet($files, filename = true, file_row_number = true))"""
    with sql_connect() as con:
        return con.sql(sql, params=_bound(sql, {"files": _files(files), "L": max_seq_len})).to_arrow_table()


def shards_fixed_length(files: list[Path], max_seq_len: int, rows: pa.Table | None = None) -> Outcome:
    """`rows`: the shards' `shard_rows` with "fixed" (computed here when not given)."""
    name = "packed_shards_fixed_length"
    desc = (
        "every row of every list column is exactly max_seq_len long; num_loss_tokens = sum(loss_mask); one "
        "example id and offset per segment"
    )
    if not files:
        return _no_shards(name, desc)
    rows = shard_rows(files, ["fixed"], max_seq_len) if rows is None else rows
    n, bad = _violating_rows(
        "shard_rows", "fixed_broken", "file, row, length", {}, order="file, row", tables={"shard_rows": rows}
    )
    return Outcome(name, n, bad, {"rows": rows.num_rows, "max_seq_len": max_seq_len}, desc)


def shards_padding_masked(files: list[Path], pad_id: int) -> Outcome:
    name, desc = "packed_shards_padding_masked", "padding tokens are the pad id with loss_mask 0, segment 0, type 2"
    if not files:
        return _no_shards(name, desc)
    p = {"files": _files(files), "pad": pad_id}
    where = "seg = 0 AND (m <> 0 OR id <> $pad OR typ <> 2 OR pos <> 0)"
    n, bad = _violating_rows(f"({_TOKENS})", where, "file, row, i AS token", p, order="file, row, i")
    return Outcome(name, n, bad, {}, desc)


def shards_positions_restart(files: list[Path], rows: pa.Table | None = None) -> Outcome:
    """Positions are 0 at each segment start and +1 inside it; segments are 1..k; segment starts are masked; the
    segments are the ones seq_lengths lists (else tokens past them, still numbered and trained, would pass every
    gate: the others judge the tokens seq_lengths covers). `rows`: the shards' `shard_rows` with "layout"."""
    name = "packed_shards_positions_restart"
    desc = (
        "positions restart at 0 at each segment and increase by 1; first token of each segment masked; segments "
        "as seq_lengths lists them"
    )
    if not files:
        return _no_shards(name, desc)
    # Two steps. First, whole lists compared at once (`shard_rows`): a row laid out exactly as its seq_lengths say
    # keeps the rule, so only the other rows go on (half the time of checking every token). Then, on the rows that
    # went on (normally none), the rule token by token: the indices of the tokens that break it; a row that went on
    # and breaks no token rule has segments other than its seq_lengths: a violation of its own.
    rows = shard_rows(files, ["layout"]) if rows is None else rows
    differs = rows.filter(rows.column("layout_differs")).select(["file", "row"])  # never NULL (CASE ... ELSE true)
    if differs.num_rows == 0:
        return Outcome(name, 0, [], {}, desc)
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
    return Outcome(name, n, bad, {}, desc)


@dataclass(frozen=True)
class Layout:
    """How the packer may place gold examples: what the conservation gates expect (from the spec)."""

    max_seq_len: int
    strategy: str = "bfd"
    overflow: str = "drop"
    overlap: int = 0

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
# that passed it), so no list is decoded for them (`len(token_ids)` read the whole column: 0.09 s of the 100 MB
# benchmark, against 0.003 s). Itself ...
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
    name = "packed_shards_tokens_conserved"
    desc = (
        "per split, shard tokens = gold tokens - tokens dropped by packing + window overlaps; every gold "
        "example placed exactly as the packing layout requires"
    )
    p = {"g": str(gold_dir / "examples.parquet"), **layout.params}
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
    return Outcome(name, n + len(offending), (offending + bad)[:SAMPLE], facts, desc)


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
# the shard rows named in the registered table `rows` (file, row)
_ROWS_NAMED = """
    shard_rows AS (SELECT r.* FROM read_parquet($files, filename = true, file_row_number = true) r
                   SEMI JOIN rows_named b ON r.filename = b.file AND r.file_row_number = b.row)"""

# Gold meets the shard segments in two ways. An example of up to GOLD_CHUNK tokens is joined whole (its lists go
# with each segment it fills: a few rows' worth). A longer one is unnested to one row per token, joined to its
# segments by the chunk of GOLD_CHUNK tokens it falls in, and summed per segment: a join carries each matching
# row's lists, and the whole lists of a long document, once per segment it fills, took 2 GiB at 1.4M tokens. The
# joins run as written (`joins_as_written`): segments are the hash tables, gold's lists and tokens stream past.
GOLD_CHUNK = 4096
# a segment longer than this is broken (no row is that long); it bounds the chunks one corrupt length asks for
SEGMENT_CAP = 1 << 24
_SEG_HASH = (
    "hash(({at})::BIGINT, ({id})::BIGINT, (CASE WHEN {i} <= {k0} THEN 0 ELSE {m} END)::BIGINT, ({typ})::BIGINT)"
)
# `seg_gold` (file, row, seg, broken, h) from the segments `n` (file, row, seg, example_id, off, len, at, k0): per
# segment, the sum of per-token hashes of (position in the row, id, mask, type) over the gold tokens it should
# hold, its first k0 tokens masked; `broken` where it names no gold example, starts before it or runs past its end.
# Routed by num_tokens (gold's mask_aligned gate holds it equal to the lists); either route judges the lists.
_GOLD_SEGMENT_SUMS = f"""
    gi AS (SELECT example_id, num_tokens > $C AS long FROM read_parquet($g)),
    nk AS (SELECT n.*, gi.long FROM n LEFT JOIN gi ON gi.example_id = n.example_id),
    short AS (SELECT nk.file, nk.row, nk.seg, nk.off < 0 OR nk.off + nk.len > len(g.token_ids) AS broken,
                     coalesce(list_sum(list_transform(list_zip(g.token_ids[nk.off + 1 : nk.off + nk.len],
                                                               g.loss_mask[nk.off + 1 : nk.off + nk.len],
                                                               g.token_type_ids[nk.off + 1 : nk.off + nk.len]),
                         lambda x, i: {
    _SEG_HASH.format(at='nk."at" + i', id="x[1]", i="i", k0="nk.k0", m="x[2]", typ="x[3]")
})), 0)::HUGEINT AS h
              FROM (SELECT example_id, token_ids, loss_mask, token_type_ids FROM read_parquet($g)
                    WHERE num_tokens <= $C) g JOIN nk ON g.example_id = nk.example_id
              WHERE NOT nk.long),
    pc AS (SELECT file, row, seg, example_id, off, len, "at", k0,
                  unnest(range(off // $C, (off + CASE WHEN len > {SEGMENT_CAP} THEN {SEGMENT_CAP} WHEN len < 1 THEN 1
                                                      ELSE len END - 1) // $C + 1)) AS c
           FROM nk WHERE nk.long),  -- CASE, not greatest/least, which skip NULLs: no length, no chunks
    lt AS (SELECT example_id, unnest(token_ids) AS t, unnest(loss_mask) AS tm, unnest(token_type_ids) AS ty,
                  generate_subscripts(token_ids, 1) AS j FROM read_parquet($g) WHERE num_tokens > $C),
    lsum AS (SELECT pc.file, pc.row, pc.seg, count(*) AS matched,
                    sum({
    _SEG_HASH.format(at='pc."at" + lt.j - pc.off', id="lt.t", i="lt.j - pc.off", k0="pc.k0", m="lt.tm", typ="lt.ty")
})::HUGEINT AS h
             FROM lt JOIN pc ON lt.example_id = pc.example_id AND (lt.j - 1) // $C = pc.c
                            AND lt.j > pc.off AND lt.j <= pc.off + pc.len
             GROUP BY pc.file, pc.row, pc.seg),
    seg_gold AS (SELECT file, row, seg, broken, h FROM short
                 UNION ALL
                 SELECT nk.file, nk.row, nk.seg, nk.off < 0 OR nk.len > {SEGMENT_CAP}
                        OR coalesce(lsum.matched, 0) <> nk.len, coalesce(lsum.h, 0)::HUGEINT
                 FROM nk LEFT JOIN lsum ON lsum.file = nk.file AND lsum.row = nk.row AND lsum.seg = nk.seg
                 WHERE nk.long
                 UNION ALL
                 SELECT file, row, seg, true, 0::HUGEINT FROM nk WHERE nk.long IS NULL)"""
_K0 = "least(len, CASE WHEN off = 0 THEN 1 ELSE greatest($overlap, 1) END)"

# Per shard row: `shard_rows`' checksum over the gold tokens each segment should hold, at the segment's place in
# the row, with the segment's leading tokens (the first; a window's overlap) masked; `broken` when a segment names
# no gold example or reaches past its end
_GOLD_ROW_SUMS = f"""
    WITH s AS (SELECT filename AS file, file_row_number AS row, unnest(example_ids) AS example_id,
                      unnest(example_offsets) AS off, unnest(seq_lengths) AS len,
                      unnest(list_transform(generate_series(1, len(seq_lengths)), lambda k: {_SEG_AT})) AS "at",
                      unnest(range(1, 1 + greatest(len(example_ids), len(example_offsets), len(seq_lengths)))) AS seg
               FROM read_parquet($files, filename = true, file_row_number = true)),
    n AS (SELECT *, {_K0} AS k0 FROM s),
    {_GOLD_SEGMENT_SUMS}
    SELECT file, row, bool_or(broken) AS broken, (sum(h) {_MOD_2_64})::UBIGINT AS h FROM seg_gold GROUP BY file, row"""


def shards_match_gold(files: list[Path], gold_dir: Path, overlap: int = 0, rows: pa.Table | None = None) -> Outcome:
    """Token by token, every segment equals its gold example's tokens and types at its offset, with the gold
    loss mask except its leading tokens (the first; a window's overlap), which are masked. `rows`: the shards'
    `shard_rows` with "checksum"."""
    name = "packed_shards_match_gold"
    desc = "every shard token equals the gold token (id, type, mask) it came from; segment starts masked"
    if not files:
        return _no_shards(name, desc)
    # Pass 1, row by row: each row's sum of per-token hashes (position, id, mask, type) against the same sum over
    # the gold tokens its segments should hold (`_GOLD_SEGMENT_SUMS`). Equal tokens give equal sums, so a pass is a
    # pass; a changed token changes its row's sum but for odds of ~1e-19.
    # Pass 2, only for the rows that failed: the same sums segment by segment, to name the bad segments; then the
    # first bad token of the sampled ones. A failed row without a bad listed segment (its seq_lengths cover tokens
    # no segment names) is a violation of its own.
    p = {"files": _files(files), "g": str(gold_dir / "examples.parquet"), "overlap": overlap, "C": GOLD_CHUNK}
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
        return Outcome(name, 0, [], {}, desc)
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
        {_GOLD_SEGMENT_SUMS},
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
    return Outcome(name, n, out, {}, desc)


def _first_bad_tokens(bad: list[dict[str, Any]], files: list[Path], gold_dir: Path) -> list[dict[str, Any]]:
    """Pass 2, for the sampled failing segments only: the row position of each one's first bad token (the
    segment's first where none differs, e.g. its gold example is missing). Token against token, both unnested."""
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


def shards_pairs_together(files: list[Path], gold_dir: Path) -> Outcome:
    """Both examples of a preference pair are in the same row (so the same file, row group and split)."""
    name, desc = "packed_shards_pairs_together", "both examples of every preference pair share one row"
    if not files:
        return _no_shards(name, desc)
    sql = """
        WITH s AS (SELECT filename AS file, file_row_number AS row, unnest(example_ids) AS example_id
                   FROM read_parquet($files, filename = true, file_row_number = true)),
             g AS (SELECT example_id, pair_id FROM read_parquet($g) WHERE pair_id IS NOT NULL)
        SELECT pair_id, count(DISTINCT (file, row)) AS rows, min(file) AS file, min(row) AS row
        FROM g JOIN s USING (example_id) GROUP BY pair_id HAVING count(DISTINCT (file, row)) <> 1
    """
    p = {"files": _files(files), "g": str(gold_dir / "examples.parquet")}
    n, bad = _violating_rows(f"({sql})", "true", "*", p, order="pair_id")
    return Outcome(name, n, bad, {}, desc)


def shards_utilization(files: list[Path], max_seq_len: int, min_utilization: float) -> Outcome:
    name, desc = (
        "packed_shards_utilization",
        "non-padding tokens / (rows * max_seq_len) >= checks.min_sequence_utilization",
    )
    if not files:
        return _no_shards(name, desc)
    # the tokens in segments, from seq_lengths (one short list per row, not the row-long segment_ids: 0.14 ->
    # 0.01 s on the 100 MB benchmark); fixed_length bounds their sum, tokens_conserved holds them against gold
    row = _query(
        "SELECT count(*) AS rows, coalesce(sum(list_sum(seq_lengths)), 0)::BIGINT AS tokens FROM read_parquet($files)",
        {"files": _files(files)},
    )[0]
    util = row["tokens"] / (row["rows"] * max_seq_len) if row["rows"] else 0.0
    facts = {"sequence_utilization": round(util, 6), "min_sequence_utilization": min_utilization, **row}
    return Outcome(name, int(util < min_utilization), [], facts, desc)


def shards_one_tokenizer(shards_stats: list[dict[str, Any]], pinned_fingerprint: str) -> Outcome:
    """All shards listed in the manifest were made with the pinned tokenizer."""
    offending = [
        {"partition": s["partition"], "tokenizer_fingerprint": s["tokenizer_fingerprint"]}
        for s in shards_stats
        if s["tokenizer_fingerprint"] != pinned_fingerprint
    ]
    return Outcome(
        "dataset_manifest_one_tokenizer",
        len(offending),
        offending[:SAMPLE],
        {"pinned": pinned_fingerprint},
        "every partition's shards share the pinned tokenizer fingerprint",
    )
