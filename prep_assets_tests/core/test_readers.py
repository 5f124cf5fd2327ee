import gzip
import json
from pathlib import Path

from prep_assets.core.readers import Accounting, RawItem, RawReject, read_drop


def _read(path: Path, fmt: str, max_line_bytes: int = 1 << 20):
    acct = Accounting()
    items = list(read_drop(path, fmt, max_line_bytes=max_line_bytes, acct=acct))
    return [i for i in items if isinstance(i, RawItem)], [i for i in items if isinstance(i, RawReject)], acct


def test_jsonl_malformed_lines_rejected_with_line_and_byte_offset(tmp_path: Path):
    lines = [b'{"text": "a"}\n', b'{"text": "b"\n', b"\n", b'{"text": "c"}\n']
    (tmp_path / "d.jsonl").write_bytes(b"".join(lines))
    items, rejects, acct = _read(tmp_path / "d.jsonl", "jsonl")
    assert [i.value["text"] for i in items] == ["a", "c"]
    assert [(i.line, i.byte_offset) for i in items] == [(1, 0), (4, len(b"".join(lines[:3])))]
    assert [(r.line, r.byte_offset, r.reason) for r in rejects] == [(2, len(lines[0]), "malformed_json")]
    assert acct.lines_in == 4 and acct.blank_lines == 1
    assert acct.lines_in == len(items) + len(rejects) + acct.blank_lines


def test_bom_stripped_on_first_line_only_and_crlf_accepted(tmp_path: Path):
    (tmp_path / "d.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n\xef\xbb\xbf{"text": "b"}\r\n')
    items, rejects, _ = _read(tmp_path / "d.jsonl", "jsonl")
    assert [i.value["text"] for i in items] == ["a"]
    assert rejects[0].line == 2 and rejects[0].reason == "malformed_json"


def test_unicode_line_separators_inside_strings_do_not_split_records(tmp_path: Path):
    text = "one\u2028two\u2029three\x85four\rfive"
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    items, rejects, acct = _read(tmp_path / "d.jsonl", "jsonl")
    assert len(items) == 1 and not rejects and items[0].value["text"] == text and acct.lines_in == 1


def test_nan_and_infinity_literals_rejected(tmp_path: Path):
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "a", "x": NaN}\n{"text": "b", "x": -Infinity}\n')
    items, rejects, _ = _read(tmp_path / "d.jsonl", "jsonl")
    assert not items and [r.reason for r in rejects] == ["invalid_json_constant"] * 2


def test_invalid_utf8_rejected_not_replaced(tmp_path: Path):
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "caf\xe9"}\n{"text": "ok"}\n')
    items, rejects, _ = _read(tmp_path / "d.jsonl", "jsonl")
    assert [i.value["text"] for i in items] == ["ok"]
    assert rejects[0].reason == "invalid_utf8" and rejects[0].line == 1


def test_line_longer_than_limit_rejected_in_bounded_chunks(tmp_path: Path):
    big = b'{"text": "' + b"x" * 5000 + b'"}\n'
    (tmp_path / "d.jsonl").write_bytes(big + b'{"text": "after"}\n')
    items, rejects, acct = _read(tmp_path / "d.jsonl", "jsonl", max_line_bytes=1024)
    assert rejects[0].reason == "line_too_long" and rejects[0].line == 1
    assert items[0].value["text"] == "after" and items[0].line == 2 and items[0].byte_offset == len(big)
    assert acct.lines_in == 2


def test_txt_one_record_per_line_blank_lines_counted(tmp_path: Path):
    (tmp_path / "d.txt").write_bytes(b"first line\n\n  \nsecond\r\nno newline at end")
    items, rejects, acct = _read(tmp_path / "d.txt", "txt")
    assert [i.value for i in items] == ["first line", "second", "no newline at end"]
    assert acct.blank_lines == 2 and acct.lines_in == 5 and not rejects


def test_jsonl_gz_and_truncated_gz(tmp_path: Path):
    payload = b"".join(json.dumps({"text": f"row {i}"}).encode() + b"\n" for i in range(2000))
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(payload))
    items, rejects, _ = _read(tmp_path / "d.jsonl.gz", "jsonl.gz")
    assert len(items) == 2000 and not rejects
    data = gzip.compress(payload)
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    items, rejects, acct = _read(tmp_path / "t.jsonl.gz", "jsonl.gz")
    assert rejects and rejects[-1].reason == "truncated_gzip"
    assert acct.lines_in == len(items) + len(rejects) + acct.blank_lines


def test_json_array_elements_keep_their_line_and_byte_offset(tmp_path: Path):
    raw = '[\n  {"text": "a"},\n  {"text": "é"}, {"text": "c"}\n]\n'
    (tmp_path / "d.json").write_text(raw, encoding="utf-8")
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert [(i.value["text"], i.line) for i in items] == [("a", 2), ("é", 3), ("c", 3)]
    data = raw.encode()
    for item in items:
        assert data[item.byte_offset :].startswith(item.text.encode())
    assert acct.unit == "element" and not rejects


def test_json_not_an_array_and_empty_file(tmp_path: Path):
    (tmp_path / "o.json").write_text('{"text": "a"}', encoding="utf-8")
    (tmp_path / "e.json").write_text("", encoding="utf-8")
    assert _read(tmp_path / "o.json", "json")[1][0].reason == "not_a_json_array"
    items, rejects, acct = _read(tmp_path / "e.json", "json")
    assert not items and not rejects and acct.lines_in == 0


def test_json_array_broken_midway_keeps_parsed_elements(tmp_path: Path):
    (tmp_path / "d.json").write_text('[{"text": "a"}, {"text": }]', encoding="utf-8")
    items, rejects, _ = _read(tmp_path / "d.json", "json")
    assert [i.value["text"] for i in items] == ["a"] and rejects[0].reason == "malformed_json"


def test_json_second_array_after_the_first_is_a_reject_not_lost(tmp_path: Path):
    (tmp_path / "d.json").write_text('[{"text": "aaaa"}]\n[{"text": "cccc"}]\n', encoding="utf-8")
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert len(items) == 1 and [(r.reason, r.line) for r in rejects] == [("trailing_content", 2)]
    assert acct.lines_in == len(items) + len(rejects)


def test_json_broken_element_counts_as_one_unit(tmp_path: Path):
    (tmp_path / "d.json").write_text('[{"text": "a"}, {"text": "b"}, oops]', encoding="utf-8")
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert len(items) == 2 and len(rejects) == 1 and acct.lines_in == 3


def test_json_unclosed_array_is_rejected(tmp_path: Path):
    (tmp_path / "d.json").write_text('[{"text": "a"}, ', encoding="utf-8")
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert len(items) == 1 and rejects[0].detail.startswith("the array is not closed")


def test_json_array_with_bom_has_true_byte_offsets(tmp_path: Path):
    raw = b'\xef\xbb\xbf[{"text": "a"},\n {"text": "b"}]'
    (tmp_path / "d.json").write_bytes(raw)
    items, _, _ = _read(tmp_path / "d.json", "json")
    assert [raw[i.byte_offset :].startswith(i.text.encode()) for i in items] == [True, True]


def test_csv_rows_keep_their_start_line_and_offset_across_quoted_newlines(tmp_path: Path):
    lines = [
        b"\xef\xbb\xbfprompt,completion\r\n",
        b'"two\n',
        b'lines",ok\r\n',
        b"\r\n",
        b"a,b,c\r\n",
        b'"cr\rinside",x\n',
        b"\xff\xfe,y\n",
        b"last,row",
    ]
    (tmp_path / "d.csv").write_bytes(b"".join(lines))
    items, rejects, acct = _read(tmp_path / "d.csv", "csv")
    off = [len(b"".join(lines[:k])) for k in range(len(lines))]
    assert [(i.line, i.byte_offset, i.value) for i in items] == [
        (2, off[1], {"prompt": "two\nlines", "completion": "ok"}),
        (6, off[5], {"prompt": "cr\rinside", "completion": "x"}),
        (8, off[7], {"prompt": "last", "completion": "row"}),
    ]
    assert [(r.line, r.byte_offset, r.reason) for r in rejects] == [
        (5, off[4], "csv_field_count"),
        (7, off[6], "invalid_utf8"),
    ]
    assert acct.unit == "row" and acct.lines_in == 6 and acct.blank_lines == 1
    assert acct.lines_in == len(items) + len(rejects) + acct.blank_lines


def test_csv_unterminated_quote_and_bad_header_are_rejects(tmp_path: Path):
    (tmp_path / "q.csv").write_bytes(b'a,b\n1,2\n"open,3\n')
    items, rejects, _ = _read(tmp_path / "q.csv", "csv")
    assert [i.value for i in items] == [{"a": "1", "b": "2"}] and rejects[0].reason == "malformed_csv"
    (tmp_path / "h.csv").write_bytes(b"a,a\n1,2\n")
    items, rejects, _ = _read(tmp_path / "h.csv", "csv")
    assert items == [] and rejects[0].reason == "csv_duplicate_header"


def test_parquet_rows_as_json_records_with_row_numbers(tmp_path: Path):
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": [1, 2, 3],
            "x": [0.5, float("nan"), None],
            "note": ["a\rb", "c", None],
            "when": [datetime.date(2026, 1, 2)] * 3,
            "tags": [["p"], [], None],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
    items, rejects, acct = _read(tmp_path / "d.parquet", "parquet")
    assert rejects == [] and acct.unit == "row" and acct.lines_in == 3
    assert [i.line for i in items] == [1, 2, 3] and items[0].byte_offset != items[2].byte_offset
    assert items[0].value == {"id": 1, "x": 0.5, "note": "a\rb", "when": "2026-01-02", "tags": ["p"]}
    assert items[1].value["x"] is None and json.loads(items[0].text) == items[0].value
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    items, rejects, acct = _read(tmp_path / "bad.parquet", "parquet")
    assert items == [] and rejects[0].reason == "unreadable_parquet" and acct.lines_in == 1


def test_csv_bare_carriage_return_rejects_that_row_and_reading_resumes(tmp_path: Path):
    (tmp_path / "r.csv").write_bytes(b'a,b\n1,x\ry\n3,4\n"5\r",6\n')
    items, rejects, acct = _read(tmp_path / "r.csv", "csv")
    assert [(i.line, i.value) for i in items] == [(3, {"a": "3", "b": "4"}), (4, {"a": "5\r", "b": "6"})]
    assert [(r.line, r.byte_offset, r.reason) for r in rejects] == [(2, 4, "malformed_csv")]
    assert acct.lines_in == 3 == len(items) + len(rejects)


def test_csv_line_over_max_line_bytes_is_one_reject_never_a_record_of_its_tail(tmp_path: Path):
    """The line's rest was read as a line of its own: an invented record, every later line number one off."""
    lines = [b"a,b,c\n", b"1,2,3\n", b"A" * 1030 + b",tail_b,tail_c\n", b"2,ok,fine\n"]
    (tmp_path / "d.csv").write_bytes(b"".join(lines))
    items, rejects, acct = _read(tmp_path / "d.csv", "csv", max_line_bytes=1024)
    off = [len(b"".join(lines[:k])) for k in range(len(lines))]
    assert [(i.line, i.byte_offset, i.value) for i in items] == [
        (2, off[1], {"a": "1", "b": "2", "c": "3"}),
        (4, off[3], {"a": "2", "b": "ok", "c": "fine"}),
    ]
    assert [(r.line, r.byte_offset, r.reason) for r in rejects] == [(3, off[2], "line_too_long")]
    assert "1045 bytes > max_line_bytes 1024" in rejects[0].detail
    assert acct.lines_in == 3 == len(items) + len(rejects)


def test_csv_line_over_max_line_bytes_inside_a_quoted_field_rejects_its_row_only(tmp_path: Path):
    # the long line opens a quoted field that the next line closes: that row is the reject, the rest parse
    lines = [b"a,b,c\n", b'"' + b"A" * 1030 + b",x\n", b'more",y,z\n', b"2,ok,fine\n"]
    (tmp_path / "d.csv").write_bytes(b"".join(lines))
    items, rejects, acct = _read(tmp_path / "d.csv", "csv", max_line_bytes=1024)
    assert [(i.line, i.value) for i in items] == [(4, {"a": "2", "b": "ok", "c": "fine"})]
    assert [(r.line, r.byte_offset, r.reason) for r in rejects] == [(2, len(lines[0]), "line_too_long")]
    assert acct.lines_in == 2


def test_csv_line_over_max_line_bytes_quotes_inside_unquoted_fields_are_characters(tmp_path: Path):
    """A quote count is no guide: `5'10"` holds a literal quote (the rows after it were lost), and a long line
    with an even count can end inside a quoted field (its continuation became a record)."""
    odd = [b"a,b\n", b"1,2\n", b"5'10\" tall," + b"x" * 3000 + b"\n", b"3,4\n", b"5,6\n"]
    (tmp_path / "odd.csv").write_bytes(b"".join(odd))
    items, rejects, _ = _read(tmp_path / "odd.csv", "csv", max_line_bytes=1024)
    assert [i.line for i in items] == [2, 4, 5] and [(r.line, r.reason) for r in rejects] == [(3, "line_too_long")]
    even = [b"a,b,c\n", b'12" pipe,"' + b"y" * 2000 + b", commas\n", b'second line, more",x\n', b"4,5,6\n"]
    (tmp_path / "even.csv").write_bytes(b"".join(even))
    items, rejects, _ = _read(tmp_path / "even.csv", "csv", max_line_bytes=1024)
    assert [(i.line, i.value) for i in items] == [(4, {"a": "4", "b": "5", "c": "6"})]
    assert [(r.line, r.reason) for r in rejects] == [(2, "line_too_long")]
    # a long line met inside a quoted field that an earlier line opened: it closes there, or runs on
    for text, kept in [
        (b'a,b\n"first\n' + b"w" * 2000 + b'",1\n2,3\n', 4),
        (b'a,b\n"x\n' + b"w" * 2000 + b'\ny",1\n2,3\n', 5),
    ]:
        (tmp_path / "q.csv").write_bytes(text)
        items, rejects, _ = _read(tmp_path / "q.csv", "csv", max_line_bytes=1024)
        assert [i.line for i in items] == [kept] and [(r.line, r.reason) for r in rejects] == [(2, "line_too_long")]


def test_csv_recount_counts_ragged_rows_so_one_short_row_keeps_the_gate_independent(tmp_path: Path):
    from prep_assets.core.invariants.bronze import count_csv_rows

    (tmp_path / "d.csv").write_bytes(b"a,b,c\n1,2\n3,4,5\n6,7,8,9\n\n")
    assert count_csv_rows(tmp_path / "d.csv") == 3  # Arrow's count, not the reader's (it gave up on ragged rows)
    (tmp_path / "q.csv").write_bytes(b'a,b\n1,2\n"open,3\n')
    items, rejects, _ = _read(tmp_path / "q.csv", "csv")
    assert count_csv_rows(tmp_path / "q.csv") == 2 == len(items) + len(rejects)  # the open quote's row counts
    # Arrow ends a row at a bare \r, the reader does not: the reader's count stands (None)
    (tmp_path / "r.csv").write_bytes(b"a,b\r\n1,x\ry\r\n")
    assert count_csv_rows(tmp_path / "r.csv") is None
    (tmp_path / "crlf.csv").write_bytes(b"a,b\r\n1,2\r\n")
    assert count_csv_rows(tmp_path / "crlf.csv") == 1
    # lines the reader counts blank (whitespace, an empty quoted field) are not rows of Arrow's count either
    (tmp_path / "blank.csv").write_bytes(b'a,b\n1,2\n   \n""\n3,4\n')
    items, rejects, acct = _read(tmp_path / "blank.csv", "csv")
    assert acct.blank_lines == 2 and count_csv_rows(tmp_path / "blank.csv") == 2 == len(items) + len(rejects)


def test_a_key_given_twice_in_one_object_is_a_reject_never_one_value_dropped(tmp_path: Path):
    lines = [
        b'{"id": 1, "price": 10, "price": 99}\n',  # orjson keeps the last value: 10 was lost without a word
        b'{"id": 2, "price": 20}\n',
        b'{"m": [{"role": "a", "content": "x:"}, {"role": "b", "content" :"y", "content": "z"}]}\n',  # nested, spaced
        b'{"text": "\\": is in a string", "note": "a\\":b"}\n',  # `":` inside strings: more than the keys, no repeat
        b'{"a": 1.5, "a": 2.5}\n',  # floats: read by the json module (loads_json's slow path)
    ]
    (tmp_path / "d.jsonl").write_bytes(b"".join(lines))
    items, rejects, acct = _read(tmp_path / "d.jsonl", "jsonl")
    assert [i.line for i in items] == [2, 4] and items[1].value["note"] == 'a":b'
    assert [(r.line, r.reason) for r in rejects] == [(1, "duplicate_key"), (3, "duplicate_key"), (5, "duplicate_key")]
    assert "'price' is given twice" in rejects[0].detail and "'content'" in rejects[1].detail
    assert acct.lines_in == 5 == len(items) + len(rejects)
    # a JSON array's element: that element is the reject, the array is read on
    (tmp_path / "d.json").write_bytes(b'[{"t": "a", "t": "b"},\n {"t": "c"}]')
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert [i.value for i in items] == [{"t": "c"}] and [(r.line, r.reason) for r in rejects] == [(1, "duplicate_key")]


def test_parquet_infinity_is_a_reject_and_float32_trains_as_written(tmp_path: Path):
    """An infinity became null (as if missing) without a word; a float32 19.99 trained as 19.989999771118164."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": [1, 2, 3, 4],
            "x": pa.array([float("inf"), 1.5, float("nan"), -float("inf")], pa.float64()),
            "price": pa.array([19.99, 0.1, None, 3.4e38], pa.float32()),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    items, rejects, acct = _read(tmp_path / "d.parquet", "parquet")
    assert [(r.line, r.reason) for r in rejects] == [(1, "invalid_json_constant"), (4, "invalid_json_constant")]
    assert "column 'x' holds inf" in rejects[0].detail and acct.lines_in == 4
    assert [i.value for i in items] == [{"id": 2, "x": 1.5, "price": 0.1}, {"id": 3, "x": None, "price": None}]
    (tmp_path / "e.parquet").unlink(missing_ok=True)
    pq.write_table(pa.table({"price": pa.array([19.99], pa.float32())}), tmp_path / "e.parquet")
    (item,), _, _ = _read(tmp_path / "e.parquet", "parquet")
    assert item.text == '{"price":19.99}'


def test_parquet_nested_float32_in_lists_structs_and_maps_trains_as_written(tmp_path: Path):
    """A float32 inside a list, a struct or a map trained as its binary expansion (0.1 as 0.10000000149011612)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "scores": pa.array([[0.1, 19.99, None], None], pa.list_(pa.float32())),
            "item": pa.array(
                [{"price": 0.3, "name": "a"}, {"price": None, "name": "b"}],
                pa.struct([("price", pa.float32()), ("name", pa.string())]),
            ),
            "tags": pa.array([[("k", 2.2)], []], pa.map_(pa.string(), pa.float32())),
            "deep": pa.array([[[0.7]], [[1.5]]], pa.list_(pa.list_(pa.float32()))),
            "wide": pa.array([[0.1], [0.2]], pa.list_(pa.float64())),
        }
    )
    pq.write_table(table, tmp_path / "n.parquet")
    items, rejects, _ = _read(tmp_path / "n.parquet", "parquet")
    assert rejects == []
    first, second = (i.value for i in items)
    assert first["scores"] == [0.1, 19.99, None] and second["scores"] is None
    assert first["item"] == {"price": 0.3, "name": "a"} and second["item"]["price"] is None
    assert first["deep"] == [[0.7]] and second["deep"] == [[1.5]]
    assert first["wide"] == [0.1] and second["wide"] == [0.2]  # float64 untouched
    assert "0.10000000149011612" not in items[0].text and "2.2" in items[0].text


def test_utf16_and_utf32_drops_are_refused_whole_never_read_as_garbled_lines(tmp_path: Path):
    import pytest

    from prep_assets.core.errors import DropError

    text = "hello world, line one\n天下大水山月木火土中\n"
    cases = {
        "bom16.txt": ("txt", text.encode("utf-16"), "UTF-16 LE"),
        "be16.jsonl": ("jsonl", b'{"text": "plain ascii in utf16 big endian"}\n'.decode().encode("utf-16-be"), "0"),
        "bom32.csv": ("csv", "a,b\nx,y\n".encode("utf-32"), "UTF-32 LE"),
        "bom16be.json": ("json", b'[{"text": "a"}]'.decode().encode("utf-16-be").join([b"\xfe\xff", b""]), "BE"),
    }
    line = '{"text": "plain ascii without a byte order mark"}\n'
    cases["le32.jsonl"] = (
        "jsonl",
        line.encode("utf-32-le"),
        "iconv -f UTF-32LE -t UTF-8 le32.jsonl > le32.utf8.jsonl",
    )
    cases["le16.txt"] = ("txt", line.encode("utf-16-le"), "UTF-16LE text without a byte order mark")
    cyrillic = "id,name,city\n" + "0,Иван Петров,Москва\n" * 100  # few ASCII characters: few 0 bytes
    cases["ru16.csv"] = ("csv", cyrillic.encode("utf-16-le"), "iconv -f UTF-16LE")
    cases["ru32.jsonl"] = ("jsonl", ('{"text": "Привет мир"}\n' * 20).encode("utf-32-be"), "iconv -f UTF-32BE")
    for name, (fmt, data, said) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DropError, match="reads UTF-8") as err:
            _read(tmp_path / name, fmt)
        assert said in str(err.value) and name in str(err.value)
    assert "iconv -f UTF-32 -t UTF-8" in str(pytest.raises(DropError, _read, tmp_path / "bom32.csv", "csv").value)
    gz = tmp_path / "g.jsonl.gz"
    gz.write_bytes(gzip.compress('{"text": "a"}\n'.encode("utf-16")))
    with pytest.raises(DropError, match="UTF-16 LE") as err:
        _read(gz, "jsonl.gz")
    assert "zcat g.jsonl.gz | iconv -f UTF-16 -t UTF-8 | gzip > g.utf8.jsonl.gz" in str(err.value)
    # UTF-8 text with a stray 0 byte (a short file too), a few bytes, or only 0 bytes is read line by line as before
    for data in (b"one \x00 two\nthree\n", b"ab\x00\ncd\n", b"hi\n\x00yo\n", b"a\n", b"\x00" * 64 + b"\n"):
        (tmp_path / "ok.txt").write_bytes(data)
        items, rejects, acct = _read(tmp_path / "ok.txt", "txt")
        assert [i.value for i in items] == [t for t in data.decode().split("\n") if t.strip()], data


def test_a_plain_file_named_gz_is_not_gzip_and_a_huge_integer_says_what_is_wrong(tmp_path: Path):
    """A text file named .jsonl.gz was `truncated_gzip`; a 5,000-digit number told the user to call
    sys.set_int_max_str_digits()."""
    (tmp_path / "plain.jsonl.gz").write_bytes(b'{"text": "a"}\n')
    items, rejects, acct = _read(tmp_path / "plain.jsonl.gz", "jsonl.gz")
    assert not items and [(r.line, r.byte_offset, r.reason) for r in rejects] == [(1, 0, "not_gzip")]
    assert "rename it or compress it" in rejects[0].detail and acct.lines_in == 1
    (tmp_path / "big.jsonl").write_bytes(b'{"text": "huge int", "n": ' + b"9" * 5000 + b'}\n{"text": "ok"}\n')
    items, rejects, _ = _read(tmp_path / "big.jsonl", "jsonl")
    assert [i.value["text"] for i in items] == ["ok"]
    assert rejects[0].reason == "malformed_json" and "give it as a string" in rejects[0].detail
    assert "sys.set_int_max_str_digits" not in rejects[0].detail
    # a real gzip stream that breaks (a flipped CRC byte, garbage after it) stays truncated_gzip
    good = gzip.compress(b'{"text": "a"}\n')
    for broken in (good[:-8] + bytes([good[-8] ^ 1]) + good[-7:], good + b"garbage!"):
        (tmp_path / "bad.jsonl.gz").write_bytes(broken)
        assert _read(tmp_path / "bad.jsonl.gz", "jsonl.gz")[1][-1].reason == "truncated_gzip"
    # in a JSON array the element holding it is the reject, and the elements after it are read
    (tmp_path / "big.json").write_bytes(b'[{"text": "x", "n": ' + b"9" * 5000 + b'}, {"text": "ok"}]')
    items, rejects, _ = _read(tmp_path / "big.json", "json")
    assert [i.value["text"] for i in items] == ["ok"] and "give it as a string" in rejects[0].detail
    # the number itself an element: that element only, never the one after it
    (tmp_path / "bare.json").write_bytes(b'[{"text": "a"}, ' + b"9" * 5000 + b', {"text": "b"}, {"text": "c"}]')
    items, rejects, acct = _read(tmp_path / "bare.json", "json")
    assert [i.value["text"] for i in items] == ["a", "b", "c"] and len(rejects) == 1 and acct.lines_in == 4


def test_parquet_decimals_train_as_numbers_where_a_float_holds_them_else_as_their_digits(tmp_path: Path):
    """Every decimal trained as a JSON string: the decimal 1 as "1" beside the CSV cell 1 as a number."""
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "money": pa.array([Decimal("1.10"), Decimal("2.00"), None], pa.decimal128(10, 2)),
            "wide": pa.array(
                [Decimal("12345678901234567890.12"), Decimal("1.00"), Decimal("3.5")], pa.decimal128(22, 2)
            ),
            "whole": pa.array([Decimal("98765432109876543210"), Decimal("1"), Decimal("0")], pa.decimal128(38, 0)),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    items, rejects, _ = _read(tmp_path / "d.parquet", "parquet")
    assert not rejects
    # a decimal column the spec types (tabular.column_types) stays as written for that type to read
    typed = read_drop(
        tmp_path / "d.parquet", "parquet", max_line_bytes=1 << 20, acct=Accounting(), typed_columns={"money"}
    )
    assert next(typed).text.startswith('{"money":"1.10"')  # type: ignore[union-attr]
    assert [i.text for i in items] == [
        '{"money":1.1,"wide":"12345678901234567890.12","whole":98765432109876543210}',
        '{"money":2.0,"wide":"1.00","whole":1}',
        '{"money":null,"wide":"3.50","whole":0}',
    ]


def test_json_array_bad_element_is_its_own_reject_and_reading_goes_on(tmp_path: Path):
    """A NaN, an infinity, a raw tab or a byte that is not UTF-8 in one element rejected every element after it
    (the invalid UTF-8 one the whole array) in one reject, or lost them: each bad element is now its own reject."""
    raw = (
        b'[{"text": "a"},\n{"text": "b", "n": NaN},\n{"text": "\xff\xfe"}, {"text": "c\td"},\n'
        b'{"text": "\xc3\xa9", "n": 1e400},\n{"text": "e"}]'
    )
    (tmp_path / "d.json").write_bytes(raw)
    items, rejects, acct = _read(tmp_path / "d.json", "json")
    assert [(i.value["text"], i.line) for i in items] == [("a", 1), ("e", 5)]
    assert [(r.reason, r.line) for r in rejects] == [
        ("invalid_json_constant", 2),
        ("invalid_utf8", 3),
        ("malformed_json", 3),
        ("invalid_json_constant", 4),
    ]
    assert [raw[r.byte_offset : r.byte_offset + 9] for r in rejects] == [
        b'{"text": ',
        b'{"text": ',
        b'{"text": ',
        b'{"text": ',
    ]
    assert raw[items[1].byte_offset :].startswith(b'{"text": "e"}')  # offsets count the bytes that are not UTF-8
    assert rejects[1].detail == "byte 0xff of the element is not UTF-8" and "\\xff" in rejects[1].excerpt
    assert acct.lines_in == 6 == len(items) + len(rejects)


def test_csv_header_that_does_not_parse_makes_each_data_row_a_reject_none_lost(tmp_path: Path):
    """The rows after such a header were neither kept nor rejected; with a bare CR the gate's recount gave up."""
    for name, raw in (
        ("q.csv", b'"text"x,b\nhello,1\nworld,2\nthird,3\n'),
        ("cr.csv", b"text\rb,c\nhello,1\nworld,2\n"),
    ):
        (tmp_path / name).write_bytes(raw)
        items, rejects, acct = _read(tmp_path / name, "csv")
        rows = raw.count(b"\n") - 1
        assert items == [] and [r.line for r in rejects] == list(range(2, rows + 2)), name
        assert all(r.reason == "malformed_csv" and r.detail.startswith("the header (line 1)") for r in rejects)
        assert acct.lines_in == rows and acct.rejected == rows


def test_csv_empty_lines_before_the_header_are_blank_lines_not_a_header_of_no_column(tmp_path: Path):
    (tmp_path / "b.csv").write_bytes(b"\n\ntext,b\nhello,1\n")
    items, rejects, acct = _read(tmp_path / "b.csv", "csv")
    assert [(i.value, i.line, i.byte_offset) for i in items] == [({"text": "hello", "b": "1"}, 4, 9)]
    assert rejects == [] and acct.blank_lines == 2 and acct.lines_in == 3


def test_txt_lone_carriage_return_at_the_end_of_the_file_stays_in_its_line(tmp_path: Path):
    """Only a CRLF line end is taken off a line: the last line's lone \\r was stripped as if it were one."""
    (tmp_path / "t.txt").write_bytes(b"first\r\nsecond\rthird\r")
    items, _, _ = _read(tmp_path / "t.txt", "txt")
    assert [i.value for i in items] == ["first", "second\rthird\r"]


def test_parquet_column_name_not_utf8_is_a_reject_not_a_traceback(tmp_path: Path):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({"text": ["a", "b"], "tezt": ["x", "y"]}), out, store_schema=False)
    (tmp_path / "n.parquet").write_bytes(out.getvalue().replace(b"tezt", b"te\xffz"))
    items, rejects, _ = _read(tmp_path / "n.parquet", "parquet")
    assert items == [] and [(r.reason, r.line) for r in rejects] == [("unreadable_parquet", 1)]


def test_a_json_array_element_not_well_formed_rejects_the_rest_rather_than_guessing_its_end(tmp_path: Path):
    """Ends guessed by counting brackets outside strings swallowed the next elements (a stray quote) or kept a
    fragment of one (a bracket closing early) as a record."""
    for raw in (b'[{"t": "5" tall"},\n{"t": "b"},\n{"t": "c"}]', b'[{"l": [1}], "x": 2},\n{"text": "ok"}]'):
        (tmp_path / "d.json").write_bytes(raw)
        items, rejects, acct = _read(tmp_path / "d.json", "json")
        assert items == [] and len(rejects) == 1 and acct.lines_in == 1, raw
        assert rejects[0].detail.endswith("the rest of the array is unreadable")


def test_a_csv_header_that_does_not_parse_with_no_row_after_it_is_the_reject_and_blank_rows_stay_blank(
    tmp_path: Path,
):
    (tmp_path / "h.csv").write_bytes(b'"text"x,b\n\n')
    items, rejects, acct = _read(tmp_path / "h.csv", "csv")
    assert items == [] and [(r.line, r.reason) for r in rejects] == [(1, "malformed_csv")]
    assert rejects[0].detail.startswith("the header cannot be read") and acct.blank_lines == 1
    (tmp_path / "b.csv").write_bytes(b'"text"x,b\n""\n  \nworld,2\n')  # as Arrow's recount reads them: blank
    items, rejects, acct = _read(tmp_path / "b.csv", "csv")
    assert [r.line for r in rejects] == [4] and acct.blank_lines == 2 and acct.lines_in == 3
