"""Each invariant fails on a deliberately corrupted fixture and names the offending rows."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import invariants as inv
from prep_assets.core.records import BRONZE_SCHEMA, SHARD_SCHEMA
from prep_assets_tests.core.lakes import (
    GOOD,
    shard_row,
    write_gold,
    write_shard,
    write_silver_and_gold_rejects,
)


def test_bronze_required_fields_names_repeated_ids_and_content_that_is_no_json(tmp_path: Path):
    base = {"drop": "d", "source_file": "f.jsonl", "byte_offset": 0, "record_sha256": "x", "domain": None}
    rows = [
        {**base, "record_id": "d:1", "source_line": 1, "record": "{}", "content": '{"text":"a"}'},
        {**base, "record_id": "d:2", "source_line": 2, "record": "{}", "content": '{"text":'},
        {**base, "record_id": "d:3", "source_line": 3, "record": "{}", "content": '{"text":"c"}'},
        {**base, "record_id": "d:3", "source_line": 4, "record": "{}", "content": '{"text":"d"}'},
    ]
    (tmp_path / "b").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=BRONZE_SCHEMA), tmp_path / "b" / "records.parquet")
    out = inv.bronze_required_fields(tmp_path / "b")
    assert out.violations == 3
    assert sorted((r["record_id"], r["location"]) for r in out.offending) == [
        ("d:2", "f.jsonl:2"),
        ("d:3", "f.jsonl:3"),
        ("d:3", "f.jsonl:4"),
    ]


def test_gold_mask_misaligned_is_named_with_file_and_line(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD, {"token_ids": [5, 6, 7], "loss_mask": [0, 1], "token_type_ids": [1, 1, 3]}])
    out = inv.gold_mask_aligned(g)
    assert out.violations == 1 and out.offending == [{"example_id": "d:2", "location": "f.jsonl:2"}]


def test_gold_lists_held_as_floats_fail_mask_aligned_judged_alone_or_together(tmp_path: Path):
    """A mask of 0.5, 0.5 and 1 sums to its count and stays within {0..1}: the file itself is the violation."""
    g = write_gold(tmp_path / "g", [GOOD])
    examples = pq.read_table(g / "examples.parquet")
    at = examples.schema.get_field_index("loss_mask")
    floats = examples.set_column(
        at, pa.field("loss_mask", pa.list_(pa.float64())), pa.array([[0.5, 0.5, 1]], pa.list_(pa.float64()))
    )
    pq.write_table(floats, g / "examples.parquet")
    alone = inv.gold_mask_aligned(g)
    named = {"file": str(g / "examples.parquet"), "column": "loss_mask", "type": "list<element: double>"}
    assert alone.violations == 1 and alone.offending == [named]
    rules = [inv.mask_aligned_rule(), inv.loss_tokens_rule(), inv.ids_in_vocab_rule(50)]
    together = inv.gold_rows(g, rules)
    assert together[0] == alone and together[1].passed and together[2].passed  # only mask_aligned names the file


_GOLD_NULLS = {
    "null_num_tokens": {"num_tokens": None},
    "null_num_loss_tokens": {"num_loss_tokens": None},
    "null_token_ids": {"token_ids": None},
    "null_loss_mask": {"loss_mask": None},
    "null_token_type_ids": {"token_type_ids": None},
    "null_id_in_the_list": {"token_ids": [5, None, 7]},
    "null_mask_value_on_a_completion_token": {"loss_mask": [0, None, 1], "num_loss_tokens": 1},
    "null_type_of_a_trained_token": {"token_type_ids": [1, None, 3]},
}


@pytest.mark.parametrize("over", list(_GOLD_NULLS.values()), ids=list(_GOLD_NULLS))
def test_gold_nulls_another_writer_might_leave_fail_mask_aligned(tmp_path: Path, over: dict):
    """Gold's own writer cannot leave a NULL (its schema forbids them); a comparison with one is NULL, not true."""
    g = write_gold(tmp_path / "g", [GOOD])
    examples = pq.read_table(g / "examples.parquet")
    row = {**examples.to_pylist()[0], **over}
    schema = pa.schema(
        [f.with_type(pa.list_(f.type.value_type)) if pa.types.is_list(f.type) else f for f in examples.schema]
    )
    schema = pa.schema([f.with_nullable(True) for f in schema])
    pq.write_table(pa.Table.from_pylist([row], schema=schema), g / "examples.parquet")
    out = inv.gold_mask_aligned(g)
    assert out.violations == 1 and out.offending == [{"example_id": "d:1", "location": "f.jsonl:1"}]


def test_gold_mask_on_prompt_type_fails(tmp_path: Path):
    g = write_gold(tmp_path / "g", [{"token_ids": [5, 6], "loss_mask": [0, 1], "token_type_ids": [0, 0]}])
    assert inv.gold_mask_aligned(g).violations == 1


def test_gold_no_loss_tokens_ids_out_of_vocab_and_too_long(tmp_path: Path):
    g = write_gold(
        tmp_path / "g",
        [
            GOOD,
            {"token_ids": [1, 2], "loss_mask": [0, 0], "token_type_ids": [1, 3]},
            {"token_ids": [1, 99, 3, 4], "loss_mask": [0, 1, 1, 1], "token_type_ids": [1, 1, 1, 3]},
        ],
    )
    assert inv.gold_loss_tokens(g).offending[0]["example_id"] == "d:2"
    assert inv.gold_ids_in_vocab(g, 50).offending[0]["example_id"] == "d:3"
    assert inv.gold_within_max_len(g, 3).offending[0]["example_id"] == "d:3"
    assert inv.gold_mask_aligned(g).passed


def test_good_shard_passes_every_shard_invariant(tmp_path: Path):
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])]
    g = write_gold(tmp_path / "g", [GOOD])
    for out in (
        inv.shards_fixed_length(f, 4),
        inv.shards_padding_masked(f, 0),
        inv.shards_positions_restart(f),
        inv.shards_tokens_conserved(f, g, inv.Layout(4)),
        inv.shards_match_gold(f, g),
        inv.shards_utilization(f, 4, 0.7),
    ):
        assert out.passed, out


@pytest.mark.parametrize(
    ("corruption", "invariant"),
    [
        ({"input_ids": [5, 6, 7]}, lambda f, g: inv.shards_fixed_length(f, 4)),
        ({"loss_mask": [0, 1, 1, 1]}, lambda f, g: inv.shards_padding_masked(f, 0)),
        ({"input_ids": [5, 6, 7, 9]}, lambda f, g: inv.shards_padding_masked(f, 0)),
        ({"position_ids": [0, 1, 3, 0]}, lambda f, g: inv.shards_positions_restart(f)),
        ({"position_ids": [1, 2, 3, 0]}, lambda f, g: inv.shards_positions_restart(f)),
        ({"loss_mask": [1, 1, 1, 0], "num_loss_tokens": 3}, lambda f, g: inv.shards_positions_restart(f)),
        ({"segment_ids": [2, 2, 2, 0]}, lambda f, g: inv.shards_positions_restart(f)),
        ({"num_loss_tokens": 1}, lambda f, g: inv.shards_fixed_length(f, 4)),
        ({"example_ids": ["d:9"]}, lambda f, g: inv.shards_tokens_conserved(f, g, inv.Layout(4))),
        ({"example_offsets": [1]}, lambda f, g: inv.shards_tokens_conserved(f, g, inv.Layout(4))),
        ({"seq_lengths": [2]}, lambda f, g: inv.shards_tokens_conserved(f, g, inv.Layout(4))),
        ({"input_ids": [5, 7, 6, 0]}, lambda f, g: inv.shards_match_gold(f, g)),
        ({"loss_mask": [0, 0, 1, 0], "num_loss_tokens": 1}, lambda f, g: inv.shards_match_gold(f, g)),
        ({"token_type_ids": [1, 1, 1, 2]}, lambda f, g: inv.shards_match_gold(f, g)),
    ],
    ids=[
        "short_row",
        "padding_trained",
        "padding_not_pad_id",
        "position_gap",
        "position_not_restarted",
        "segment_start_trained",
        "segments_not_from_one",
        "loss_count_wrong",
        "unknown_example",
        "wrong_offset",
        "tokens_lost",
        "tokens_swapped",
        "loss_lost",
        "eos_type_lost",
    ],
)
def test_corrupted_shard_fails_its_invariant(tmp_path: Path, corruption, invariant):
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(**corruption)])]
    g = write_gold(tmp_path / "g", [GOOD])
    out = invariant(f, g)
    assert not out.passed and out.offending


@pytest.mark.parametrize(
    ("row", "bad_tokens"),
    [
        ({"segment_ids": [1, 0, 1, 0], "loss_mask": [0, 1, 1, 0]}, [2]),  # trained padding mid-row, clean tail
        (
            {
                "segment_ids": [1, 0, 1, 0],
                "input_ids": [5, 0, 7, 0],
                "position_ids": [0, 0, 0, 0],
                "loss_mask": [0, 0, 0, 0],
                "token_type_ids": [1, 2, 3, 2],
            },
            [],
        ),  # clean padding mid-row
        (
            {
                "segment_ids": [1, 1, 0, 0],
                "input_ids": [5, 6, 0, 0],
                "position_ids": [0, 1, 0, 0],
                "loss_mask": [0, 1, 0, 0],
                "token_type_ids": [1, 1, 2, 1],
            },
            [4],
        ),  # tail not all padding type
        ({"segment_ids": [1, 1, 1, 1], "input_ids": [5, 6, 7, 0], "position_ids": [0, 1, 2, 3]}, []),  # no padding
        (
            {
                "segment_ids": [1, 1, 0, None],
                "input_ids": [5, 6, 0, 9],
                "loss_mask": [0, 1, 0, 1],
                "position_ids": [0, 1, 0, 5],
                "token_type_ids": [1, 1, 2, 3],
            },
            [],
        ),  # a NULL segment is no padding token
        ({"position_ids": [0, 1, 2, 5]}, [4]),
    ],  # padding at a position
    ids=[
        "trained_padding_mid_row",
        "clean_padding_mid_row",
        "tail_type_wrong",
        "no_padding",
        "null_segment",
        "padding_position",
    ],
)
def test_padding_gate_judges_every_segment_0_token_not_only_a_clean_tail(tmp_path: Path, row, bad_tokens):
    # its first step sets aside rows whose tokens from the first segment-0 one on are all clean padding
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(**row)])]
    out = inv.shards_padding_masked(f, 0)
    assert [r["token"] for r in out.offending] == bad_tokens and out.violations == len(bad_tokens)


@pytest.mark.parametrize(
    "seq_lengths",
    [[2, 0, 2], [2, None, 2], [2, -1, 2], [2, 1_000_000_000], None],
    ids=["empty_segment", "null_length", "negative_length", "huge_length", "no_lengths"],
)
def test_positions_restart_judges_tokens_not_seq_lengths_and_catches_a_skipped_segment(tmp_path: Path, seq_lengths):
    # its first step sets aside rows laid out exactly as their (sane) seq_lengths say; what it passes on is judged
    # token by token, and no corrupt seq_lengths can make a skipped segment number look laid out
    two = {
        "input_ids": [5, 6, 7, 8],
        "loss_mask": [0, 1, 0, 1],
        "position_ids": [0, 1, 0, 1],
        "segment_ids": [1, 1, 2, 2],
        "token_type_ids": [1, 1, 1, 1],
        "seq_lengths": [2, 2],
        "example_ids": ["d:1", "d:2"],
        "example_offsets": [0, 0],
        "num_loss_tokens": 2,
    }
    ok = [write_shard(tmp_path / "a" / "train" / "part-00000.parquet", [shard_row(), two])]
    assert inv.shards_positions_restart(ok).passed
    skipped = {
        **two,
        "segment_ids": [1, 1, 3, 3],
        "seq_lengths": seq_lengths,
        "example_ids": ["d:1", "d:3", "d:2"],
        "example_offsets": [0, 0, 0],
    }
    out = inv.shards_positions_restart(
        [write_shard(tmp_path / "b" / "train" / "part-00000.parquet", [shard_row(), skipped])]
    )
    assert out.violations == 1 and out.offending[0]["row"] == 1 and out.offending[0]["token"] == 3


def test_utilization_below_threshold_fails(tmp_path: Path):
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])]
    out = inv.shards_utilization(f, 4, 0.9)
    assert not out.passed and out.facts["sequence_utilization"] == 0.75


def test_silver_duplicates_and_accounting(tmp_path: Path):
    from prep_assets.core.records import BRONZE_SCHEMA, SILVER_REJECT_SCHEMA, SILVER_SCHEMA

    b, s = tmp_path / "b", tmp_path / "s"
    b.mkdir(), s.mkdir()
    prov = {"drop": "d", "source_file": "f", "byte_offset": 0}
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    **prov,
                    "record_id": f"d:{i}",
                    "source_line": i,
                    "record_sha256": "x",
                    "record": "{}",
                    "content": "{}",
                }
                for i in (1, 2, 3)
            ],
            schema=BRONZE_SCHEMA,
        ),
        b / "records.parquet",
    )
    kept = [
        {
            **prov,
            "record_id": f"d:{i}",
            "source_line": i,
            "content": "{}",
            "content_sha256": "h",
            "num_chars": 5,
            "split": "train",
        }
        for i in (1, 2)
    ]
    pq.write_table(pa.Table.from_pylist(kept, schema=SILVER_SCHEMA), s / "records.parquet")
    pq.write_table(pa.Table.from_pylist([], schema=SILVER_REJECT_SCHEMA), s / "rejects.parquet")
    assert inv.silver_unique(s).offending[0]["record_ids"] == ["d:1", "d:2"]
    lost = inv.silver_accounted(s, b)
    assert lost.violations == 1 and lost.offending[0]["record_id"] == "d:3"


def test_count_lines_of_truncated_gzip_is_unknown_not_a_crash(tmp_path: Path):
    import gzip

    data = gzip.compress(b"".join(b'{"text": "row %d"}\n' % i for i in range(5000)))
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    assert inv.count_lines(tmp_path / "t.jsonl.gz", "jsonl.gz") is None
    (tmp_path / "ok.jsonl").write_bytes(b"a\nb\nc")
    assert inv.count_lines(tmp_path / "ok.jsonl", "jsonl") == 3


def test_count_elements_is_independent_of_the_reader(tmp_path: Path):
    (tmp_path / "a.json").write_text('[1, 2, {"x": [3]}]')
    (tmp_path / "b.json").write_text("[1, 2")
    assert inv.count_elements(tmp_path / "a.json") == 3 and inv.count_elements(tmp_path / "b.json") is None


def test_mask_on_prompt_passes_when_the_spec_trains_prompts(tmp_path: Path):
    g = write_gold(tmp_path / "g", [{"token_ids": [5, 6], "loss_mask": [0, 1], "token_type_ids": [0, 0]}])
    assert inv.gold_mask_aligned(g, trainable_types=(0, 1, 3)).passed
    assert not inv.gold_mask_aligned(g, trainable_types=(1, 3)).passed


def test_match_gold_and_positions_name_the_first_bad_token_of_a_later_segment(tmp_path: Path):
    """Two segments in one row: the segment-level gates must find where the second one starts (token 4)."""
    g = write_gold(tmp_path / "g", [GOOD, {"token_ids": [8, 9], "loss_mask": [0, 1], "token_type_ids": [1, 3]}])
    good = shard_row(
        input_ids=[5, 6, 7, 8, 9, 0],
        loss_mask=[0, 1, 1, 0, 1, 0],
        position_ids=[0, 1, 2, 0, 1, 0],
        segment_ids=[1, 1, 1, 2, 2, 0],
        token_type_ids=[1, 1, 3, 1, 3, 2],
        seq_lengths=[3, 2],
        example_ids=["d:1", "d:2"],
        example_offsets=[0, 0],
        num_loss_tokens=3,
    )
    ok = [write_shard(tmp_path / "ok" / "train" / "part-00000.parquet", [good])]
    assert inv.shards_match_gold(ok, g).passed and inv.shards_positions_restart(ok).passed
    swapped = [
        write_shard(tmp_path / "bad" / "train" / "part-00000.parquet", [{**good, "input_ids": [5, 6, 7, 9, 8, 0]}])
    ]
    out = inv.shards_match_gold(swapped, g)
    assert out.violations == 1 and out.offending[0]["example_id"] == "d:2" and out.offending[0]["token"] == 4
    trained_start = [
        write_shard(
            tmp_path / "start" / "train" / "part-00000.parquet",
            [{**good, "loss_mask": [0, 1, 1, 1, 1, 0], "num_loss_tokens": 4}],
        )
    ]
    out = inv.shards_positions_restart(trained_start)
    assert out.violations == 1 and out.offending[0]["token"] == 4
    assert inv.shards_match_gold(trained_start, g).offending[0]["token"] == 4


@pytest.mark.parametrize(
    ("second", "bad"),
    [
        ({}, []),
        ({"example_ids": ["d:9"]}, [(1, "d:9", 1)]),  # names no gold example
        ({"example_offsets": [1]}, [(1, "d:1", 1)]),  # reaches past the gold example's end
        ({"input_ids": [5, 6, 8, 0]}, [(1, "d:1", 3)]),  # one token changed, in the second row only
        ({"loss_mask": [1, 1, 1, 0], "num_loss_tokens": 3}, [(1, "d:1", 1)]),  # segment start trained
        ({"input_ids": [6, 5, 7, 0], "token_type_ids": [1, 1, 1, 2]}, [(1, "d:1", 1)]),
    ],  # two lists wrong at once
    ids=[
        "all_good",
        "unknown_example",
        "offset_past_the_end",
        "changed_token_in_a_later_row",
        "trained_start",
        "ids_and_types_wrong",
    ],
)
def test_match_gold_finds_the_bad_rows_then_their_segments_and_first_bad_token(tmp_path: Path, second, bad):
    """Pass 1 compares each row's token-hash sum with its gold's; pass 2 names the failing rows' segments."""
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(), shard_row(**second), shard_row()])]
    g = write_gold(tmp_path / "g", [GOOD])
    out = inv.shards_match_gold(f, g)
    assert [(r["row"], r["example_id"], r["token"]) for r in out.offending] == bad
    assert out.violations == len(bad)


def test_match_gold_rows_without_segments_pass_and_tokens_no_segment_names_are_their_own_violation(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD])
    padding = shard_row(
        input_ids=[0, 0, 0, 0],
        loss_mask=[0, 0, 0, 0],
        position_ids=[0, 0, 0, 0],
        segment_ids=[0, 0, 0, 0],
        token_type_ids=[2, 2, 2, 2],
        seq_lengths=[],
        example_ids=[],
        example_offsets=[],
        num_loss_tokens=0,
    )
    no_lengths = shard_row(seq_lengths=[])  # segments named but no lengths: nothing to compare (fixed_length flags it)
    ok = [write_shard(tmp_path / "ok" / "train" / "part-00000.parquet", [shard_row(), padding, no_lengths])]
    assert inv.shards_match_gold(ok, g).passed
    # seq_lengths covering a token that no example id names: the row fails though no listed segment does
    unnamed = shard_row(seq_lengths=[3, 1])
    bad_token = shard_row(input_ids=[5, 6, 8, 0])
    mixed = [write_shard(tmp_path / "bad" / "train" / "part-00000.parquet", [unnamed, bad_token])]
    out = inv.shards_match_gold(mixed, g)
    assert out.violations == 2
    assert [(r["row"], r["token"]) for r in out.offending] == [(0, None), (1, 3)]
    assert "disagree" in out.offending[0]["detail"]


@pytest.mark.parametrize(
    "row",
    [
        {"seq_lengths": [2]},  # the segment runs on past what seq_lengths lists
        # a trained token beyond the example, still numbered as its segment: every other gate judges only the tokens
        # seq_lengths covers (match_gold, tokens_conserved) or segment 0 (padding), so only this gate can see it
        {
            "input_ids": [5, 6, 7, 9],
            "loss_mask": [0, 1, 1, 1],
            "position_ids": [0, 1, 2, 3],
            "segment_ids": [1, 1, 1, 1],
            "token_type_ids": [1, 1, 3, 1],
            "num_loss_tokens": 3,
        },
        {
            "seq_lengths": [1, 2],
            "example_ids": ["d:1", "d:1"],
            "example_offsets": [0, 1],
        },  # one segment, listed as two
        {"seq_lengths": []},
    ],
    ids=["seq_lengths_short", "trained_token_past_the_segments", "one_segment_listed_as_two", "no_segments_listed"],
)
def test_positions_restart_fails_a_row_whose_segments_are_not_its_seq_lengths(tmp_path: Path, row):
    out = inv.shards_positions_restart(
        [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(), shard_row(**row)])]
    )
    assert out.violations == 1 and out.offending[0]["row"] == 1 and out.offending[0]["token"] is None
    assert "seq_lengths" in out.offending[0]["detail"]


def test_gold_row_rules_judged_in_one_pass_equal_each_judged_alone(tmp_path: Path):
    g = write_gold(
        tmp_path / "g",
        [
            GOOD,
            {"token_ids": [5, 6, 7], "loss_mask": [0, 1], "token_type_ids": [1, 1, 3]},
            {"token_ids": [1, 2], "loss_mask": [0, 0], "token_type_ids": [1, 3]},
            {"token_ids": [1, 99, 3, 4], "loss_mask": [0, 1, 1, 1], "token_type_ids": [1, 1, 1, 3]},
        ],
    )
    rules = [inv.mask_aligned_rule(), inv.loss_tokens_rule(), inv.ids_in_vocab_rule(50), inv.within_max_len_rule(3)]
    together = inv.gold_rows(g, rules)
    assert together == [inv.gold_rows(g, [rule])[0] for rule in rules]
    # in the order of the rules: mask_aligned, have_loss_tokens, ids_in_vocab, within_max_len
    assert [[r["example_id"] for r in o.offending] for o in together] == [["d:2"], ["d:3"], ["d:4"], ["d:4"]]
    assert together[2].offending[0]["max_id"] == 99 and together[3].offending[0]["tokens"] == 4


def test_shard_row_gates_judged_from_one_pass_equal_each_judged_alone(tmp_path: Path):
    """`shard_rows` with every part, handed to fixed_length, positions_restart and match_gold, gives each the outcome
    it finds on its own; rows broken for each gate, and a clean one, in two files."""
    a = write_shard(
        tmp_path / "train" / "part-00000.parquet",
        [
            shard_row(),
            shard_row(input_ids=[5, 6, 7]),
            shard_row(position_ids=[0, 1, 3, 0]),
            shard_row(input_ids=[5, 7, 6, 0]),
        ],
    )
    b = write_shard(
        tmp_path / "train" / "part-00001.parquet",
        [
            shard_row(seq_lengths=[2]),
            shard_row(num_loss_tokens=1),
            shard_row(seq_lengths=[]),
            shard_row(),
            shard_row(input_ids=[5, 6, 7, 9]),  # padding that is not the pad id
            shard_row(seq_lengths=[2], loss_mask=[0, 1, 1, 1], num_loss_tokens=3),  # laid out wrong, padding trained
        ],
    )
    g = write_gold(tmp_path / "g", [GOOD])
    files = [a, b]
    rows = inv.shard_rows(files, ["fixed", "layout", "checksum", "padding"], 4, pad_id=0)
    assert rows.num_rows == 10
    assert rows.column_names == ["file", "row", "length", "fixed_broken", "layout_differs", "h", "pad_suspect"]
    padding = inv.shards_padding_masked(files, 0, rows)
    assert [(r["file"].endswith("00001.parquet"), r["row"], r["token"]) for r in padding.offending] == [
        (True, 4, 4),
        (True, 5, 4),
    ]
    pairs = [
        (inv.shards_fixed_length(files, 4, rows), inv.shards_fixed_length(files, 4)),
        (inv.shards_positions_restart(files, rows), inv.shards_positions_restart(files)),
        (inv.shards_match_gold(files, g, 0, rows), inv.shards_match_gold(files, g)),
        (padding, inv.shards_padding_masked(files, 0)),
    ]
    for together, alone in pairs:
        assert together == alone and not together.passed
    assert [(r["file"].endswith("00000.parquet"), r["row"]) for r in pairs[0][0].offending] == [
        (True, 1),
        (False, 1),
        (False, 2),
    ]
    assert {(r["file"].endswith("00000.parquet"), r["row"]) for r in pairs[1][0].offending} >= {(True, 2), (False, 0)}
    assert (True, 3) in {(r["file"].endswith("00000.parquet"), r["row"]) for r in pairs[2][0].offending}


def test_shard_rows_pass_survives_seq_lengths_summing_past_32_bits_and_the_gates_name_the_row(tmp_path: Path):
    """The shared pass holds no value that a corrupt row can overflow: the row is reported, no gate raises."""
    f = [
        write_shard(
            tmp_path / "train" / "part-00000.parquet",
            [
                shard_row(),
                shard_row(seq_lengths=[2**31 - 1, 2**31 - 1], example_ids=["d:1", "d:1"], example_offsets=[0, 0]),
            ],
        )
    ]
    rows = inv.shard_rows(f, ["fixed", "layout", "checksum"], 4)
    assert rows.column("fixed_broken").to_pylist() == [False, True]
    assert rows.column("layout_differs").to_pylist() == [False, True]
    assert [r["row"] for r in inv.shards_fixed_length(f, 4, rows).offending] == [1]
    assert {r["row"] for r in inv.shards_positions_restart(f, rows).offending} == {1}


ALL_ROW_PARTS = ["fixed", "layout", "checksum", "padding"]


def _judged_from(files: list[Path], g: Path, rows: pa.Table) -> list[inv.Outcome]:
    return [
        inv.shards_fixed_length(files, 4, rows),
        inv.shards_positions_restart(files, rows),
        inv.shards_match_gold(files, g, 0, rows),
        inv.shards_padding_masked(files, 0, rows),
    ]


def _judged_alone(files: list[Path], g: Path) -> list[inv.Outcome]:
    return [
        inv.shards_fixed_length(files, 4),
        inv.shards_positions_restart(files),
        inv.shards_match_gold(files, g),
        inv.shards_padding_masked(files, 0),
    ]


def test_the_screen_passes_good_rows_and_its_gates_agree_with_each_judged_alone(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD, {"token_ids": [8, 9], "loss_mask": [0, 1], "token_type_ids": [1, 3]}])
    two = shard_row(
        input_ids=[8, 9, 5, 6],
        loss_mask=[0, 1, 0, 1],
        position_ids=[0, 1, 0, 1],
        segment_ids=[1, 1, 2, 2],
        token_type_ids=[1, 3, 1, 1],
        seq_lengths=[2, 2],
        example_ids=["d:2", "d:1"],
        example_offsets=[0, 0],
        num_loss_tokens=2,
    )  # d:2 whole, then d:1's first two tokens (a `full` row): two segments, no padding
    files = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(), two, shard_row()])]
    rows = inv.screened_rows(files, g, 0, 4, 0, ALL_ROW_PARTS)
    assert rows.column(inv.shards_gold.SCREENED).to_pylist() == [True] * 3
    assert rows.column("fixed_broken").to_pylist() == [False] * 3
    together = _judged_from(files, g, rows)
    assert together == _judged_alone(files, g) and all(o.passed for o in together)


@pytest.mark.parametrize(
    "corrupt",
    [
        {"input_ids": [5, 6, 8, 0]},
        {"input_ids": [5, 7, 6, 0]},  # two tokens swapped
        {"loss_mask": [0, 0, 1, 0], "num_loss_tokens": 1},
        {"loss_mask": [1, 1, 1, 0], "num_loss_tokens": 3},  # the segment start trained
        {"token_type_ids": [1, 1, 1, 2]},
        {"position_ids": [0, 1, 1, 0]},
        {"segment_ids": [1, 1, 2, 0]},
        {"input_ids": [5, 6, 7, 9]},  # padding
        {"loss_mask": [0, 1, 1, 1], "num_loss_tokens": 3},
        {"token_type_ids": [1, 1, 3, 1]},
        {"position_ids": [0, 1, 2, 3]},
        {"segment_ids": [1, 1, 1, 1]},
        {"seq_lengths": [2]},
        {"seq_lengths": [0, 3], "example_ids": ["d:1", "d:1"], "example_offsets": [0, 0]},
        # the same, its segment ids those of the second segment: the hashes agree, the empty segment does not
        {"seq_lengths": [0, 3], "example_ids": ["d:1", "d:1"], "example_offsets": [0, 0], "segment_ids": [2, 2, 2, 0]},
        {"example_offsets": [1]},
        {"example_ids": ["d:9"]},
        {"num_loss_tokens": 1},
        {"input_ids": [], "loss_mask": [], "position_ids": [], "segment_ids": [], "token_type_ids": []},
    ],
    ids=[
        "id_in_a_segment",
        "two_ids_swapped",
        "mask_in_a_segment",
        "segment_start_trained",
        "type_in_a_segment",
        "position_in_a_segment",
        "segment_id_in_a_segment",
        "padding_id",
        "padding_trained",
        "padding_type",
        "padding_position",
        "padding_in_a_segment",
        "seq_lengths_short",
        "empty_segment",
        "empty_segment_numbered_past",
        "offset_past_gold",
        "unknown_example",
        "num_loss_tokens",
        "empty_lists",
    ],
)
def test_any_row_the_screen_does_not_pass_sends_every_gate_to_the_exact_pass(tmp_path: Path, corrupt: dict):
    g = write_gold(tmp_path / "g", [GOOD])
    files = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row(), shard_row(**corrupt)])]
    rows = inv.screened_rows(files, g, 0, 4, 0, ALL_ROW_PARTS)
    assert rows.equals(inv.shard_rows(files, ALL_ROW_PARTS, 4, 0))  # no SCREENED column: the exact rows
    together = _judged_from(files, g, rows)
    assert together == _judged_alone(files, g) and not all(o.passed for o in together)


def test_a_screen_without_readable_gold_leaves_the_row_gates_their_exact_pass(tmp_path: Path):
    files = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])]
    rows = inv.screened_rows(files, tmp_path / "no_gold", 0, 4, 0, ALL_ROW_PARTS)
    assert rows.equals(inv.shard_rows(files, ALL_ROW_PARTS, 4, 0))
    assert inv.shards_positions_restart(files, rows).passed and inv.shards_padding_masked(files, 0, rows).passed


def _write_typed(path: Path, rows: list[dict], **types: pa.DataType) -> Path:
    """Shard rows under SHARD_SCHEMA, the named columns made nullable lists of `types`' values."""
    schema = SHARD_SCHEMA
    for name, kind in types.items():
        schema = schema.set(schema.get_field_index(name), pa.field(name, pa.list_(kind)))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.mark.parametrize(
    "over",
    [{"position_ids": [0, 1, 2, 0.4]}, {"loss_mask": [0, 0.6, 1, 0.4]}],
    ids=["positions_as_floats", "mask_as_floats_summing_right"],
)
def test_token_lists_held_as_floats_fail_fixed_length_and_never_pass_the_screen(tmp_path: Path, over: dict):
    """A cast to an integer would round 0.4 to 0: the screen, which hashes integers, is not used on such a file,
    and fixed_length names the column."""
    g = write_gold(tmp_path / "g", [GOOD])
    (name,) = over
    good = write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])
    floats = _write_typed(tmp_path / "train" / "part-00001.parquet", [shard_row(**over)], **{name: pa.float64()})
    for files in ([floats], [good, floats]):  # DuckDB reads the second with the first one's types
        rows = inv.screened_rows(files, g, 0, 4, 0, ALL_ROW_PARTS)
        assert inv.shards_gold.SCREENED not in rows.column_names
        together = _judged_from(files, g, rows)
        assert together == _judged_alone(files, g)
        assert {"file": str(floats), "column": name, "type": "list<element: double>"} in together[0].offending


@pytest.mark.parametrize(
    "over",
    [{"num_loss_tokens": None}, {"input_ids": None}, {"example_offsets": None}],
    ids=["null_num_loss_tokens", "null_input_ids", "null_example_offsets"],
)
def test_a_null_list_or_count_fails_fixed_length_and_never_passes_the_screen(tmp_path: Path, over: dict):
    g = write_gold(tmp_path / "g", [GOOD])
    schema = pa.schema([f.with_nullable(True) for f in SHARD_SCHEMA])  # as another writer might leave it
    f = tmp_path / "train" / "part-00000.parquet"
    f.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([shard_row(), shard_row(**over)], schema=schema), f)
    rows = inv.screened_rows([f], g, 0, 4, 0, ALL_ROW_PARTS)
    assert inv.shards_gold.SCREENED not in rows.column_names
    fixed = inv.shards_fixed_length([f], 4, rows)
    assert fixed == inv.shards_fixed_length([f], 4) and [r["row"] for r in fixed.offending] == [1]


def test_a_file_lacking_a_column_is_named_by_fixed_length_not_raised(tmp_path: Path):
    good = write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])
    lacking = tmp_path / "train" / "part-00001.parquet"
    pq.write_table(pa.Table.from_pylist([shard_row()], schema=SHARD_SCHEMA).drop_columns(["example_offsets"]), lacking)
    assert inv.shard_schema_problems([good, lacking]) and not inv.shard_schema_problems([good])
    for files in ([lacking], [good, lacking]):
        out = inv.shards_fixed_length(files, 4)
        assert out.offending[0] == {"file": str(lacking), "column": "example_offsets", "type": "missing"}
        assert out.violations == 1 and out.facts["rows"] == len(files) - 1


def test_nulls_in_padding_fail_padding_masked_judged_alone_or_together(tmp_path: Path):
    g = write_gold(tmp_path / "g", [GOOD])
    rows = [shard_row(), shard_row(input_ids=[5, 6, 7, None]), shard_row(token_type_ids=[1, 1, 3, None])]
    types = {"input_ids": pa.int32(), "token_type_ids": pa.uint8()}
    files = [_write_typed(tmp_path / "train" / "part-00000.parquet", rows, **types)]
    screened = inv.screened_rows(files, g, 0, 4, 0, ALL_ROW_PARTS)
    assert inv.shards_gold.SCREENED not in screened.column_names
    together = _judged_from(files, g, screened)
    assert together == _judged_alone(files, g)
    assert [(r["row"], r["token"]) for r in together[3].offending] == [(1, 4), (2, 4)]


def test_match_gold_names_a_row_whose_example_gold_holds_twice(tmp_path: Path):
    """Both copies of d:1 sum into the row's gold side; no listed segment differs from either, so the row is
    named as a violation of its own (the sample of bad segments to locate is empty)."""
    g = write_gold(tmp_path / "g", [GOOD])
    twice = pq.read_table(g / "examples.parquet")
    pq.write_table(pa.concat_tables([twice, twice]), g / "examples.parquet")
    files = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])]
    out = inv.shards_match_gold(files, g)
    assert out.violations == 1 and [(r["row"], r["token"]) for r in out.offending] == [(0, None)]
    assert inv.shards_gold.SCREENED not in inv.screened_rows(files, g, 0, 4, 0, ALL_ROW_PARTS).column_names


def test_shard_rows_refuses_unknown_parts_and_fixed_without_a_length(tmp_path: Path):
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [shard_row()])]
    with pytest.raises(ValueError, match="parts"):
        inv.shard_rows(f, ["fixed"])
    with pytest.raises(ValueError, match="parts"):
        inv.shard_rows(f, ["checksums"])


def test_gold_reject_rate_fails_over_the_threshold_with_reasons_counts_and_examples(tmp_path: Path):
    rejects = [("chat_template_dropped_message", line) for line in (9, 2, 4, 7, 5)] + [("empty_after_template", 3)]
    s, g = write_silver_and_gold_rejects(tmp_path, 10, rejects)
    out = inv.gold_reject_rate(g, s, 0.5)
    assert out.violations == 1 and not out.passed
    assert out.facts == {
        "gold_reject_rate": 0.6,
        "max_gold_reject_rate": 0.5,
        "records_entering_gold": 10,
        "rejects": 6,
        "rejects_by_reason": {"chat_template_dropped_message": 5, "empty_after_template": 1},
    }
    # most frequent reason first, a few examples of each (earliest lines), with id, file:line and detail
    assert [(r["reason"], r["reason_rejects"], r["record_id"], r["location"], r["detail"]) for r in out.offending] == [
        ("chat_template_dropped_message", 5, "d:2", "f.jsonl:2", "why 2"),
        ("chat_template_dropped_message", 5, "d:4", "f.jsonl:4", "why 4"),
        ("chat_template_dropped_message", 5, "d:5", "f.jsonl:5", "why 5"),
        ("empty_after_template", 1, "d:3", "f.jsonl:3", "why 3"),
    ]
    assert inv.gold_reject_rate(g, s, 0.6).passed  # the threshold itself passes


def test_gold_reject_rate_passes_without_rejects_and_on_an_empty_drop(tmp_path: Path):
    s, g = write_silver_and_gold_rejects(tmp_path / "a", 4, [])
    out = inv.gold_reject_rate(g, s, 0.0)
    assert out.passed and out.offending == [] and out.facts["gold_reject_rate"] == 0.0
    s, g = write_silver_and_gold_rejects(tmp_path / "b", 0, [])
    assert inv.gold_reject_rate(g, s, 0.05).passed


# `full` at 4 with prompt-only rows left out: d:1 is a prompt of 6 and a completion of 2 (8 tokens, rows of 4)
_PROMPT_THEN_COMPLETION = {
    "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
    "loss_mask": [0, 0, 0, 0, 0, 0, 1, 1],
    "token_type_ids": [0, 0, 0, 0, 0, 0, 1, 3],
}


def _full_row(ids: list[int], types: list[int], offset: int) -> dict:
    n = len(ids)
    return shard_row(
        input_ids=ids,
        loss_mask=[0] + [int(t != 0) for t in types[1:]],
        position_ids=list(range(n)),
        segment_ids=[1] * n,
        token_type_ids=types,
        seq_lengths=[n],
        example_offsets=[offset],
        num_loss_tokens=sum(int(t != 0) for t in types[1:]),
    )


@pytest.mark.parametrize(
    ("kept_offsets", "passes"),
    [
        ([4], True),  # row 0 (prompt only) left out: 4 tokens dropped, none of them a completion token
        ([0], False),  # the row holding the completion left out instead: a trained gap
        ([0, 4], True),  # both kept: nothing dropped
    ],
    ids=["prompt_only_row_dropped", "completion_row_dropped", "nothing_dropped"],
)
def test_full_with_prompt_only_rows_dropped_accepts_only_untrained_gaps(
    tmp_path: Path, kept_offsets: list[int], passes: bool
):
    g = write_gold(tmp_path / "g", [_PROMPT_THEN_COMPLETION])
    rows = {0: _full_row([1, 2, 3, 4], [0, 0, 0, 0], 0), 4: _full_row([5, 6, 7, 8], [0, 0, 1, 3], 4)}
    f = [write_shard(tmp_path / "train" / "part-00000.parquet", [rows[o] for o in kept_offsets])]
    dropped = 8 - 4 * len(kept_offsets)
    reported = {"train": {"tokens_dropped_by_packing": dropped, "overlap_tokens": 0}}
    out = inv.shards_tokens_conserved(f, g, inv.Layout(4, "full", drops_prompt_only_rows=True), reported)
    assert out.passed is passes, out
    assert out.facts["train"]["tokens_dropped_by_packing"] == dropped
    if not passes:
        assert out.offending[0]["example_id"] == "d:1" and out.offending[0]["gaps"] == 1
    # without the rule, a dropped row is a gap in the example, whatever it held
    assert inv.shards_tokens_conserved(f, g, inv.Layout(4, "full")).passed is (dropped == 0)
