"""How ParquetSink writes: token columns plain, everything else as Arrow would."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core.parquet_io import ColumnBuffer, ParquetSink, token_columns
from prep_assets.core.records import SHARD_SCHEMA
from prep_assets_tests.core.lakes import shard_row

ROW = shard_row()  # a row of 4: three tokens of one example and one padding token


def test_integer_list_columns_skip_dictionary_and_statistics_other_columns_keep_them(tmp_path: Path):
    path = tmp_path / "part.parquet"
    with ParquetSink(path, SHARD_SCHEMA) as sink:
        sink.write(pa.Table.from_pylist([ROW] * 10, schema=SHARD_SCHEMA))
    group = pq.ParquetFile(path).metadata.row_group(0)
    columns = {group.column(i).path_in_schema.split(".")[0]: group.column(i) for i in range(group.num_columns)}
    plain = token_columns(SHARD_SCHEMA)
    assert plain == {
        "input_ids",
        "loss_mask",
        "position_ids",
        "segment_ids",
        "token_type_ids",
        "seq_lengths",
        "example_offsets",
    }
    for name, col in columns.items():
        dictionary = any("DICTIONARY" in e for e in col.encodings)
        assert (dictionary, col.is_stats_set) == ((False, False) if name in plain else (True, True)), name
    assert pq.read_table(path).to_pylist() == [ROW] * 10


def test_background_writes_keep_row_order_and_fixed_row_groups_across_uneven_batches(tmp_path: Path):
    schema = pa.schema([("i", pa.int64()), ("s", pa.string())])
    path = tmp_path / "rows.parquet"
    sizes = [1, 7, 300, 2, 1000, 13, 500, 177]  # 2,000 rows in batches that straddle the row groups
    with ParquetSink(path, schema, row_group_size=256) as sink:
        start = 0
        for n in sizes:
            sink.write(pa.table({"i": list(range(start, start + n)), "s": [f"r{k}" for k in range(start, start + n)]}))
            start += n
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [256] * 7 + [208]
    assert pq.read_table(path).column("i").to_pylist() == list(range(2000))


def test_a_failing_row_group_stops_the_writing_raises_and_leaves_no_file(tmp_path: Path):
    """The disk filling up under the writer thread: no row group is written after the failed one, its error reaches
    the caller (at a later write or at close), and no file that would read as complete without them is left."""
    schema = pa.schema([("i", pa.int64())])
    path = tmp_path / "x.parquet"
    calls = []

    def fail(table: pa.Table, row_group_size: int) -> None:
        calls.append(table.num_rows)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        with ParquetSink(path, schema, row_group_size=4) as sink:
            sink._writer.write_table = fail  # type: ignore[method-assign]
            for k in range(10):
                sink.write(pa.table({"i": list(range(4 * k, 4 * k + 4))}))
    assert calls == [4]
    assert sink._writer.is_open is False and not path.exists()


def test_column_buffer_writes_constants_and_refuses_a_row_of_the_wrong_width(tmp_path: Path):
    schema = pa.schema([("drop", pa.string()), ("line", pa.int64()), ("text", pa.string())])
    with ParquetSink(tmp_path / "rows.parquet", schema) as sink:
        rows = ColumnBuffer(sink, 2, {"drop": "d1"})
        rows.add(1, "a")
        rows.add(2, "b")  # a full batch: flushed
        rows.add(3, "c")
        with pytest.raises(ValueError, match="1 values for the 2 columns"):
            rows.add(4)
        rows.flush()
    assert pq.read_table(tmp_path / "rows.parquet").to_pylist() == [
        {"drop": "d1", "line": n, "text": t} for n, t in ((1, "a"), (2, "b"), (3, "c"))
    ]
