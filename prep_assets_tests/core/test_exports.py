"""The trainer exports beside the Parquet shards: the npy memmap of packed rows and Megatron's MMIDIDX .bin/.idx.

Rows come from the real planner (`plan_rows` + `materialize_rows`) over small hand-checkable examples; each test
reads the files back with numpy or a reader written from Megatron-LM's published layout (`read_mmidx`), never
through the writer's own code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from prep_assets.core.exports import (
    MMIDIDX_MAGIC,
    MemmapWriter,
    megatron_dtype,
    memmap_token_dtype,
    write_megatron,
    write_memmap,
)
from prep_assets.core.lake import read_json
from prep_assets.core.packing import plan_rows
from prep_assets.core.rows import PackedRows, materialize_rows
from prep_assets_tests.core.helpers import read_mmidx

ROW_LEN = 8
PAD = 0
ARRAYS = ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids")


def _examples(lengths: list[int], first_id: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Examples of the given lengths with distinct consecutive token ids from `first_id`, and their offsets."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.arange(first_id, first_id + offsets[-1], dtype=np.int32), offsets


def _packed(lengths: list[int], first_id: int = 1) -> tuple[PackedRows, np.ndarray, np.ndarray]:
    """The examples packed best-fit into rows of ROW_LEN; the rows, the examples' token ids and their offsets."""
    ids, offsets = _examples(lengths, first_id)
    plan = plan_rows(np.array(lengths), capacity=ROW_LEN, strategy="bfd")
    rows = materialize_rows(
        plan,
        token_ids=ids,
        loss_mask=np.ones(len(ids), dtype=np.uint8),
        token_type_ids=np.ones(len(ids), dtype=np.uint8),
        offsets=offsets,
        row_len=ROW_LEN,
        pad_id=PAD,
    )
    return rows, ids, offsets


def _open(dest: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """meta.json and every array opened as a trainer would: numpy.memmap with the meta's dtype and shape."""
    meta = read_json(dest / "meta.json")
    arrays = {
        name: np.memmap(dest / a["file"], dtype=a["dtype"], mode="r", shape=tuple(a["shape"]))
        for name, a in meta["arrays"].items()
    }
    return meta, arrays


# ---------------------------------------------------------------- npy memmap


def test_memmap_round_trips_every_array_of_every_row(tmp_path: Path):
    rows, _, _ = _packed([5, 3, 7, 2, 8, 1])
    result = write_memmap(tmp_path / "memmap", "train/memmap", rows, vocab_size=100)
    meta, arrays = _open(tmp_path / "memmap")
    assert meta["rows"] == result["rows"] == rows.num_rows > 1 and meta["seq_len"] == ROW_LEN
    assert meta["order"] == "C" and sorted(arrays) == sorted(ARRAYS)
    for name in ARRAYS:
        assert arrays[name].shape == (rows.num_rows, ROW_LEN), name
        assert np.array_equal(arrays[name], getattr(rows, name).reshape(rows.num_rows, ROW_LEN)), name


def test_memmap_gives_back_every_example_token_and_boundary_from_segment_and_position_ids(tmp_path: Path):
    """Each segment (a run of one segment id, positions restarting at 0) is exactly one example's tokens."""
    lengths = [5, 3, 7, 2, 8, 1]
    rows, ids, offsets = _packed(lengths)
    write_memmap(tmp_path / "m", "m", rows, vocab_size=100)
    _, arrays = _open(tmp_path / "m")
    found: dict[int, list[int]] = {}
    for r in range(arrays["input_ids"].shape[0]):
        seg, pos, tok = arrays["segment_ids"][r], arrays["position_ids"][r], arrays["input_ids"][r]
        for s in sorted(set(seg.tolist()) - {0}):
            where = np.flatnonzero(seg == s)
            assert pos[where].tolist() == list(range(len(where)))  # a boundary: positions restart
            first = int(tok[where[0]])
            found[int(np.searchsorted(offsets, first - 1, side="right")) - 1] = tok[where].tolist()
        assert set(tok[seg == 0].tolist()) <= {PAD}  # padding only outside segments
    assert found == {k: ids[offsets[k] : offsets[k + 1]].tolist() for k in range(len(lengths))}


@pytest.mark.parametrize(
    ("vocab_size", "dtype"), [(50257, "uint16"), (65536, "uint16"), (65537, "uint32"), (151_936, "uint32")]
)
def test_memmap_input_ids_uint16_up_to_a_vocabulary_of_65536_then_uint32(tmp_path: Path, vocab_size: int, dtype: str):
    assert memmap_token_dtype(vocab_size) == np.dtype(dtype)
    rows, ids, _ = _packed([3, 4], first_id=vocab_size - 7)  # the largest ids the vocabulary holds
    write_memmap(tmp_path / "m", "m", rows, vocab_size=vocab_size)
    meta, arrays = _open(tmp_path / "m")
    assert meta["arrays"]["input_ids"]["dtype"] == dtype
    assert {n: meta["arrays"][n]["dtype"] for n in ARRAYS[1:]} == {
        "loss_mask": "uint8",
        "position_ids": "int32",
        "segment_ids": "int32",
        "token_type_ids": "uint8",
    }
    assert int(arrays["input_ids"].max()) == vocab_size - 1 == int(ids.max())  # not wrapped by a narrow dtype
    assert (tmp_path / "m" / "input_ids.bin").stat().st_size == rows.num_rows * ROW_LEN * np.dtype(dtype).itemsize


def _row_slice(rows: PackedRows, lo: int, hi: int) -> PackedRows:
    """Rows lo..hi of `rows` as their own PackedRows (a chunk as the shards builder appends it)."""
    seg = rows.seg_offsets
    return dataclasses.replace(
        rows,
        **{n: getattr(rows, n)[lo * rows.row_len : hi * rows.row_len] for n in ARRAYS},
        seg_lengths=rows.seg_lengths[seg[lo] : seg[hi]],
        seg_offsets=seg[lo : hi + 1] - seg[lo],
        example_order=rows.example_order[seg[lo] : seg[hi]],
        seg_starts=rows.seg_starts[seg[lo] : seg[hi]],
        num_loss_tokens=rows.num_loss_tokens[lo:hi],
    )


def test_memmap_appended_in_chunks_is_byte_identical_to_written_at_once(tmp_path: Path):
    rows, _, _ = _packed([5, 3, 7, 2, 8, 1])
    whole = write_memmap(tmp_path / "a", "m", rows, vocab_size=100)
    writer = MemmapWriter(tmp_path / "b", "m", ROW_LEN, vocab_size=100)
    for lo, hi in ((0, 1), (1, 1), (1, rows.num_rows)):  # an empty chunk too
        writer.append(_row_slice(rows, lo, hi))
    chunked = writer.close()
    assert chunked["rows"] == whole["rows"] == rows.num_rows
    for name in (*ARRAYS, "meta"):
        suffix = ".json" if name == "meta" else ".bin"
        a, b = (tmp_path / d / f"{name}{suffix}" for d in ("a", "b"))
        assert a.read_bytes() == b.read_bytes(), name
    assert chunked["files"] == whole["files"]


def test_memmap_lists_each_file_under_its_relative_path_with_sha256_and_size(tmp_path: Path):
    rows, _, _ = _packed([5, 3, 7])
    result = write_memmap(tmp_path / "memmap", "train/memmap", rows, vocab_size=100)
    assert result["dir"] == "train/memmap"
    assert [f["path"] for f in result["files"]] == [f"train/memmap/{n}.bin" for n in ARRAYS] + [
        "train/memmap/meta.json"
    ]
    for f in result["files"]:
        path = tmp_path / "memmap" / Path(f["path"]).name
        assert f["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and f["bytes"] == path.stat().st_size


def test_memmap_with_no_rows_writes_empty_arrays_of_shape_zero_by_len(tmp_path: Path):
    result = MemmapWriter(tmp_path / "m", "m", ROW_LEN, vocab_size=100).close()
    meta = read_json(tmp_path / "m" / "meta.json")
    assert result["rows"] == meta["rows"] == 0
    assert all(meta["arrays"][n]["shape"] == [0, ROW_LEN] for n in ARRAYS)
    assert all((tmp_path / "m" / f"{n}.bin").stat().st_size == 0 for n in ARRAYS)


# ---------------------------------------------------------------- Megatron MMIDIDX


def test_megatron_round_trips_every_document_and_boundary_including_an_empty_document(tmp_path: Path):
    lengths = [4, 1, 0, 9, 3]
    ids, offsets = _examples(lengths, first_id=10)
    result = write_megatron(tmp_path / "text_document", "train/megatron/text_document", ids, offsets, vocab_size=100)
    m = read_mmidx(tmp_path / "text_document")
    assert m["version"] == 1 and m["code"] == 8 and m["rest"] == 0
    assert m["sizes"].tolist() == lengths and m["doc_idx"].tolist() == list(range(len(lengths) + 1))
    assert m["pointers"].tolist() == [2 * int(o) for o in offsets[:-1]]  # byte offsets of uint16 tokens
    docs = [m["data"][p // m["itemsize"] : p // m["itemsize"] + n].tolist() for p, n in zip(m["pointers"], m["sizes"])]
    assert docs == [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    assert docs[2] == [] and m["data"].tolist() == ids.tolist()  # nothing between or after the documents
    assert result == {
        "prefix": "train/megatron/text_document",
        "documents": 5,
        "tokens": 17,
        "dtype": "uint16",
        "files": result["files"],
    }


def test_megatron_idx_header_holds_magic_version_dtype_code_and_counts_little_endian(tmp_path: Path):
    ids, offsets = _examples([2, 5, 1])
    write_megatron(tmp_path / "doc", "doc", ids, offsets, vocab_size=1000)
    idx = (tmp_path / "doc.idx").read_bytes()
    assert idx[:9] == MMIDIDX_MAGIC == b"MMIDIDX\x00\x00"
    version, code, sequences, documents = struct.unpack("<QBQQ", idx[9:34])
    assert (version, code, sequences, documents) == (1, 8, 3, 4)
    assert len(idx) == 34 + 4 * 3 + 8 * 3 + 8 * 4  # int32 sizes, int64 pointers, int64 document indices
    assert struct.unpack("<3i", idx[34:46]) == (2, 5, 1)
    assert struct.unpack("<3q", idx[46:70]) == (0, 4, 14)
    assert struct.unpack("<4q", idx[70:102]) == (0, 1, 2, 3)
    assert (tmp_path / "doc.bin").read_bytes() == ids.astype("<u2").tobytes()


@pytest.mark.parametrize(
    ("vocab_size", "dtype", "code"), [(50257, "uint16", 8), (65499, "uint16", 8), (65500, "int32", 4)]
)
def test_megatron_token_dtype_uint16_below_a_vocabulary_of_65500_else_int32(
    tmp_path: Path, vocab_size: int, dtype: str, code: int
):
    assert megatron_dtype(vocab_size) == np.dtype(dtype)
    ids = np.array([vocab_size - 1, 0, vocab_size - 2], dtype=np.int32)
    result = write_megatron(tmp_path / "doc", "doc", ids, np.array([0, 1, 3]), vocab_size=vocab_size)
    m = read_mmidx(tmp_path / "doc")
    assert result["dtype"] == dtype and m["code"] == code and m["itemsize"] == np.dtype(dtype).itemsize
    assert m["data"].tolist() == ids.tolist() and m["pointers"].tolist() == [0, m["itemsize"]]


def test_megatron_export_uses_int32_for_large_vocabularies(tmp_path: Path):
    ids = np.array([1, 70_000, 3, 4, 5], dtype=np.int32)
    write_megatron(tmp_path / "text_document", "text_document", ids, np.array([0, 2, 5]), vocab_size=70_001)
    m = read_mmidx(tmp_path / "text_document")
    assert m["code"] == 4 and m["sizes"].tolist() == [2, 3] and m["pointers"].tolist() == [0, 8]
    assert m["data"].tolist() == ids.tolist()


def test_megatron_written_from_chunks_equals_written_at_once(tmp_path: Path):
    ids = np.arange(10, dtype=np.int32)
    offsets = np.array([0, 4, 10])
    write_megatron(tmp_path / "a" / "doc", "doc", ids, offsets, vocab_size=100)
    write_megatron(tmp_path / "b" / "doc", "doc", iter([ids[:3], ids[3:7], ids[7:]]), offsets, vocab_size=100)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / "a" / f"doc{suffix}").read_bytes() == (tmp_path / "b" / f"doc{suffix}").read_bytes()


def test_megatron_lists_bin_and_idx_with_sha256_and_size(tmp_path: Path):
    ids, offsets = _examples([3, 3])
    result = write_megatron(tmp_path / "m" / "text_document", "s/m/text_document", ids, offsets, vocab_size=100)
    assert [f["path"] for f in result["files"]] == ["s/m/text_document.bin", "s/m/text_document.idx"]
    for f, suffix in zip(result["files"], (".bin", ".idx"), strict=True):
        path = tmp_path / "m" / f"text_document{suffix}"
        assert f["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and f["bytes"] == path.stat().st_size
