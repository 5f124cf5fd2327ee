"""Bad input, end to end through bronze: one generated fixture per edge case, exact outcomes asserted.

Each case writes its drop's bytes under `tmp_path`, registers the drop, builds bronze with the real
`build_raw_records` and runs the real bronze gates of `core/gates.py` (the code the Dagster asset checks
run). For every case: the records kept (line and content), the rejects (line, reason, detail), that every reject
row names its file, line, byte offset and reason (offsets checked against the bytes), that the accounting gate
passes (`lines in = records + rejects + blank lines`), that nothing stored holds U+FFFD or a null turned into
"None", and that no traceback escapes. The two cases that read hundreds of megabytes (a 100 MiB line, a 1 GiB gzip
bomb) build bronze in a subprocess whose peak RSS is measured. The last test prints
`bad input: N cases, N correct, 0 records unaccounted` from what the cases recorded.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prep_assets.core import readers
from prep_assets.core.bronze import BronzeStats
from prep_assets.core.drops import register_drops, registered_drops
from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.gates import evaluate
from prep_assets.core.invariants import Outcome
from prep_assets.core.lake import JSON_MAX_DEPTH, DatasetPaths, dataset_paths
from prep_assets.core.readers import GZIP_MIN_LIMIT, NESTING_TOO_DEEP
from prep_assets.core.spec import DatasetSpec
from prep_assets_tests.conftest import PROJECT, make_spec, write_dataset
from prep_assets_tests.core.helpers import bronze_digests, build_bronze

MiB = 1 << 20
DEFAULT_MAX_LINE_BYTES = 64 * MiB
RSS_BUDGET_MIB = 300  # peak RSS growth allowed while a subprocess reads a huge input
SUBPROCESS_BUILD_SECONDS = 10.0
ACCOUNTED, REJECT_RATE, REQUIRED = "raw_records_accounted", "raw_records_reject_rate", "raw_records_required_fields"
BRONZE_GATES = {ACCOUNTED, REJECT_RATE, REQUIRED}
INSTRUCTION = {"input": {"type": "instruction", "prompt_key": "prompt", "completion_key": "completion"}}
TABULAR = {"input": {"type": "tabular"}}


# ---------------------------------------------------------------- what a case expects


@dataclass(frozen=True)
class Kept:
    line: int
    content: dict[str, Any]  # the bronze `content` column, decoded


@dataclass(frozen=True)
class Rejected:
    line: int
    reason: str
    detail: str  # a fragment the reject's detail must contain


@dataclass(frozen=True)
class DropCase:
    """One generated drop file and the exact bronze outcome expected for it."""

    file: str
    data: bytes
    lines_in: int
    kept: tuple[Kept, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    blank_lines: int = 0
    failed_gates: frozenset[str] = frozenset()
    recount: int | None = -1  # the accounting gate's independent count; -1 = equal to lines_in
    # the (decompressed) bytes the lines are cut from, to check byte offsets: b"" = `data`, None = not checked
    stream: bytes | None = b""


@dataclass(frozen=True)
class DropRun:
    """What bronze and its gates produced for one drop."""

    partition: str
    stats: BronzeStats
    records: list[dict[str, Any]]
    rejects: list[dict[str, Any]]
    gates: dict[str, Outcome]
    gate_seconds: float


@dataclass(frozen=True)
class CaseRun:
    spec: DatasetSpec
    paths: DatasetPaths
    drops: dict[str, DropRun]  # by file name
    child: dict[str, Any] | None  # the subprocess's report (RSS, seconds), for subprocess cases


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], list[DropCase]]  # called inside the test: the bytes are generated under tmp_path
    sections: dict[str, Any] = field(default_factory=dict)  # spec sections given to make_spec
    check: Callable[[CaseRun], None] | None = None  # assertions specific to the case
    in_subprocess: bool = False
    known_bug: str | None = None  # xfail(strict=True) reason
    patch: Callable[[pytest.MonkeyPatch], None] | None = None  # set up before bronze is built


@dataclass
class CaseResult:
    correct: bool = False
    unaccounted: int | None = None
    records: int = 0
    rejects: int = 0
    seconds: float = 0.0
    known_bug: bool = False


RESULTS: dict[str, CaseResult] = {}


def lines(*parts: bytes) -> bytes:
    return b"".join(p + b"\n" for p in parts)


def jl(value: Any) -> bytes:
    """One JSON value as UTF-8 bytes, non-ASCII characters written as themselves."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def text(t: str) -> dict[str, Any]:
    return {"text": t}


def turn(prompt: str, completion: str) -> dict[str, Any]:
    return {"turns": [{"prompt": prompt, "completion": completion}]}


# ---------------------------------------------------------------- building and observing bronze


CHILD = "import sys; from prep_assets_tests.core.helpers import child_build_main; child_build_main(sys.argv[1:])"


def build_in_subprocess(data_dir: Path, name: str, sections: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(data_dir), name, json.dumps(sections)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr, f"a Python traceback escaped the bronze builder:\n{proc.stderr}"
    assert proc.returncode == 0, f"bronze subprocess exited {proc.returncode}:\n{proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def observe(spec: DatasetSpec, paths: DatasetPaths, partition: str) -> DropRun:
    out = paths.partition_dir("bronze", partition)
    start = time.perf_counter()
    gates = {o.name: o for o in evaluate(spec, paths, partition, layer="bronze")}
    seconds = time.perf_counter() - start
    return DropRun(
        partition,
        BronzeStats.from_json(json.loads((out / "accounting.json").read_text(encoding="utf-8"))),
        read_rows(out / "records.parquet"),
        read_rows(out / "rejects.parquet"),
        gates,
        seconds,
    )


def guarded(what: str, fn: Callable[[], Any]) -> Any:
    """Run `fn`; no case expects an error, so any exception fails the case, saying whether it was a user-facing
    `PrepAssetsError` (message shown) or a traceback escaping."""
    try:
        return fn()
    except PrepAssetsError as exc:
        pytest.fail(f"{what}: unexpected {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the point is to report any escaping traceback
        pytest.fail(f"{what}: a Python traceback escaped: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")


def line_starts(stream: bytes) -> list[int]:
    return [0] + [m.end() for m in re.finditer(b"\n", stream)]


def strings(rows: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for row in rows:
        for key, value in row.items():
            if isinstance(value, str):
                yield key, value


def check_drop(exp: DropCase, run: DropRun) -> None:
    """The assertions every case makes on every drop."""
    where = exp.file
    stats = run.stats
    assert (stats.lines_in, stats.blank_lines) == (exp.lines_in, exp.blank_lines), where
    assert stats.records == len(run.records) and stats.rejects == len(run.rejects), where
    assert stats.lines_in == len(run.records) + len(run.rejects) + stats.blank_lines, where

    kept = [Kept(r["source_line"], json.loads(r["content"])) for r in run.records]
    assert kept == list(exp.kept), where
    got = [(r["source_line"], r["reason"]) for r in run.rejects]
    assert got == [(r.line, r.reason) for r in exp.rejected], where
    for row, want in zip(run.rejects, exp.rejected, strict=True):
        assert want.detail in row["detail"], (where, row)

    for row in run.rejects:  # every reject names its file, line, byte offset and reason
        assert row["source_file"] == exp.file and row["drop"] == run.partition, row
        assert isinstance(row["source_line"], int) and row["source_line"] >= 1, row
        assert isinstance(row["byte_offset"], int) and row["byte_offset"] >= 0, row
        assert row["reason"] and row["detail"], row
    suffix = "#0" if stats.unit == "element" else ""  # the fixtures' arrays hold one element per line
    for row in run.records:
        assert row["source_file"] == exp.file, row
        assert row["record_id"] == f"{run.partition}:{row['source_line']}{suffix}", row

    stream = exp.data if exp.stream == b"" else exp.stream
    if stream is not None:  # offsets are where each line starts in the (decompressed) bytes
        starts = line_starts(stream)
        for row in run.records + run.rejects:
            assert row["byte_offset"] == starts[row["source_line"] - 1], (
                where,
                row["source_line"],
                row["byte_offset"],
            )

    for key, value in strings(run.records + run.rejects):  # never silently replaced
        assert "\ufffd" not in value, (where, key, value[:80])
    for row in run.records:  # a null never becomes the string "None" (no fixture holds that word)
        assert "None" not in row["content"] and "None" not in row["record"], (where, row["content"])

    assert set(run.gates) == BRONZE_GATES, where
    acct = run.gates[ACCOUNTED]
    assert acct.passed and acct.violations == 0, (where, acct)
    assert acct.facts["lines_in"] == exp.lines_in, (where, acct.facts)
    recount = exp.lines_in if exp.recount == -1 else exp.recount
    assert acct.facts["independent_line_count"] == recount, (where, acct.facts)
    failed = {name for name, o in run.gates.items() if not o.passed}
    assert failed == set(exp.failed_gates), (where, {n: (o.violations, o.facts) for n, o in run.gates.items()})
    rate = run.gates[REJECT_RATE]
    if not rate.passed:  # the failing gate shows each offending reject as file:line
        lines_rejected = sorted(r["source_line"] for r in run.rejects)[:20]
        assert [o["location"] for o in rate.offending] == [f"{exp.file}:{n}" for n in lines_rejected], where


# ---------------------------------------------------------------- the cases


def malformed_json() -> list[DropCase]:
    data = (
        lines(
            b'{"text": "first"}',
            b'{"text": "unterminated',
            b'{"text": "third"} trailing',
            b'{"text" "x"}',
            b'{"text": }',
        )
        + b'{"text": "last line, no newline"}'
    )
    return [
        DropCase(
            "malformed.jsonl",
            data,
            lines_in=6,
            kept=(Kept(1, text("first")), Kept(6, text("last line, no newline"))),
            rejected=(
                Rejected(2, "malformed_json", "Unterminated string"),
                Rejected(3, "malformed_json", "Extra data"),
                Rejected(4, "malformed_json", "Expecting ':' delimiter"),
                Rejected(5, "malformed_json", "Expecting value"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def invalid_utf8() -> list[DropCase]:
    data = lines(
        b'{"text": "caf\xe9 latin-1"}',
        b'{"text": "ok"}',
        b'{"text": "surrogate \xed\xa0\x80"}',
        b'{"text": "overlong \xc0\xaf"}',
        jl(text("café in UTF-8")),
    )
    return [
        DropCase(
            "invalid_utf8.jsonl",
            data,
            lines_in=5,
            kept=(Kept(2, text("ok")), Kept(5, text("café in UTF-8"))),
            rejected=(
                Rejected(1, "invalid_utf8", "invalid continuation byte"),
                Rejected(3, "invalid_utf8", "invalid continuation byte"),
                Rejected(4, "invalid_utf8", "invalid start byte"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def check_invalid_utf8(run: CaseRun) -> None:
    rejects = run.drops["invalid_utf8.jsonl"].rejects
    assert "caf\\xe9 latin-1" in rejects[0]["excerpt"]  # the bad byte is shown escaped, never as U+FFFD


def utf8_bom() -> list[DropCase]:
    data = lines(b'\xef\xbb\xbf{"text": "first"}', b'\xef\xbb\xbf{"text": "second"}', b'{"text": "third"}')
    return [
        DropCase(
            "bom.jsonl",
            data,
            lines_in=3,
            kept=(Kept(1, text("first")), Kept(3, text("third"))),
            rejected=(Rejected(2, "malformed_json", "Expecting value: line 1 column 1"),),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def check_bom(run: CaseRun) -> None:
    drop = run.drops["bom.jsonl"]
    first = drop.records[0]
    assert first["record"] == '{"text": "first"}'  # line 1: the BOM is stripped from the record as written
    assert first["record_sha256"] == hashlib.sha256(b'{"text": "first"}').hexdigest()
    assert drop.rejects[0]["excerpt"].startswith('\ufeff{"text": "second"}')  # line 2: kept in the line, rejected
    assert drop.rejects[0]["byte_offset"] == len(b'\xef\xbb\xbf{"text": "first"}\n')  # the BOM's bytes count


def crlf() -> list[DropCase]:
    data = b'{"text": "one"}\r\n{"text": "two"}\r\n\r\n{"text": "escaped \\r\\n stays"}\r\n'
    return [
        DropCase(
            "crlf.jsonl",
            data,
            lines_in=4,
            blank_lines=1,
            kept=(Kept(1, text("one")), Kept(2, text("two")), Kept(4, text("escaped \r\n stays"))),
        )
    ]


def check_crlf(run: CaseRun) -> None:
    records = run.drops["crlf.jsonl"].records
    assert [r["record"] for r in records] == ['{"text": "one"}', '{"text": "two"}', '{"text": "escaped \\r\\n stays"}']
    assert records[0]["record_sha256"] == hashlib.sha256(b'{"text": "one"}').hexdigest()  # without the CR LF


def lone_cr() -> list[DropCase]:
    txt = b"before\rafter\nsecond line\n"
    jsonl = lines(
        b'{"text": "cr as whitespace",\r"n": 1}',
        b'{"text": "raw\rcr in a string"}',
        b'{"text": "one"}\r{"text": "two"}',
    )
    return [
        DropCase("lone_cr.txt", txt, lines_in=2, kept=(Kept(1, text("before\rafter")), Kept(2, text("second line")))),
        DropCase(
            "lone_cr.jsonl",
            jsonl,
            lines_in=3,
            kept=(Kept(1, text("cr as whitespace")),),
            rejected=(
                Rejected(2, "malformed_json", "Invalid control character"),  # JSON forbids a raw CR
                Rejected(3, "malformed_json", "Extra data"),
            ),  # a CR never splits a line
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


SEPARATORS = "para\u2029graph, line\u2028sep, next\x85line"


def unicode_line_separators() -> list[DropCase]:
    data = lines(
        jl(text("line\u2028sep")),
        jl(text("para\u2029graph")),
        jl(text("next\x85line")),
        jl(text(SEPARATORS)),
        b'{"text": "escaped \\u2028 \\u2029 \\u0085"}',
    )
    return [
        DropCase(
            "separators.jsonl",
            data,
            lines_in=5,
            kept=(
                Kept(1, text("line\u2028sep")),
                Kept(2, text("para\u2029graph")),
                Kept(3, text("next\x85line")),
                Kept(4, text(SEPARATORS)),
                Kept(5, text("escaped \u2028 \u2029 \x85")),
            ),
        )
    ]


def check_unicode_line_separators(run: CaseRun) -> None:
    records = run.drops["separators.jsonl"].records
    assert "\u2028" in records[0]["record"] and "\x85" in records[2]["record"]  # kept as written, not split
    assert json.loads(records[3]["content"])["text"] == SEPARATORS


def nan_infinity() -> list[DropCase]:
    data = lines(
        b'{"text": "a", "score": NaN}',
        b'{"text": "b", "score": Infinity}',
        b'{"text": "c", "score": -Infinity}',
        b'{"text": "NaN"}',
        b'{"text": NaN}',
    )
    return [
        DropCase(
            "nan.jsonl",
            data,
            lines_in=5,
            kept=(Kept(4, text("NaN")),),
            rejected=(
                Rejected(1, "invalid_json_constant", "non-standard JSON constant NaN"),
                Rejected(2, "invalid_json_constant", "non-standard JSON constant Infinity"),
                Rejected(3, "invalid_json_constant", "non-standard JSON constant -Infinity"),
                Rejected(5, "invalid_json_constant", "non-standard JSON constant NaN"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def number_overflowing_to_infinity() -> list[DropCase]:
    data = lines(
        b'{"reading": 1e400, "unit": "x"}', b'{"reading": 1.5, "unit": "y"}', b'{"reading": -1e400, "unit": "z"}'
    )
    return [
        DropCase(
            "overflow.jsonl",
            data,
            lines_in=3,
            kept=(Kept(2, {"columns": ["reading", "unit"], "values": [1.5, "y"]}),),
            rejected=(Rejected(1, "invalid_json_constant", "1e400"), Rejected(3, "invalid_json_constant", "1e400")),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


HUGE_LINE_PREFIX = b'{"text": "'


def line_of_100_mib() -> list[DropCase]:
    huge = HUGE_LINE_PREFIX + b"x" * (100 * MiB) + b'"}\n'
    data = huge + lines(b'{"text": "after the long line"}')
    return [
        DropCase(
            "huge_line.jsonl",
            data,
            lines_in=2,
            kept=(Kept(2, text("after the long line")),),
            rejected=(Rejected(1, "line_too_long", f"{len(huge)} bytes > max_line_bytes {DEFAULT_MAX_LINE_BYTES}"),),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def check_bounded(run: CaseRun, what: str) -> float:
    assert run.spec.input.max_line_bytes == DEFAULT_MAX_LINE_BYTES  # the default, not a test override
    child = run.child
    assert child is not None
    growth_mib = (child["peak_kb"] - child["baseline_kb"]) / 1024
    assert growth_mib < RSS_BUDGET_MIB, f"{what}: peak RSS grew {growth_mib:.0f} MiB while reading"
    assert child["seconds"] < SUBPROCESS_BUILD_SECONDS, f"{what}: bronze took {child['seconds']:.1f} s"
    print(
        f"{what}: bronze in {child['seconds']:.1f} s, peak RSS ({child['peak_from']}) +{growth_mib:.0f} MiB over "
        f"the subprocess's {child['baseline_kb'] / 1024:.0f} MiB baseline"
    )
    return growth_mib


def check_line_of_100_mib(run: CaseRun) -> None:
    check_bounded(run, "100 MiB line")
    reject = run.drops["huge_line.jsonl"].rejects[0]
    assert reject["byte_offset"] == 0 and reject["excerpt"] == '{"text": "' + "x" * 150  # a bounded excerpt


def empty_file() -> list[DropCase]:
    return [DropCase("empty.jsonl", b"", lines_in=0)]


def check_empty_file(run: CaseRun) -> None:
    gates = run.drops["empty.jsonl"].gates  # an empty drop passes every bronze gate: 0 lines, 0 records, 0 rejects
    assert gates[REJECT_RATE].facts["reject_rate"] == 0.0 and gates[ACCOUNTED].facts["records"] == 0


TRUNCATED_ROWS = 400


def truncated_gzip() -> list[DropCase]:
    payload = lines(*(jl(text(f"row {i:04d} of the compressed drop")) for i in range(1, TRUNCATED_ROWS + 1)))
    whole = gzip.compress(payload, compresslevel=9, mtime=0)
    cut = len(whole) // 2
    while True:  # cut where the readable prefix ends inside a line, so that line is the truncated one
        prefix = zlib.decompressobj(wbits=31).decompress(whole[:cut])
        if not prefix.endswith(b"\n"):
            break
        cut -= 1
    complete = prefix.count(b"\n")
    assert 0 < complete < TRUNCATED_ROWS
    return [
        DropCase(
            "truncated.jsonl.gz",
            whole[:cut],
            lines_in=complete + 1,
            kept=tuple(Kept(i, text(f"row {i:04d} of the compressed drop")) for i in range(1, complete + 1)),
            rejected=(Rejected(complete + 1, "truncated_gzip", "stream ends early"),),
            recount=None,  # a broken stream cannot be recounted: the gate keeps the reader's count
            stream=prefix,
        )
    ]


BOMB_MEMBER_MIB, BOMB_MEMBERS = 16, 64  # 64 gzip members of 16 MiB of NUL bytes: 1 GiB, no newline


def gzip_bomb() -> list[DropCase]:
    member = gzip.compress(bytes(BOMB_MEMBER_MIB * MiB), compresslevel=9, mtime=0)
    data = member * BOMB_MEMBERS  # concatenated members are one gzip stream to every reader
    size = BOMB_MEMBER_MIB * MiB * BOMB_MEMBERS
    assert size > GZIP_MIN_LIMIT
    return [
        DropCase(
            "bomb.jsonl.gz",
            data,
            lines_in=1,
            rejected=(Rejected(1, "decompression_limit", f"inflates past {GZIP_MIN_LIMIT} bytes"),),
            failed_gates=frozenset({REJECT_RATE}),
            recount=None,
            stream=None,
        )
    ]


def check_gzip_bomb(run: CaseRun) -> None:
    drop = run.drops["bomb.jsonl.gz"]
    compressed = (run.paths.raw_dir / "bomb.jsonl.gz").stat().st_size
    assert compressed < 1.1 * MiB
    growth = check_bounded(run, "gzip bomb")
    reject = drop.rejects[0]
    assert (reject["source_line"], reject["byte_offset"]) == (1, 0) and reject["excerpt"] == "\x00" * 160
    # Output capped: the reader and the accounting gate's recount both stop at 256 MiB of the 1 GiB.
    print(
        f"gzip bomb: {compressed} compressed bytes -> {BOMB_MEMBER_MIB * BOMB_MEMBERS} MiB; the reader stopped at "
        f"{GZIP_MIN_LIMIT // MiB} MiB in {run.child['seconds'] if run.child else 0:.1f} s (+{growth:.0f} MiB RSS), "
        f"the gate in {drop.gate_seconds:.1f} s"
    )


def wrong_type_text_is_list() -> list[DropCase]:
    data = lines(
        b'{"text": ["a", "b"]}', b'{"text": 5}', b'{"text": {"en": "x"}}', b'{"text": true}', b'{"text": "fine"}'
    )
    return [
        DropCase(
            "text_types.jsonl",
            data,
            lines_in=5,
            kept=(Kept(5, text("fine")),),
            rejected=(
                Rejected(1, "wrong_type", "'text' is list, expected a string"),
                Rejected(2, "wrong_type", "'text' is int, expected a string"),
                Rejected(3, "wrong_type", "'text' is dict, expected a string"),
                Rejected(4, "wrong_type", "'text' is bool, expected a string"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def wrong_type_prompt_is_int() -> list[DropCase]:
    data = lines(
        b'{"prompt": 5, "completion": "c"}',
        b'{"prompt": "p", "completion": ["c"]}',
        b'{"prompt": "p", "completion": 1.5}',
        b'{"prompt": "p", "completion": "c"}',
    )
    return [
        DropCase(
            "prompt_types.jsonl",
            data,
            lines_in=4,
            kept=(Kept(4, turn("p", "c")),),
            rejected=(
                Rejected(1, "wrong_type", "'prompt' is int, expected a string"),
                Rejected(2, "wrong_type", "'completion' is list, expected a string"),
                Rejected(3, "wrong_type", "'completion' is float, expected a string"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


CHAT_OK = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def wrong_type_messages_is_string() -> list[DropCase]:
    data = lines(
        b'{"messages": "x"}',
        b'{"messages": {"role": "user", "content": "hi"}}',
        b'{"messages": [{"role": "user", "content": 5}]}',
        jl(CHAT_OK),
    )
    return [
        DropCase(
            "messages_types.jsonl",
            data,
            lines_in=4,
            kept=(Kept(4, CHAT_OK),),
            rejected=(
                Rejected(1, "wrong_type", "conversation is str, expected a list of messages"),
                Rejected(2, "wrong_type", "conversation is dict, expected a list of messages"),
                Rejected(3, "wrong_type", "conversation item 1: content is int"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def null_text() -> list[DropCase]:
    data = lines(b'{"text": null}', b"null", b'{"text": "present"}')
    return [
        DropCase(
            "null_text.jsonl",
            data,
            lines_in=3,
            kept=(Kept(3, text("present")),),
            rejected=(
                Rejected(1, "null_value", "'text' is null"),
                Rejected(2, "not_an_object", "expected a JSON object, got NoneType"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def null_completion() -> list[DropCase]:
    data = lines(
        b'{"instruction": "i", "input": "", "output": null}',
        b'{"instruction": null, "output": "o"}',
        b'{"instruction": "i", "input": null, "output": "o"}',
        b'{"instruction": "i", "input": "", "output": "o"}',
        b'{"instruction": "i", "output": "o"}',
    )
    return [
        DropCase(
            "null_completion.jsonl",
            data,
            lines_in=5,
            kept=(Kept(4, turn("i", "o")), Kept(5, turn("i", "o"))),
            rejected=(
                Rejected(1, "null_value", "'output' is null"),
                Rejected(2, "null_value", "'instruction' is null"),
                # an optional prompt key holding null is rejected too (an absent key is skipped)
                Rejected(3, "null_value", "'input' is null"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def missing_keys() -> list[DropCase]:
    data = lines(
        b'{"completion": "c"}',
        b'{"prompt": "p"}',
        b"{}",
        b'{"Prompt": "p", "completion": "c"}',
        b'{"prompt": "p", "completion": "c"}',
    )
    return [
        DropCase(
            "missing.jsonl",
            data,
            lines_in=5,
            kept=(Kept(5, turn("p", "c")),),
            rejected=(
                Rejected(1, "missing_key", "no key 'prompt'"),
                Rejected(2, "missing_key", "no key 'completion'"),
                Rejected(3, "missing_key", "no key 'prompt'; is the spec's key correct? available keys: []"),
                Rejected(
                    4,
                    "missing_key",
                    "no key 'prompt'; is the spec's key correct? available keys: ['Prompt', 'completion']",
                ),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def schema_drift() -> list[DropCase]:
    first = lines(*(jl({"prompt": f"q{i}", "completion": f"a{i}"}) for i in (1, 2, 3)))
    renamed = lines(*(jl({"prompt": f"q{i}", "response": f"a{i}"}) for i in (1, 2, 3)))
    missing = "no key 'completion'; is the spec's key correct? available keys: ['prompt', 'response']"
    return [
        DropCase(
            "drop1_2026-01.jsonl", first, lines_in=3, kept=tuple(Kept(i, turn(f"q{i}", f"a{i}")) for i in (1, 2, 3))
        ),
        DropCase(
            "drop2_2026-02.jsonl",
            renamed,
            lines_in=3,
            rejected=tuple(Rejected(i, "missing_key", missing) for i in (1, 2, 3)),
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


def check_schema_drift(run: CaseRun) -> None:
    first, second = run.drops["drop1_2026-01.jsonl"], run.drops["drop2_2026-02.jsonl"]
    assert first.stats.rejects_by_reason == {} and second.stats.rejects_by_reason == {"missing_key": 3}
    assert all(o.passed for o in first.gates.values())  # drop 1 is unaffected: every gate passes
    assert second.gates[ACCOUNTED].passed and not second.gates[REJECT_RATE].passed


def csv_ragged_rows() -> list[DropCase]:
    data = lines(b"id,text", b"1,alpha", b"2,beta,extra", b"3,gamma", b"4", b'5,"quoted, comma"')
    return [
        DropCase(
            "ragged.csv",
            data,
            lines_in=5,  # rows, the header excluded
            kept=(Kept(2, text("alpha")), Kept(4, text("gamma")), Kept(6, text("quoted, comma"))),
            rejected=(
                Rejected(3, "csv_field_count", "3 fields, the header has 2"),
                Rejected(5, "csv_field_count", "1 fields, the header has 2"),
            ),
            recount=5,  # Arrow counts the ragged rows too: the gate's count stays independent
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def check_csv_ragged_rows(run: CaseRun) -> None:
    rejects = run.drops["ragged.csv"].rejects
    assert [r["excerpt"] for r in rejects] == ["2,beta,extra", "4"]


REJECT_RATE_MAX = 0.25


def reject_rate_above_max() -> list[DropCase]:
    rows = [jl(text(f"line {i}")) if i not in (2, 5, 8) else b'{"text": "broken' for i in range(1, 11)]
    return [
        DropCase(
            "mostly_fine.jsonl",
            lines(*rows),
            lines_in=10,
            kept=tuple(Kept(i, text(f"line {i}")) for i in range(1, 11) if i not in (2, 5, 8)),
            rejected=tuple(Rejected(i, "malformed_json", "Unterminated string") for i in (2, 5, 8)),
            failed_gates=frozenset({REJECT_RATE}),
        )
    ]


def check_reject_rate_above_max(run: CaseRun) -> None:
    drop = run.drops["mostly_fine.jsonl"]
    rate = drop.gates[REJECT_RATE]
    assert rate.violations == 1
    assert rate.facts == {
        "reject_rate": 0.3,
        "max_reject_rate": REJECT_RATE_MAX,
        "rejects_by_reason": {"malformed_json": 3},
    }
    # the same bronze under a threshold equal to its rate passes: the gate fails only above the maximum
    looser = make_spec("ds", checks={"max_reject_rate": 0.3})
    assert {o.name: o.passed for o in evaluate(looser, run.paths, drop.partition, layer="bronze")} == {
        ACCOUNTED: True,
        REJECT_RATE: True,
        REQUIRED: True,
    }


def lone_surrogate_in_a_jsonl_value() -> list[DropCase]:
    good = [jl(text(f"good line {i}")) for i in range(1, 21)]
    data = lines(*good[:10], b'{"text": "a \\ud800 b"}', *good[10:])
    return [
        DropCase(
            "surrogate.jsonl",
            data,
            lines_in=21,
            kept=tuple(Kept(i if i <= 10 else i + 1, text(f"good line {i}")) for i in range(1, 21)),
            rejected=(
                Rejected(
                    11,
                    "invalid_unicode",
                    'lone surrogate \\ud800 (UTF-8 cannot encode it) in the string at $.text: "a \\ud800 b"',
                ),
            ),
        )
    ]


CANNOT = "(UTF-8 cannot encode it)"


def json_array(*elements: bytes) -> bytes:
    """A JSON array with one element per line, from line 2: each element starts its line."""
    return b"[\n" + b",\n".join(elements) + b"\n]\n"


def lone_surrogates_in_keys_values_and_arrays() -> list[DropCase]:
    jsonl = lines(
        b'{"\\udc00": "x", "text": "key"}',
        b'{"text": "low \\udc00 alone"}',
        b'{"text": "reversed \\udc00\\ud800"}',
        b'{"text": "pair \\ud83d\\ude00"}',
        b'{"text": "escaped backslash \\\\ud800"}',
        b'{"text": "ok", "meta": {"tags": ["a", "\\uDBFF"]}}',
        b'{"text": "fine"}',
    )
    array = json_array(
        b'{"text": "first"}', b'{"text": "\\ud800"}', b'{"\\udfff": 1, "text": "k"}', b'{"text": "last"}'
    )
    return [
        DropCase(
            "surrogates.jsonl",
            jsonl,
            lines_in=7,
            kept=(Kept(4, text("pair \U0001f600")), Kept(5, text("escaped backslash \\ud800")), Kept(7, text("fine"))),
            rejected=(
                Rejected(1, "invalid_unicode", f"lone surrogate \\udc00 {CANNOT} in a key at $"),
                Rejected(2, "invalid_unicode", f"\\udc00 {CANNOT} in the string at $.text"),
                Rejected(3, "invalid_unicode", f"\\udc00 {CANNOT} in the string at $.text"),
                Rejected(6, "invalid_unicode", f"\\udbff {CANNOT} in the string at $.meta.tags[1]"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "surrogates.json",
            array,
            lines_in=4,
            kept=(Kept(2, text("first")), Kept(5, text("last"))),
            rejected=(
                Rejected(3, "invalid_unicode", f"\\ud800 {CANNOT} in the string at $.text"),
                Rejected(4, "invalid_unicode", f"\\udfff {CANNOT} in a key at $"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


DEEP = 100_000


def nested_100000_levels() -> list[DropCase]:
    deep_array, deep_object = b"[" * DEEP + b"]" * DEEP, b'{"a": ' * DEEP + b"1" + b"}" * DEEP
    array = json_array(b'{"text": "before"}', deep_array, b'{"text": "after"}')
    unclosed = b'[\n{"text": "only"},\n' + b"[" * DEEP + b"\n]\n"
    jsonl = lines(b'{"text": "before"}', deep_object, b'{"text": "after"}')
    return [
        DropCase(
            "deep.json",
            array,
            lines_in=3,
            kept=(Kept(2, text("before")), Kept(4, text("after"))),
            rejected=(Rejected(3, "malformed_json", NESTING_TOO_DEEP),),
            recount=None,  # no parser counts the array's elements: the gate keeps the reader's count
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "deep_unclosed.json",
            unclosed,
            lines_in=2,
            kept=(Kept(2, text("only")),),
            rejected=(Rejected(3, "malformed_json", "the element never closes"),),
            recount=None,
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "deep.jsonl",
            jsonl,
            lines_in=3,
            kept=(Kept(1, text("before")), Kept(3, text("after"))),
            rejected=(Rejected(2, "malformed_json", NESTING_TOO_DEEP),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


def nest(levels: int) -> bytes:
    return b"[" * levels + b"1" + b"]" * levels


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


DEPTHS = (1, JSON_MAX_DEPTH, JSON_MAX_DEPTH + 1, 900, 990)  # a row {"a": ...} nested this many levels in all


def parquet_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def nesting_near_the_recursion_limit_tabular() -> list[DropCase]:
    rows = [b'{"a": ' + nest(d - 1) + b"}" for d in DEPTHS]
    kept = tuple(
        Kept(i, {"columns": ["a"], "values": [nested(d - 1)]}) for i, d in enumerate(DEPTHS, 1) if d <= JSON_MAX_DEPTH
    )
    rejected = tuple(
        Rejected(i, "malformed_json", NESTING_TOO_DEEP) for i, d in enumerate(DEPTHS, 1) if d > JSON_MAX_DEPTH
    )
    deep_list = pa.array([nested(40)])  # Arrow reads Parquet nested up to ~49 levels of lists
    return [
        DropCase(
            "depths.jsonl",
            lines(*rows),
            lines_in=len(DEPTHS),
            kept=kept,
            rejected=rejected,
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "depths.json",
            json_array(*rows),
            lines_in=len(DEPTHS),
            kept=tuple(Kept(k.line + 1, k.content) for k in kept),
            rejected=tuple(Rejected(r.line + 1, r.reason, r.detail) for r in rejected),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "depth_2000.json",
            json_array(b'{"a": 1}', b'{"a": ' + nest(1999) + b"}"),
            lines_in=2,
            kept=(Kept(2, {"columns": ["a"], "values": [1]}),),
            rejected=(Rejected(3, "malformed_json", NESTING_TOO_DEEP),),
            recount=None,  # json's recursion limit, orjson's 1024 levels: the gate keeps the reader's count
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "depth_40.parquet",
            parquet_bytes(pa.table({"a": deep_list})),
            lines_in=1,
            kept=(Kept(1, {"columns": ["a"], "values": [nested(40)]}),),
            stream=None,
        ),
    ]


def nesting_near_the_recursion_limit_text() -> list[DropCase]:
    depths = (JSON_MAX_DEPTH, JSON_MAX_DEPTH + 1, 900, 990, 2000)
    jsonl = lines(*(b'{"text": "t", "x": ' + nest(d - 1) + b"}" for d in depths))
    bracketed = "[" * 2000 + "]" * 2000
    return [
        DropCase(
            "depths_text.jsonl",
            jsonl,
            lines_in=len(depths),
            kept=(Kept(1, text("t")),),
            rejected=tuple(Rejected(i, "malformed_json", NESTING_TOO_DEEP) for i in range(2, 6)),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        # text and CSV cells are never parsed as JSON: brackets 2000 deep are text like any other
        DropCase("brackets.txt", lines(bracketed.encode()), lines_in=1, kept=(Kept(1, text(bracketed)),)),
        DropCase(
            "brackets.csv", lines(b"id,text", b"1," + bracketed.encode()), lines_in=1, kept=(Kept(2, text(bracketed)),)
        ),
    ]


def parquet_bytes_not_utf8() -> list[DropCase]:
    binary = pa.table(
        {
            "text": pa.array([b"valid binary text", b"bad \xff\xfe", "caf\u00e9 bin".encode()], pa.binary()),
            "n": [1, 2, 3],
        }
    )
    # a string column holding bytes that are not UTF-8 (Arrow writes what it is given)
    strings = pa.table({"text": pa.array([b"fine", b"sur \xed\xa0\x80"], pa.binary()).view(pa.string())})
    late = pa.table({"text": ["on time", "late"], "t": pa.array([0, -(2**62)], pa.timestamp("ms"))})
    twice = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "text"])
    return [
        DropCase(
            "binary.parquet",
            parquet_bytes(binary),
            lines_in=3,
            stream=None,
            kept=(Kept(1, text("valid binary text")), Kept(3, text("caf\u00e9 bin"))),
            rejected=(Rejected(2, "invalid_utf8", "column 'text': byte 4 of a binary value: invalid start"),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "string_not_utf8.parquet",
            parquet_bytes(strings),
            lines_in=2,
            stream=None,
            kept=(Kept(1, text("fine")),),
            rejected=(Rejected(2, "invalid_utf8", "column 'text': byte 4 of its text: invalid"),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "timestamp_out_of_range.parquet",
            parquet_bytes(late),
            lines_in=2,
            stream=None,
            kept=(Kept(1, text("on time")),),
            rejected=(Rejected(2, "unreadable_value", "column 't': OverflowError"),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "column_named_twice.parquet",
            parquet_bytes(twice),
            lines_in=2,
            stream=None,
            rejected=(
                Rejected(1, "duplicate_column", "names columns ['text'] more than once"),
                Rejected(2, "duplicate_column", "names columns ['text'] more than once"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


def check_parquet_bytes_not_utf8(run: CaseRun) -> None:
    reject = run.drops["binary.parquet"].rejects[0]
    assert reject["excerpt"] == "bad \\xff\\xfe"  # shown escaped in the reject, never trained as text
    assert all("\\x" not in r["content"] and "\\x" not in r["record"] for r in run.drops["binary.parquet"].records)


def csv_header_names_twice_or_unnamed() -> list[DropCase]:
    twice = lines(b"id,text,text", b"1,a,b", b"", b"2,c,d", b'3,"x', b'y",z')
    dup = "the header names ['text'] more than once"
    return [
        DropCase(
            "header_twice.csv",
            twice,
            lines_in=4,
            blank_lines=1,  # rows and the blank row, not the header
            rejected=(
                Rejected(2, "csv_duplicate_header", dup),
                Rejected(4, "csv_duplicate_header", dup),
                Rejected(5, "csv_duplicate_header", dup),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "header_unnamed.csv",
            lines(b"id,,text", b"1,x,a", b"2,y,b"),
            lines_in=2,
            rejected=(
                Rejected(2, "bad_csv_header", "header columns [2] have no name"),
                Rejected(3, "bad_csv_header", "header columns [2] have no name"),
            ),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "header_not_utf8.csv",
            lines(b"caf\xe9,text", b"1,a"),
            lines_in=1,
            rejected=(Rejected(2, "invalid_utf8", "the header line is not UTF-8"),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
    ]


def skip_reader_surrogate_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "unkeepable", lambda *_args: None)


def writer_refusal_past_the_readers() -> list[DropCase]:
    good = [jl(text(f"good line {i}")) for i in range(1, 21)]
    data = lines(*good[:5], b'{"text": "a \\ud800 b"}', *good[5:])
    return [
        DropCase(
            "past_the_reader.jsonl",
            data,
            lines_in=21,
            kept=tuple(Kept(i if i <= 5 else i + 1, text(f"good line {i}")) for i in range(1, 21)),
            rejected=(Rejected(6, "invalid_unicode", "content: lone surrogate \\ud800"),),
        )
    ]


BIG = 2**64


def nul_bytes_and_integers_beyond_int64() -> list[DropCase]:
    jsonl = lines(
        b'{"a": %d, "s": "nul \\u0000 inside"}' % BIG,
        b'{"a": %d, "s": "x"}' % -(10**30),
        b'{"a": ' + b"9" * 5000 + b', "s": "y"}',
    )
    table = pa.table({"a": pa.array([BIG - 1], pa.uint64()), "s": ["nul \x00 byte"]})
    return [
        DropCase(
            "big.jsonl",
            jsonl,
            lines_in=3,
            kept=(
                Kept(1, {"columns": ["a", "s"], "values": [BIG, "nul \x00 inside"]}),
                Kept(2, {"columns": ["a", "s"], "values": [-(10**30), "x"]}),
            ),
            rejected=(Rejected(3, "malformed_json", "a number with more than 4300 digits"),),
            failed_gates=frozenset({REJECT_RATE}),
        ),
        DropCase(
            "big.parquet",
            parquet_bytes(table),
            lines_in=1,
            stream=None,
            kept=(Kept(1, {"columns": ["a", "s"], "values": [BIG - 1, "nul \x00 byte"]}),),
        ),
    ]


CASES: list[Case] = [
    Case("malformed_json_line", malformed_json),
    Case("invalid_utf8_rejected_never_replaced", invalid_utf8, check=check_invalid_utf8),
    Case("utf8_bom_stripped_on_line_1_only_line_2_bom_rejected", utf8_bom, check=check_bom),
    Case("crlf_line_endings", crlf, check=check_crlf),
    Case("lone_cr_inside_a_line_never_splits", lone_cr),
    Case("u2028_u2029_nel_inside_json_strings_kept", unicode_line_separators, check=check_unicode_line_separators),
    Case("nan_infinity_minus_infinity_literals_rejected", nan_infinity),
    Case(
        "number_literal_1e400_overflowing_to_infinity_rejected",
        number_overflowing_to_infinity,
        sections={"input": {"type": "tabular"}},
    ),
    Case(
        "single_line_of_100_mib_line_too_long_bounded_memory",
        line_of_100_mib,
        check=check_line_of_100_mib,
        in_subprocess=True,
    ),
    Case("empty_file_zero_records_gates_pass", empty_file, check=check_empty_file),
    Case("truncated_jsonl_gz", truncated_gzip),
    Case("gzip_bomb_1_gib_without_newline_bounded_memory", gzip_bomb, check=check_gzip_bomb, in_subprocess=True),
    Case("wrong_type_text_is_list", wrong_type_text_is_list),
    Case("wrong_type_prompt_is_int", wrong_type_prompt_is_int, sections=INSTRUCTION),
    Case("wrong_type_messages_is_string", wrong_type_messages_is_string, sections={"input": {"type": "chat"}}),
    Case("null_text_never_stored_as_none", null_text),
    Case(
        "null_completion_never_stored_as_none",
        null_completion,
        sections={
            "input": {"type": "instruction", "prompt_key": ["instruction", "input"], "completion_key": "output"}
        },
    ),
    Case("missing_keys_reason_names_the_key", missing_keys, sections=INSTRUCTION),
    Case("schema_drift_second_drop_renames_completion", schema_drift, sections=INSTRUCTION, check=check_schema_drift),
    Case("csv_ragged_rows_rejected_reading_resumes", csv_ragged_rows, check=check_csv_ragged_rows),
    Case(
        "reject_rate_above_max_fails_gate_accounting_passes",
        reject_rate_above_max,
        sections={"checks": {"max_reject_rate": REJECT_RATE_MAX}},
        check=check_reject_rate_above_max,
    ),
    Case("lone_surrogate_escape_in_a_jsonl_value_rejected_the_20_good_lines_kept", lone_surrogate_in_a_jsonl_value),
    Case(
        "lone_surrogates_in_keys_values_nested_and_json_arrays_rejected_pairs_and_escaped_backslash_kept",
        lone_surrogates_in_keys_values_and_arrays,
    ),
    Case("json_array_element_nested_100000_levels_rejected_like_jsonl_next_elements_kept", nested_100000_levels),
    Case(
        "nesting_1_128_129_900_990_2000_levels_tabular_jsonl_json_parquet_limit_128",
        nesting_near_the_recursion_limit_tabular,
        sections=TABULAR,
    ),
    Case(
        "nesting_128_to_2000_levels_text_jsonl_rejected_txt_and_csv_brackets_are_text",
        nesting_near_the_recursion_limit_text,
    ),
    Case(
        "parquet_binary_and_string_not_utf8_timestamp_out_of_range_column_twice_rejected",
        parquet_bytes_not_utf8,
        check=check_parquet_bytes_not_utf8,
    ),
    Case("csv_header_name_twice_unnamed_or_not_utf8_every_data_row_rejected", csv_header_names_twice_or_unnamed),
    Case(
        "surrogate_past_the_readers_refused_by_the_writer_is_that_records_reject",
        writer_refusal_past_the_readers,
        patch=skip_reader_surrogate_check,
    ),
    Case(
        "nul_bytes_and_integers_beyond_int64_kept_exactly_5000_digits_rejected",
        nul_bytes_and_integers_beyond_int64,
        sections=TABULAR,
    ),
]


def _param(case: Case) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=case.known_bug)] if case.known_bug else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = RESULTS[case.id] = CaseResult(known_bug=case.known_bug is not None)
    start = time.perf_counter()
    if case.patch is not None:
        case.patch(monkeypatch)
    drops = case.make()
    name = "ds"
    spec = make_spec(name, **case.sections)
    data_dir = write_dataset(
        tmp_path,
        name,
        {"input": {"type": "text"}, "tokenizer": {"path": "/nonexistent"}, **case.sections},
        {d.file: d.data for d in drops},
    )
    paths = dataset_paths(data_dir, name)
    new, notes = register_drops(paths)
    assert sorted(d.file for d in new) == sorted(d.file for d in drops) and not notes

    child: dict[str, Any] | None = None
    if case.in_subprocess:
        child = build_in_subprocess(data_dir, name, case.sections)
        snapshots: dict[str, dict[str, str]] = child["snapshots"]
    else:
        snapshots = guarded("bronze", lambda: build_bronze(spec, paths))
    partitions = {d.file: d.partition for d in registered_drops(paths).values()}
    runs = {d.file: guarded("bronze gates", lambda d=d: observe(spec, paths, partitions[d.file])) for d in drops}
    result.unaccounted = sum(r.gates[ACCOUNTED].violations for r in runs.values())
    result.records = sum(len(r.records) for r in runs.values())
    result.rejects = sum(len(r.rejects) for r in runs.values())

    for partition, digests in snapshots.items():  # building a later drop never changed an earlier drop's bronze
        assert bronze_digests(paths, partition) == digests, partition
    for exp in drops:
        check_drop(exp, runs[exp.file])
    if case.check is not None:
        case.check(CaseRun(spec, paths, runs, child))
    result.seconds = time.perf_counter() - start
    result.correct = True


def test_summary_every_case_ran_and_was_correct(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last (pytest keeps file order): the cases' own records, summed."""
    missing = [c.id for c in CASES if c.id not in RESULTS]
    assert not missing, f"cases that did not run: {missing}"
    known = {c.id for c in CASES if c.known_bug}
    correct = sum(r.correct for r in RESULTS.values())
    unknown = [i for i, r in RESULTS.items() if r.unaccounted is None]
    unaccounted = sum(r.unaccounted or 0 for r in RESULTS.values())
    with capsys.disabled():
        print(f"\nbad input: {len(CASES)} cases, {correct} correct, {unaccounted} records unaccounted")
    assert not unknown, f"cases whose accounting was never measured: {unknown}"
    assert unaccounted == 0
    wrong = [i for i, r in RESULTS.items() if not r.correct and i not in known]
    assert not wrong, f"cases with a wrong outcome: {wrong}"
    assert not [i for i in known if RESULTS[i].correct], "a known bug is fixed: remove its xfail"
