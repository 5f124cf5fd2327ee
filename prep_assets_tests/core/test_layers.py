"""The layers end to end in core (no Dagster), on real data with the real GPT-2 tokenizer."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from prep_assets.core import gates
from prep_assets.core import invariants as inv
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.drops import register_drops, resolve_drop
from prep_assets.core.lake import dataset_paths, read_json
from prep_assets.core.silver import build_clean_records
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import make_spec, shared_path, tree_digests
from prep_assets_tests.core.helpers import failed_gates, run_core, run_one_file

L = 1024


def gsm_spec(gpt2: Path) -> DatasetSpec:
    return make_spec(
        "gsm",
        input={"type": "instruction", "prompt_key": "question", "completion_key": "answer", "prompt_postfix": "\n"},
        tokenizer={"path": str(gpt2)},
        sequence={"max_seq_len": L},
        split={"validation_ratio": 0.05, "test_ratio": 0.02},
        output={"max_tokens_per_shard": 300 * L},
    )


@pytest.fixture(scope="module")
def gsm_run(tmp_path_factory: pytest.TempPathFactory):
    gpt2 = shared_path("tokenizers/gpt2")
    src = shared_path("datasets/instruction/gsm8k_train.jsonl")
    data_dir = tmp_path_factory.mktemp("gsm")
    spec = gsm_spec(gpt2)
    return data_dir, spec, run_one_file(data_dir, spec, src)[1]


def test_gsm8k_every_record_flows_to_shards(gsm_run):
    _, _, r = gsm_run
    assert r["bronze"].lines_in == r["bronze"].records == 7473
    assert r["silver"].records + r["silver"].rejects == 7473
    assert r["gold"].examples == r["silver"].records
    totals = r["shards"].totals
    assert totals["output_tokens"] == r["gold"].tokens and totals["loss_tokens"] == r["gold"].loss_tokens
    assert totals["sequence_utilization"] > 0.95
    assert len(r["shards"].splits["train"]["files"]) > 1  # max_tokens_per_shard splits files


def test_gsm8k_all_invariants_hold(gsm_run):
    _, _, r = gsm_run
    b, s, g, sh = r["dirs"]
    files = inv.shard_files(sh)
    outcomes = [
        inv.bronze_accounted(b, r["source"]),
        inv.bronze_reject_rate(b, 0.0),
        inv.bronze_required_fields(b),
        inv.silver_unique(s),
        inv.silver_lengths(s, 1, None),
        inv.silver_accounted(s, b),
        inv.gold_mask_aligned(g),
        inv.gold_loss_tokens(g),
        inv.gold_ids_in_vocab(g, 50257),
        inv.gold_within_max_len(g, L),
        inv.gold_accounted(g, s),
        inv.shards_fixed_length(files, L),
        inv.shards_padding_masked(files, 50256),
        inv.shards_positions_restart(files),
        inv.shards_tokens_conserved(files, g, inv.Layout(L)),
        inv.shards_match_gold(files, g),
        inv.shards_utilization(files, L, 0.9),
    ]
    assert [(o.name, o.violations, o.offending[:1]) for o in outcomes if not o.passed] == []


def test_the_shard_row_gates_of_a_real_lake_pass_through_the_screen(gsm_run):
    """The gates judged together read the screen (one hash pass a side) and it passes every row of a good lake:
    were it to miss one, the gates would still be right (the exact pass) but no faster."""
    data_dir, spec, r = gsm_run
    sh = r["dirs"][3]
    judges = [g.judge for g in gates.gates_for(spec) if isinstance(g.judge, gates.ShardRows)]
    assert {j.part for j in judges} >= inv.SCREENED_PARTS
    rows = gates.ShardRows.shared(gates.Subject(spec, dataset_paths(data_dir, spec.name), sh.name), judges)
    assert inv.shards_gold.SCREENED in rows.column_names
    assert rows.num_rows == sum(pq.ParquetFile(f).metadata.num_rows for f in inv.shard_files(sh)) > 0
    assert failed_gates(spec, data_dir, sh.name) == []


def test_shards_verified_independently_with_duckdb(gsm_run):
    """Checks written here from the shard contract of docs/shards.md, not through core.invariants."""
    _, _, r = gsm_run
    _, _, g, sh = r["dirs"]
    files = [str(p) for p in sorted(sh.glob("*/*.parquet"))]
    with duckdb.connect() as con:
        rows = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE len(input_ids) <> $L OR len(loss_mask) <> $L "
            "OR len(position_ids) <> $L OR len(segment_ids) <> $L) FROM read_parquet($f)",
            {"f": files, "L": L},
        ).fetchall()[0]
        assert rows[0] > 0 and rows[1] == 0
        tokens = con.execute(
            """
            WITH t AS (SELECT filename f, file_row_number r, unnest(segment_ids) s, unnest(position_ids) p,
                              unnest(loss_mask) m, generate_subscripts(segment_ids, 1) i
                       FROM read_parquet($f, filename = true, file_row_number = true))
            SELECT count(*) FILTER (WHERE s = 0 AND m <> 0),
                   count(*) FILTER (WHERE s > 0 AND p = 0 AND m <> 0),
                   count(*) FILTER (WHERE s > 0)
            FROM t
            """,
            {"f": files},
        ).fetchall()[0]
        assert tokens[0] == 0, "padding carries loss"
        assert tokens[1] == 0, "a segment's first token is trained"
        gold_tokens = con.execute(
            "SELECT sum(len(token_ids)) FROM read_parquet($g)", {"g": str(g / "examples.parquet")}
        ).fetchall()[0][0]
        assert tokens[2] == gold_tokens, "tokens not conserved"
        # positions: within a segment, position = index - index of the segment's first token
        bad_pos = con.execute(
            """
            WITH t AS (SELECT filename f, file_row_number r, unnest(segment_ids) s, unnest(position_ids) p,
                              generate_subscripts(segment_ids, 1) i
                       FROM read_parquet($f, filename = true, file_row_number = true))
            SELECT count(*) FROM t
            JOIN (SELECT f, r, s, min(i) AS first FROM t WHERE s > 0 GROUP BY ALL) USING (f, r, s)
            WHERE p <> i - first
            """,
            {"f": files},
        ).fetchall()[0][0]
        assert bad_pos == 0
        no_loss = con.execute(
            "SELECT count(*) FROM read_parquet($g) WHERE list_sum(loss_mask) = 0", {"g": str(g / "examples.parquet")}
        ).fetchall()[0][0]
        assert no_loss == 0


def test_bfd_rows_within_a_thousandth_of_the_lower_bound_per_split(gsm_run):
    _, _, r = gsm_run
    for split, m in r["shards"].splits.items():
        if m["gold_tokens"]:
            bound = math.ceil(m["gold_tokens"] / L)
            assert m["sequences"] <= 1.001 * bound, (split, m["sequences"], bound)


def test_rerun_with_other_batch_size_is_byte_identical(gsm_run, tmp_path: Path):
    data_dir, spec, _ = gsm_run
    other = tmp_path / "again"
    (other / "raw" / "gsm").mkdir(parents=True)
    for f in (data_dir / "raw" / "gsm").iterdir():
        shutil.copyfile(f, other / "raw" / "gsm" / f.name)
    run_core(other, spec, batch_size=777)
    a, b = tree_digests(data_dir / "lake" / "gsm"), tree_digests(other / "lake" / "gsm")
    assert a.keys() == b.keys() and a == b


def test_manifest_lists_every_shard_with_checksums(gsm_run):
    data_dir, spec, r = gsm_run
    manifest = read_json(data_dir / "lake" / "gsm" / "manifest.json")
    files = [f for s in manifest["splits"].values() for f in s["files"]]
    assert len(files) == sum(len(m["files"]) for m in r["shards"].splits.values())
    for f in files:
        path = data_dir / "lake" / "gsm" / f["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]
    assert manifest["max_seq_len"] == L and manifest["config_hash"] == spec.fingerprint()
    assert manifest["splits"]["train"]["max_batch_size"] == min(
        f["sequences"] for f in manifest["splits"]["train"]["files"]
    )


def test_csv_drop_through_every_layer_with_every_gate(tmp_path: Path):
    src = shared_path("datasets/tabular/clinc_oos.csv")
    spec = make_spec(
        "clinc",
        input={"type": "text", "text_key": "text"},
        tokenizer={"path": str(shared_path("tokenizers/gpt2"))},
        sequence={"max_seq_len": 256},
    )
    key, r = run_one_file(tmp_path, spec, src)
    rows = sum(1 for _ in src.open(encoding="utf-8")) - 1
    assert r["bronze"].unit == "row" and r["bronze"].records == rows and r["bronze"].rejects == 0
    assert failed_gates(spec, tmp_path, key) == []
    first = pq.read_table(r["dirs"][0] / "records.parquet").slice(0, 1).to_pylist()[0]
    assert first["source_line"] == 2 and first["content"] == '{"text":"define sonogram"}'


def test_parquet_drop_keeps_embedded_carriage_returns_through_every_gate(tmp_path: Path):
    src = shared_path("datasets/tabular/embedded_carriage_return.parquet")
    spec = make_spec(
        "cr",
        input={"type": "text", "text_key": "text"},
        clean={"normalize": False},
        tokenizer={"path": str(shared_path("tokenizers/gpt2"))},
        sequence={"max_seq_len": 64},
    )
    key, r = run_one_file(tmp_path, spec, src)
    assert r["bronze"].records == 2 and r["gold"].examples == 2
    assert failed_gates(spec, tmp_path, key) == []
    contents = [
        json.loads(c)["text"] for c in pq.read_table(r["dirs"][1] / "records.parquet").column("content").to_pylist()
    ]
    assert any("\r AAAAAGAAAHHHH" in c for c in contents)


def test_bronze_and_silver_run_their_records_with_the_cycle_collector_off_and_turn_it_back_on(
    tmp_path: Path, monkeypatch
):
    import gc

    assert gc.isenabled()
    spec = make_spec("t")
    paths = dataset_paths(tmp_path, "t")
    paths.raw_dir.mkdir(parents=True)
    # a repeated record: silver looks for hash collisions only after a pass that met some hash twice
    (paths.raw_dir / "a.jsonl").write_text(
        '{"text": "one two three"}\n{"text": "four five six"}\n{"text": "one two three"}\n'
    )
    register_drops(paths)
    drop, src = resolve_drop(paths, next(p.stem for p in paths.drops_dir.glob("*.json")))
    seen: list[tuple[str, bool]] = []

    from prep_assets.core import bronze, silver

    def watch(module, name: str):
        real = getattr(module, name)

        def wrapped(*args, **kwargs):
            seen.append((name, gc.isenabled()))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)

    watch(bronze, "canonical_json")  # per record in bronze
    watch(silver, "canonical_json")  # per normalized record in silver
    watch(silver, "content_texts")  # per record in silver
    b, s = paths.partition_dir("bronze", "k"), paths.partition_dir("silver", "k")
    assert build_raw_records(spec, drop, src, b).records == 3 and gc.isenabled()
    # a hash collision makes silver run its pass again: the collector is off in both passes
    real_collisions, passes = silver.dedup.collisions, []

    def collide_once(*args):
        passes.append(1)
        return real_collisions(*args) | ({"0" * 64} if len(passes) == 1 else set())

    monkeypatch.setattr(silver.dedup, "collisions", collide_once)
    assert build_clean_records(spec, b, s).records == 2 and gc.isenabled()
    assert len(passes) == 2 and seen.count(("content_texts", False)) == 6
    assert sorted(set(seen)) <= [("canonical_json", False), ("content_texts", False)]

    def broken(*_, **__):
        raise RuntimeError("broke")

    for module, name, build in (
        (silver, "content_texts", lambda: build_clean_records(spec, b, tmp_path / "s2")),
        (bronze, "canonical_json", lambda: build_raw_records(spec, drop, src, tmp_path / "b2")),
    ):
        monkeypatch.setattr(module, name, broken)
        with pytest.raises(RuntimeError, match="broke"):
            build()
        assert gc.isenabled()


def test_gold_text_of_every_instruction_example_is_prefix_prompt_postfix_completion_as_silver_kept_them(
    tmp_path: Path, gpt2_dir: Path
):
    """Cleaning never joins two fields: the decoded gold tokens are exactly the silver fields concatenated."""
    pairs = [
        ("Q: 2+2=\n", "4"),
        ("...or maybe? ", "Yes"),
        ("line one  \nline two \t", " answer \n"),
        ("no separator", "glued"),
        ("tabs\t\t", "\tindented"),
    ]
    lines = b"".join(json.dumps({"prompt": p, "completion": c}).encode() + b"\n" for p, c in pairs)
    data_dir = tmp_path / "data"
    (data_dir / "raw" / "inst").mkdir(parents=True)
    (data_dir / "raw" / "inst" / "a.jsonl").write_bytes(lines)
    spec = make_spec(
        "inst",
        input={"type": "instruction", "prompt_prefix": "<<", "prompt_postfix": ">>"},
        tokenizer={"path": str(gpt2_dir)},
        sequence={"max_seq_len": 64},
    )
    out = run_core(data_dir, spec)
    (run,) = out.values()
    silver = pq.read_table(run["dirs"][1] / "records.parquet").to_pylist()
    gold = pq.read_table(run["dirs"][2] / "examples.parquet").to_pylist()
    assert len(silver) == len(gold) == len(pairs)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(dataset_paths(data_dir, "inst").tokenizer_dir / "tokenizer.json"))
    by_id = {r["record_id"]: json.loads(r["content"])["turns"][0] for r in silver}
    for ex in gold:
        turn = by_id[ex["record_id"]]
        expected = "<<" + turn["prompt"] + ">>" + turn["completion"] + "<|endoftext|>"
        assert tok.decode(ex["token_ids"]) == expected
    prompts = {t["prompt"] for t in by_id.values()}
    assert {"Q: 2+2=\n", "...or maybe? ", "line one\nline two \t"} <= prompts  # the separators survived cleaning
