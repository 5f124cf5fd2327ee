"""The shard gates' screen (`invariants.screen`): it vouches for shards that hold exactly what gold and their
layout say, and for nothing else: any single change to a shard row or to gold makes it answer None, which sends
the gates to their exact passes."""

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import invariants as inv
from prep_assets.core.invariants import screen as scr
from prep_assets_tests.core.lakes import write_gold, write_shard

L = 8
PARTS = ["fixed", "layout", "checksum", "padding"]
# d:1 (5 tokens), d:2 (3), d:3 (7): row 0 holds d:1 then d:2 (full), row 1 holds d:3 and one padding token
GOLD = [
    {"token_ids": [11, 12, 13, 14, 15], "loss_mask": [0, 0, 1, 1, 1], "token_type_ids": [0, 0, 1, 1, 3]},
    {"token_ids": [21, 22, 23], "loss_mask": [0, 1, 1], "token_type_ids": [0, 1, 3]},
    {"token_ids": [31, 32, 33, 34, 35, 36, 37], "loss_mask": [0, 1, 1, 1, 1, 1, 1], "token_type_ids": [0] + [1] * 6},
]
ROWS = [
    {
        "input_ids": [11, 12, 13, 14, 15, 21, 22, 23],
        "loss_mask": [0, 0, 1, 1, 1, 0, 1, 1],
        "position_ids": [0, 1, 2, 3, 4, 0, 1, 2],
        "segment_ids": [1, 1, 1, 1, 1, 2, 2, 2],
        "token_type_ids": [0, 0, 1, 1, 3, 0, 1, 3],
        "seq_lengths": [5, 3],
        "example_ids": ["d:1", "d:2"],
        "example_offsets": [0, 0],
        "num_loss_tokens": 5,
    },
    {
        "input_ids": [31, 32, 33, 34, 35, 36, 37, 0],
        "loss_mask": [0, 1, 1, 1, 1, 1, 1, 0],
        "position_ids": [0, 1, 2, 3, 4, 5, 6, 0],
        "segment_ids": [1, 1, 1, 1, 1, 1, 1, 0],
        "token_type_ids": [0, 1, 1, 1, 1, 1, 1, 2],
        "seq_lengths": [7],
        "example_ids": ["d:3"],
        "example_offsets": [0],
        "num_loss_tokens": 6,
    },
]


def _lake(tmp_path: Path, rows: list[dict] = ROWS, gold: list[dict] = GOLD) -> tuple[list[Path], Path]:
    shard = write_shard(tmp_path / "shards" / "train" / "part-00000.parquet", rows)
    return [shard], write_gold(tmp_path / "gold", gold)


def _set(row: int, column: str, at: int, value: object, loss: int = 0) -> Callable[[list[dict]], None]:
    def change(rows: list[dict]) -> None:
        rows[row][column][at] = value
        rows[row]["num_loss_tokens"] += loss  # kept equal to the mask, so only the screen's sums can tell

    return change


def _swap(row: int, a: int, b: int) -> Callable[[list[dict]], None]:
    def change(rows: list[dict]) -> None:
        ids = rows[row]["input_ids"]
        ids[a], ids[b] = ids[b], ids[a]

    return change


def _replace(row: int, **columns: object) -> Callable[[list[dict]], None]:
    def change(rows: list[dict]) -> None:
        rows[row].update(columns)

    return change


CHANGES = {
    "a_token_id": _set(0, "input_ids", 2, 99),
    "two_ids_swapped_in_a_segment": _swap(0, 1, 3),
    "two_ids_swapped_across_segments": _swap(0, 4, 5),
    "a_trained_token_masked": _set(1, "loss_mask", 3, 0, loss=-1),
    "a_segments_first_token_trained": _set(0, "loss_mask", 5, 1, loss=1),
    "a_token_type": _set(0, "token_type_ids", 2, 3),
    "a_position_id": _set(1, "position_ids", 4, 5),
    "a_negative_position_id": _set(1, "position_ids", 4, -1),
    "a_segment_id": _set(0, "segment_ids", 5, 1),
    "a_padding_id": _set(1, "input_ids", 7, 1),
    "a_padding_type": _set(1, "token_type_ids", 7, 1),
    "a_padding_position": _set(1, "position_ids", 7, 7),
    "a_padding_segment": _set(1, "segment_ids", 7, 1),
    "num_loss_tokens_off_by_one": _replace(1, num_loss_tokens=7),
    "an_example_offset_shifted": _replace(1, example_offsets=[1]),
    "an_example_gold_lacks": _replace(1, example_ids=["d:9"]),
    "the_segments_named_in_the_other_order": _replace(0, example_ids=["d:2", "d:1"]),
    "seq_lengths_that_disagree_with_the_layout": _replace(0, seq_lengths=[4, 4]),
    "seq_lengths_past_the_row": _replace(1, seq_lengths=[9]),
    "a_segment_of_no_token": _replace(1, seq_lengths=[7, 0], example_ids=["d:3", "d:3"], example_offsets=[0, 7]),
    "a_short_row": _replace(1, **{k: ROWS[1][k][:7] for k in ("input_ids", "loss_mask", "position_ids")}),
    "a_null_token": _set(0, "input_ids", 0, None),
    # a row of padding only: `positions_restart` fails it, so the screen must not vouch for it
    "a_row_of_padding_only": _replace(
        1,
        input_ids=[0] * L,
        loss_mask=[0] * L,
        position_ids=[0] * L,
        segment_ids=[0] * L,
        token_type_ids=[2] * L,
        seq_lengths=[],
        example_ids=[],
        example_offsets=[],
        num_loss_tokens=0,
    ),
}


def test_the_screen_vouches_for_shards_that_hold_what_gold_says(tmp_path: Path):
    files, gold = _lake(tmp_path)
    out = scr.screen(files, gold / "examples.parquet", 0, L, 0)
    assert out is not None
    assert out.column("length").to_pylist() == [L, L]
    assert out.column("row").to_pylist() == [0, 1]
    assert out.column("file").to_pylist() == [str(files[0])] * 2
    screened = inv.screened_rows(files, gold, 0, L, 0, PARTS)
    assert inv.shards_gold.SCREENED in screened.column_names
    assert screened.select(["file", "row", "length"]).equals(
        inv.shard_rows(files, PARTS, L, 0).select(["file", "row", "length"])
    )


@pytest.mark.parametrize("change", list(CHANGES.values()), ids=list(CHANGES))
def test_the_screen_answers_none_for_any_change_to_a_shard_row(tmp_path: Path, change):
    rows = copy.deepcopy(ROWS)
    change(rows)
    files, gold = _lake(tmp_path, rows)
    assert scr.screen(files, gold / "examples.parquet", 0, L, 0) is None
    # and the gates get the exact pass of every row
    assert inv.shards_gold.SCREENED not in inv.screened_rows(files, gold, 0, L, 0, PARTS).column_names


def test_the_screen_answers_none_for_another_pad_id_or_overlap(tmp_path: Path):
    files, gold = _lake(tmp_path)
    assert scr.screen(files, gold / "examples.parquet", 0, L, 1) is None
    assert (
        scr.screen(files, gold / "examples.parquet", 2, L, 0) is not None
    )  # no segment starts past its example's first token
    assert scr.screen(files, gold / "examples.parquet", 0, L + 1, 0) is None  # rows shorter than max_seq_len


@pytest.mark.parametrize(
    "gold_change",
    ["a_gold_token", "a_gold_mask", "a_duplicate_example_id", "a_shorter_example"],
)
def test_the_screen_answers_none_for_any_change_to_gold(tmp_path: Path, gold_change):
    gold_rows = copy.deepcopy(GOLD)
    if gold_change == "a_gold_token":
        gold_rows[2]["token_ids"][6] = 38
    elif gold_change == "a_gold_mask":
        gold_rows[0]["loss_mask"][1] = 1
    elif gold_change == "a_shorter_example":
        gold_rows[2] = {k: v[:6] for k, v in gold_rows[2].items()}
    files, gold = _lake(tmp_path, gold=gold_rows)
    if gold_change == "a_duplicate_example_id":
        table = pq.read_table(gold / "examples.parquet")
        pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), gold / "examples.parquet")
    assert scr.screen(files, gold / "examples.parquet", 0, L, 0) is None


GOLD_CHANGES = {
    "num_tokens_null": lambda t: t.set_column(
        t.schema.get_field_index("num_tokens"), "num_tokens", pa.array([5, None, 7], pa.int32())
    ),
    "num_tokens_unlike_the_lists": lambda t: t.set_column(
        t.schema.get_field_index("num_tokens"), "num_tokens", pa.array([5, 3, 6], pa.int32())
    ),
    "num_tokens_as_int64": lambda t: t.set_column(
        t.schema.get_field_index("num_tokens"), "num_tokens", t.column("num_tokens").cast(pa.int64())
    ),
    "no_num_tokens": lambda t: t.drop_columns(["num_tokens"]),
    "no_example_id": lambda t: t.drop_columns(["example_id"]),
    "unchanged": lambda t: t,
}


@pytest.mark.parametrize("change", list(GOLD_CHANGES), ids=list(GOLD_CHANGES))
def test_the_screen_answers_none_for_gold_columns_it_does_not_expect(tmp_path: Path, change):
    files, gold = _lake(tmp_path)
    table = GOLD_CHANGES[change](pq.read_table(gold / "examples.parquet"))
    pq.write_table(table, gold / "examples.parquet")
    assert (scr.screen(files, gold / "examples.parquet", 0, L, 0) is None) == (change != "unchanged")


@pytest.mark.parametrize("column", ["example_ids", "num_loss_tokens", "seq_lengths"])
def test_the_screen_answers_none_for_a_shard_file_lacking_a_column(tmp_path: Path, column):
    files, gold = _lake(tmp_path)
    pq.write_table(pq.read_table(files[0]).drop_columns([column]), files[0])
    assert scr.screen(files, gold / "examples.parquet", 0, L, 0) is None


def test_one_long_example_sizes_the_batches_of_its_own_row_group_only(tmp_path: Path):
    """Gold's batches are sized per row group by its longest example: one long document does not make every
    batch of a drop one example long."""
    rows = [{"token_ids": [1] * 10, "loss_mask": [1] * 10, "token_type_ids": [1] * 10} for _ in range(6)]
    rows[1] = {"token_ids": [1] * 5000, "loss_mask": [1] * 5000, "token_type_ids": [1] * 5000}
    gold = write_gold(tmp_path / "gold", rows)
    table = pq.read_table(gold / "examples.parquet")
    pq.write_table(table, gold / "examples.parquet", row_group_size=2)
    examples = scr._Gold.read(gold / "examples.parquet")
    assert [examples.longest(g) for g in range(3)] == [5000, 10, 10]
    assert scr._batch_rows(10) > scr._batch_rows(5000)


def test_a_window_after_the_first_has_its_overlap_masked(tmp_path: Path):
    """d:3 in two windows of 5 with an overlap of 2: the second window's first two tokens are masked."""
    windows = []
    for off, n in ((0, 5), (3, 4)):
        masked = 1 if off == 0 else 2
        windows.append(
            {
                "input_ids": GOLD[2]["token_ids"][off : off + n] + [0] * (5 - n),
                "loss_mask": [0] * masked + GOLD[2]["loss_mask"][off + masked : off + n] + [0] * (5 - n),
                "position_ids": list(range(n)) + [0] * (5 - n),
                "segment_ids": [1] * n + [0] * (5 - n),
                "token_type_ids": GOLD[2]["token_type_ids"][off : off + n] + [2] * (5 - n),
                "seq_lengths": [n],
                "example_ids": ["d:3"],
                "example_offsets": [off],
                "num_loss_tokens": n - masked,
            }
        )
    files, gold = _lake(tmp_path, windows)
    assert scr.screen(files, gold / "examples.parquet", 2, 5, 0) is not None
    assert (
        scr.screen(files, gold / "examples.parquet", 1, 5, 0) is None
    )  # an overlap of 1 would train its second token


def test_token_hashes_differ_for_each_field_of_a_token():
    base = {"ids": 7, "mask": 1, "types": 1, "place": 3, "pos": 2, "seg": 1}
    dtypes = {
        "ids": np.int32,
        "mask": np.uint8,
        "types": np.uint8,
        "place": np.uint64,
        "pos": np.int64,
        "seg": np.int64,
    }

    def h(**over: int) -> int:
        fields = {k: np.array([over.get(k, v)], dtype=dtypes[k]) for k, v in base.items()}
        return int(scr.token_hashes(**fields)[0])

    hashes = {h(), *(h(**{k: v + 1}) for k, v in base.items())}
    assert len(hashes) == 1 + len(base)
