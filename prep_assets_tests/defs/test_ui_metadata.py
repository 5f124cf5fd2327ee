"""What the UI shows of a drop's layers: decoded previews with masked spans marked and readable tables."""

from pathlib import Path

from prep_assets.core.decode import MASK_CLOSE, MASK_OPEN, render_examples
from prep_assets.core.progress import reporting
from prep_assets.core.shards import COUNTS, METRIC_DEFINITIONS, SPLIT_TABLES, UTILIZATIONS, metrics_markdown
from prep_assets.defs.metadata import code_block
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.defs.helpers import materialize_drops, metadata


def _longest_line(markdown: str) -> int:
    return max(len(line) for line in markdown.splitlines())


def test_gold_and_shards_show_decoded_text_with_masked_spans_and_tables_that_fit(tmp_path: Path, instance):
    data = copy_sample_data(tmp_path / "data")
    lines: list[str] = []
    with reporting(lines.append, every_s=0):  # every batch reports: the CLI's plain lines and the run's log
        ((key, result),) = materialize_drops(data, "sample_instruct", instance).items()
    assert result.success
    for label in ("bronze", "silver", "gold", "shards"):
        assert any(line.startswith(f"{label} {key}: ") and "rows/s" in line for line in lines), label
    logged = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any(m.startswith(f"gold {key}: tokenizing: ") and "left" in m for m in logged)
    gold = metadata(result, "sample_instruct", "tokenized_examples")
    examples = gold["decoded_examples"]
    assert examples.count("--- ") >= 3 and MASK_OPEN in examples and MASK_CLOSE in examples
    assert _longest_line(examples) <= 120
    shards = metadata(result, "sample_instruct", "packed_shards")
    row = shards["decoded_row"]
    assert MASK_OPEN in row and _longest_line(row) <= 120
    assert "splits" not in shards and "`max_batch_size` | rows in the smallest" in shards["metrics"]
    for name in SPLIT_TABLES:
        header = shards[name].splitlines()[0]
        assert header.startswith("| split |") and header.count("|") - 1 <= 8


def test_a_long_example_is_cut_with_a_note_and_its_lines_wrapped_not_cut():
    spans = [{"trained": False, "tokens": 3, "text": "Q: " * 10}, {"trained": True, "tokens": 900, "text": "a" * 900}]
    text = render_examples(
        [{"example_id": "x:1", "split": "train", "num_tokens": 903, "num_loss_tokens": 900, "spans": spans}],
        max_chars=500,
    )
    assert f"{MASK_OPEN}{'Q: ' * 10}{MASK_CLOSE}a" in text and "more characters" in text
    block = code_block(text).value
    assert _longest_line(block) <= 120 and block.replace("\n", "").count("a") == text.replace("\n", "").count("a")


def test_every_shard_metric_is_in_one_narrow_table_and_defined_once_for_the_ui_and_the_docs():
    tables = [c for columns in SPLIT_TABLES.values() for c in columns]
    assert sorted(tables) == sorted({*COUNTS, *UTILIZATIONS, "max_batch_size"}) == sorted(METRIC_DEFINITIONS)
    assert all(len(columns) + 1 <= 8 for columns in SPLIT_TABLES.values())  # with the split column
    docs = (Path(__file__).parents[2] / "docs" / "shards.md").read_text(encoding="utf-8")
    assert metrics_markdown() in docs


def test_a_long_examples_preview_decodes_only_its_first_tokens_and_says_how_many_are_left(tmp_path: Path, gpt2_dir):
    # a 6 MB document's 1.4M ids, decoded whole for 2,000 characters, took 240 MiB: only the first tokens are read
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prep_assets.core.decode import DECODE_TOKENS, decode_examples
    from prep_assets.core.spec_sections import TokenizerSpec
    from prep_assets.core.tokenizer import pin_tokenizer

    pinned = tmp_path / "tokenizer"
    pinned.mkdir()
    pin_tokenizer(TokenizerSpec(path=str(gpt2_dir)), base=tmp_path, dest=pinned)
    n = DECODE_TOKENS * 3 + 5
    ids = [318, 257] * (n // 2) + [318]  # " is a is a ..."
    mask = [0] * 10 + [1] * (n - 10)
    pq.write_table(
        pa.table(
            {
                "example_id": ["long", "short"],
                "split": ["train", "train"],
                "token_ids": pa.array([ids, [318, 257]], pa.list_(pa.int32())),
                "loss_mask": pa.array([mask, [0, 1]], pa.list_(pa.uint8())),
                "num_tokens": pa.array([n, 2], pa.int32()),
                "num_loss_tokens": pa.array([n - 10, 1], pa.int32()),
            }
        ),
        tmp_path / "examples.parquet",
    )
    long, short = decode_examples(tmp_path / "examples.parquet", pinned)
    assert long["decoded_tokens"] == sum(s["tokens"] for s in long["spans"]) == DECODE_TOKENS
    assert [s["tokens"] for s in long["spans"]] == [10, DECODE_TOKENS - 10] and long["num_tokens"] == n
    assert short["decoded_tokens"] == 2 and [s["text"] for s in short["spans"]] == [" is", " a"]
    text = render_examples([long, short], max_chars=10**9)
    assert f"… ({n - DECODE_TOKENS} more tokens)" in text and text.count("more tokens") == 1
    assert f"more characters and {n - DECODE_TOKENS} more tokens)" in render_examples([long], max_chars=100)


def test_a_preview_cuts_long_text_in_arrow_to_the_same_cells_as_whole_text(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prep_assets.defs.metadata import CELL, md_table, preview

    texts = ["x|" * 60, "é" * (CELL + 1), "😀|\n" * 40 + "tail", "a" * CELL, "b" * 3_000_000, "c|" * 59 + "d"]
    rows = [{"record_id": f"r{i}", "content": t} for i, t in enumerate(texts)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "records.parquet")
    assert preview(tmp_path / "records.parquet", ["record_id", "content"], n=len(texts)) == md_table(rows)
    assert all(len(line) < 400 for line in md_table(rows).value.splitlines())
