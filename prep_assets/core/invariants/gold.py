"""Gold invariants: the row rules judged example by example (in one pass when judged together), accounting,
the reject rate, preference pairs and the tabular budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep_assets.core.invariants.common import (
    _LOCATION,
    SAMPLE,
    Outcome,
    _bound,
    _one_to_one,
    _query,
    _scalar,
    _violating_rows,
    _violations_in,
    integer_list_problems,
)
from prep_assets.core.records import GOLD_SCHEMA, TYPE_COMPLETION, TYPE_EOS, TYPE_PADDING, TYPE_PROMPT
from prep_assets.core.sql import connect as sql_connect

# the largest token type a gold example may hold
_LAST_TYPE = max(TYPE_PROMPT, TYPE_COMPLETION, TYPE_PADDING, TYPE_EOS)
# the types trained unless the spec says otherwise (`masking.trainable_types`)
_TRAINED = (TYPE_COMPLETION, TYPE_EOS)


@dataclass(frozen=True)
class RowRule:
    """A gold invariant judged example by example: the rows where `where` holds (our own SQL over a gold row) are
    its violations, named with `columns` beside their id and location; `params` are bound, `facts` reported (the
    params where None)."""

    where: str
    columns: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    # also a violation: the file holds gold's integer lists otherwise (`integer_list_problems`)
    names_file: bool = False


def gold_rows(gold_dir: Path, rules: list[RowRule]) -> list[Outcome]:
    """The outcomes of several row rules from one pass over gold: every rule's flag is computed per row, the rows
    that break any (normally none) are kept in a temp table, and each rule is counted and sampled from there."""
    p: dict[str, Any] = {"g": str(gold_dir / "examples.parquet")}
    for rule in rules:
        p.update(rule.params)
    problems = (
        integer_list_problems([gold_dir / "examples.parquet"], GOLD_SCHEMA) if any(r.names_file for r in rules) else []
    )
    flags = ", ".join(f"coalesce(({rule.where}), false) AS broken_{i}" for i, rule in enumerate(rules))
    broken_any = " OR ".join(f"broken_{i}" for i in range(len(rules)))
    create = f"CREATE TEMP TABLE flagged AS SELECT * FROM (SELECT *, {flags} FROM read_parquet($g)) WHERE {broken_any}"
    out = []
    with sql_connect() as con:
        con.execute(create, _bound(create, p))
        for i, rule in enumerate(rules):
            flag = f"broken_{i}"
            n, bad = _violations_in(con, "flagged", flag, f"example_id, {_LOCATION}{rule.columns}", p, "source_line")
            named = problems if rule.names_file else []
            facts = dict(rule.params) if rule.facts is None else rule.facts
            out.append(Outcome(n + len(named), (named + bad)[:SAMPLE], facts))
            con.execute("DROP TABLE violations")
    return out


def mask_aligned_rule(trainable_types: tuple[int, ...] = _TRAINED) -> RowRule:
    """No NULL list, value or count; equal list lengths; mask in {0,1}; mask 1 only on the types the spec trains;
    counts match the lists; the file holds the lists as lists of integers (a float mask of 0.5, 0.5 and 1 would
    otherwise pass every rule). A comparison with a NULL is NULL, read as passing: hence the NULL checks first."""
    where = (
        "num_tokens IS NULL OR num_loss_tokens IS NULL OR token_ids IS NULL OR loss_mask IS NULL "
        "OR token_type_ids IS NULL OR list_count(token_ids) < len(token_ids) "
        "OR list_count(loss_mask) < len(loss_mask) OR list_count(token_type_ids) < len(token_type_ids) "
        "OR len(token_ids) <> len(loss_mask) OR len(token_ids) <> len(token_type_ids) OR len(token_ids) <> num_tokens "
        "OR list_max(loss_mask) > 1 OR list_min(loss_mask) < 0 OR list_max(token_type_ids) > $last_type "
        "OR list_min(token_type_ids) < 0 "
        "OR list_sum(loss_mask) <> num_loss_tokens OR list_count(list_filter(list_zip(loss_mask, token_type_ids), "
        "lambda x: x[1] = 1 AND NOT list_contains($trainable_types, x[2]))) > 0"
    )
    trained = list(trainable_types)
    return RowRule(
        where,
        params={"trainable_types": trained, "last_type": _LAST_TYPE},
        facts={"trainable_types": trained},
        names_file=True,
    )


def loss_tokens_rule() -> RowRule:
    return RowRule("coalesce(list_sum(loss_mask), 0) = 0")


def ids_in_vocab_rule(vocab_size: int) -> RowRule:
    return RowRule(
        "list_max(token_ids) >= $vocab_size OR list_min(token_ids) < 0",
        ", list_max(token_ids) AS max_id",
        {"vocab_size": vocab_size},
    )


def within_max_len_rule(max_seq_len: int, splits_examples: bool = False) -> RowRule:
    """1 <= tokens <= max_seq_len; with `splits_examples` (packing full, or window overflow) only 1 <= tokens."""
    if splits_examples:
        return RowRule(
            "len(token_ids) = 0",
            ", len(token_ids) AS tokens",
            facts={"max_seq_len": max_seq_len, "splits_examples": True},
        )
    return RowRule(
        "len(token_ids) > $max_seq_len OR len(token_ids) = 0",
        ", len(token_ids) AS tokens",
        {"max_seq_len": max_seq_len},
    )


def gold_mask_aligned(gold_dir: Path, trainable_types: tuple[int, ...] = _TRAINED) -> Outcome:
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
        int(rate > max_rate),
        examples,
        facts,
        f"gold rejects / silver records = {rejects} / {records} = {rate:.2%} (at most {max_rate:.2%})",
    )


# what makes a group or a record fit one example (the batch count of a group is not a remedy: a group is whole)
TABULAR_REMEDIES = {
    "group": "group by a finer column (tabular.group_by), or raise sequence.max_seq_len",
    "record": "raise sequence.max_seq_len (a record must fit with the schema prompt and BOS/EOS), or shorten the "
    "record's cells or leave it out",
}


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
    description = ""
    if n:
        worst = ", ".join(
            f"{b['kind']} {b['name']!r} ({b['tokens']} tokens, {b['records']} record(s), {b['location']})"
            for b in bad[:5]
        )
        description = (
            f"{n} group(s)/record(s) cannot fit one example of max_seq_len {max_seq_len} tokens with "
            f"the schema prompt and BOS/EOS; largest: {worst}{' ...' if n > 5 else ''}. "
            + " ".join(
                f"For a {kind}: {TABULAR_REMEDIES[kind]}."
                for kind in ("group", "record")
                if any(b["kind"] == kind for b in bad)
            )
        )
    return Outcome(n, bad, {"max_seq_len": max_seq_len}, description)


def gold_pairs_complete(gold_dir: Path) -> Outcome:
    """Preference pairs: one chosen + one rejected example, one split, the same masked shared prompt tokens. An
    example of no pair (a NULL `pair_id`, which the preference writer never leaves) is a violation of its own."""
    sql = """
        WITH e AS (SELECT pair_id, branch, split, source_file || ':' || source_line AS location,
                          CASE WHEN pair_id IS NULL THEN file_row_number END AS unpaired,
                          shared_prefix_tokens AS shared, list_slice(token_ids, 1, shared_prefix_tokens) AS prompt,
                          coalesce(list_sum(list_slice(loss_mask, 1, shared_prefix_tokens)), 0) AS prompt_loss
                   FROM read_parquet($g, file_row_number = true))
        SELECT pair_id, any_value(location) AS location, count(*) AS examples,
               count(*) FILTER (branch = 'chosen') AS chosen, count(DISTINCT split) AS splits,
               count(DISTINCT prompt) AS prompts, min(shared) AS shared, max(prompt_loss) AS prompt_loss
        FROM e GROUP BY pair_id, unpaired
        HAVING pair_id IS NULL OR count(*) <> 2 OR count(*) FILTER (branch = 'chosen') <> 1
            OR count(*) FILTER (branch = 'rejected') <> 1 OR count(DISTINCT split) <> 1
            OR count(DISTINCT prompt) <> 1 OR count(DISTINCT shared) <> 1 OR min(coalesce(shared, 0)) < 1
            OR max(prompt_loss) > 0
    """
    n, bad = _violating_rows(f"({sql})", "true", "*", {"g": str(gold_dir / "examples.parquet")}, order="pair_id")
    pairs = _scalar("SELECT count(DISTINCT pair_id) FROM read_parquet($g)", {"g": str(gold_dir / "examples.parquet")})
    return Outcome(n, bad, {"pairs": pairs})
