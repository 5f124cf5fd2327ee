"""Adversarial input, end to end through every layer: each generated case runs the real core builders (bronze,
silver, gold, shards) and every gate the Dagster checks run, and asserts its exact outcome: the rejects by layer
and reason, the gates that fail, and that every record is accounted for at every layer (the three accounting
gates). Spec cases assert that a broken spec or path is a clear error naming the file and key. The last test
prints `adversarial: N cases, N correct, 0 records unaccounted`.
"""

from __future__ import annotations

import json
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prep_assets.core.build import build_partition
from prep_assets.core.drops import register_drops, registered_drops
from prep_assets.core.errors import SpecError
from prep_assets.core.gates import gates_for, outcomes
from prep_assets.core.gold import build_tokenizer
from prep_assets.core.lake import DatasetPaths, dataset_paths
from prep_assets.core.manifest import build_manifest
from prep_assets.core.spec import DatasetSpec, load_spec, parse_spec
from prep_assets_tests.conftest import SAMPLE_DATA

ACCOUNTING = ("raw_records_accounted", "clean_records_accounted", "tokenized_examples_accounted")
LAYERS = ("bronze", "silver", "gold")


@dataclass(frozen=True)
class CaseRun:
    spec: DatasetSpec
    paths: DatasetPaths
    data_dir: Path
    rejects: dict[str, list[dict[str, Any]]]  # layer -> reject rows of every drop
    gold: list[dict[str, Any]]  # gold examples of every drop
    silver: list[dict[str, Any]]
    failed: set[str]


@dataclass(frozen=True)
class Case:
    id: str
    sections: dict[str, Any]  # spec sections; "tokenizer" defaults to the module's trained tokenizer
    files: dict[str, bytes]
    rejects: dict[str, dict[str, int]] = field(default_factory=dict)  # layer -> reason -> count (else none)
    failed: frozenset[str] = frozenset()
    check: Callable[[CaseRun], bool | None] | None = None  # asserts, or returns False when wrong


@dataclass(frozen=True)
class SpecCase:
    id: str
    text: str  # the spec file's YAML
    error: str | None  # a fragment the load error must hold (None: loads)


@dataclass
class Result:
    correct: bool = False
    unaccounted: int | None = None


RESULTS: dict[str, Result] = {}


def jl(*values: Any) -> bytes:
    return b"".join(json.dumps(v).encode() + b"\n" for v in values)


def turn(prompt: str, completion: str) -> dict[str, str]:
    return {"prompt": prompt, "completion": completion}


def chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


INSTRUCTION = {"input": {"type": "instruction"}}
CHAT = {"input": {"type": "chat"}}
TEXT = {"input": {"type": "text"}}


# ---------------------------------------------------------------- checks of single cases


def gold_texts(run: CaseRun) -> list[str]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(run.paths.tokenizer_dir / "tokenizer.json"))
    return [tok.decode(g["token_ids"]) for g in sorted(run.gold, key=lambda g: g["source_line"])]


def gold_is_prefix_prompt_postfix_completion(run: CaseRun) -> None:
    """The decoded gold text of every example is exactly its silver fields joined (cleaning never glued them)."""
    prefix, postfix = run.spec.input.prompt_prefix, run.spec.input.prompt_postfix
    expected = []
    for rec in sorted(run.silver, key=lambda r: r["source_line"]):
        turns = json.loads(rec["content"])["turns"]
        expected.append("".join(prefix + t["prompt"] + postfix + t["completion"] + "<|endoftext|>" for t in turns))
    assert gold_texts(run) == expected


def separators_survive(*pairs: tuple[str, str]) -> Callable[[CaseRun], None]:
    def check(run: CaseRun) -> None:
        gold_is_prefix_prompt_postfix_completion(run)
        texts = gold_texts(run)
        for (prompt, completion), text in zip(pairs, texts, strict=True):
            assert prompt.rstrip(" \t\n") + completion.strip() not in text or not prompt[-1:].isspace(), text

    return check


def kept_lines(*lines: int) -> Callable[[CaseRun], None]:
    def check(run: CaseRun) -> None:
        assert sorted(r["source_line"] for r in run.silver) == list(lines)

    return check


def reject_detail(layer: str, fragment: str) -> Callable[[CaseRun], None]:
    def check(run: CaseRun) -> None:
        assert any(fragment in (r["detail"] or "") for r in run.rejects[layer]), run.rejects[layer]

    return check


def every(*checks: Callable[[CaseRun], None]) -> Callable[[CaseRun], None]:
    def check(run: CaseRun) -> None:
        for c in checks:
            c(run)

    return check


# ---------------------------------------------------------------- the cases


def cleaning_cases() -> list[Case]:
    glued = [("Q: 2+2=\n", "4"), ("...or maybe? ", "Yes"), ("Translate:\t", "Bonjour"), ("Say it\r\n", "it")]
    return [
        Case(
            "prompt_ending_in_newline_keeps_it",
            INSTRUCTION,
            {"a.jsonl": jl(turn(*glued[0]))},
            check=separators_survive(glued[0]),
        ),
        Case(
            "prompt_ending_in_space_keeps_it",
            INSTRUCTION,
            {"a.jsonl": jl(turn(*glued[1]))},
            check=separators_survive(glued[1]),
        ),
        Case(
            "prompt_ending_in_tab_keeps_it",
            INSTRUCTION,
            {"a.jsonl": jl(turn(*glued[2]))},
            check=separators_survive(glued[2]),
        ),
        Case(
            "prompt_ending_in_crlf_keeps_a_newline",
            INSTRUCTION,
            {"a.jsonl": jl(turn(*glued[3]))},
            check=gold_is_prefix_prompt_postfix_completion,
        ),
        Case(
            "dialogue_turns_keep_their_separators",
            INSTRUCTION,
            {"a.jsonl": jl([turn("Q1: \n", "A1"), turn("Q2:  ", " A2")])},
            check=gold_is_prefix_prompt_postfix_completion,
        ),
        Case(
            "prefix_and_postfix_join_exactly",
            {"input": {"type": "instruction", "prompt_prefix": "### Q ", "prompt_postfix": " ### A "}},
            {"a.jsonl": jl(turn("why? ", "because"))},
            check=gold_is_prefix_prompt_postfix_completion,
        ),
        Case(
            "whitespace_only_completion_is_rejected",
            INSTRUCTION,
            {"a.jsonl": jl(turn("q", " \n\t"), turn("q2", "fine"))},
            {"silver": {"empty_completion": 1}},
            check=kept_lines(2),
        ),
        Case(
            "whitespace_only_assistant_turn_is_rejected",
            CHAT,
            {"a.jsonl": jl(chat(("user", "hi"), ("assistant", "  \n")), chat(("user", "hi"), ("assistant", "ok")))},
            {"silver": {"empty_completion": 1}},
            check=every(kept_lines(2), reject_detail("silver", "messages[1] (assistant)")),
        ),
        Case(
            "empty_assistant_turn_kept_when_the_spec_opts_in",
            {**CHAT, "clean": {"keep_empty_turns": True}},
            {"a.jsonl": jl(chat(("user", "hi"), ("assistant", "")), chat(("user", "yo"), ("assistant", "ok")))},
            check=kept_lines(1, 2),
        ),
        Case(
            "empty_masked_turn_is_kept",
            CHAT,
            {"a.jsonl": jl(chat(("user", " "), ("assistant", "an answer")))},
            check=kept_lines(1),
        ),
        Case(
            "whitespace_only_preference_branch_is_rejected",
            {"input": {"type": "preference"}, "sequence": {"max_seq_len": 256}},
            {
                "a.jsonl": jl(
                    {"prompt": "q", "chosen": "  ", "rejected": "no"},
                    {"prompt": "q2", "chosen": "yes", "rejected": "no"},
                )
            },
            {"silver": {"empty_completion": 1}},
            check=kept_lines(2),
        ),
        Case(
            "half_the_records_rejected_in_gold_fails_the_gold_gate",
            {**INSTRUCTION, "sequence": {"max_seq_len": 64}},
            {
                "a.jsonl": jl(
                    turn("q", "short"),
                    turn("q" * 400, "too long for a row"),
                    turn("q2", "fine"),
                    turn("w " * 300, "long too"),
                )
            },
            {"gold": {"too_long": 2}},
            frozenset({"tokenized_examples_reject_rate"}),
        ),
        Case(
            "text_keeps_inner_lines_and_loses_trailing_spaces",
            TEXT,
            {"a.jsonl": jl({"text": "line one  \nline two \t\n\n"})},
            check=lambda run: gold_texts(run) == ["line one\nline two<|endoftext|>"],
        ),
    ]


def reading_cases() -> list[Case]:
    deep = b"[" * 100_000 + b"]" * 100_000
    good = [{"text": f"a good line number {i}"} for i in range(20)]
    bad_utf8 = pa.table({"text": pa.array([b"fine text", b"bad \xff\xfe", b"more fine text"], pa.binary())})
    return [
        Case(
            "lone_surrogate_in_a_value_loses_only_its_line",
            TEXT,
            {"a.jsonl": jl(*good[:10]) + b'{"text": "a \\ud800 b"}\n' + jl(*good[10:])},
            {"bronze": {"invalid_unicode": 1}},  # 1 of 21 lines: under the 5% reject rate
            check=every(kept_lines(*range(1, 11), *range(12, 22)), reject_detail("bronze", "\\ud800")),
        ),
        Case(
            "lone_surrogate_in_a_key_loses_only_its_line",
            TEXT,
            {"a.jsonl": jl(*good) + b'{"text": "ok", "\\udfff": 1}\n'},
            {"bronze": {"invalid_unicode": 1}},
            check=kept_lines(*range(1, 21)),
        ),
        Case(
            "deep_nesting_in_a_json_array_is_one_reject",
            TEXT,
            {"a.json": b"[" + b",".join(json.dumps(g).encode() for g in good) + b"," + deep + b"]"},
            {"bronze": {"malformed_json": 1}},
            check=reject_detail("bronze", "nesting too deep"),
        ),
        Case(
            "deep_nesting_in_jsonl_is_one_reject",
            TEXT,
            {"a.jsonl": jl(*good) + deep + b"\n"},
            {"bronze": {"malformed_json": 1}},
        ),
        Case(
            "invalid_utf8_in_a_parquet_binary_column_is_rejected_never_escaped",
            TEXT,
            {"a.parquet": parquet_bytes(bad_utf8)},
            {"bronze": {"invalid_utf8": 1}},
            frozenset({"raw_records_reject_rate"}),
            check=lambda run: (
                sorted(json.loads(r["content"])["text"] for r in run.silver) == ["fine text", "more fine text"]
            ),
        ),
        Case(
            "lone_surrogate_in_a_json_array_element_loses_only_that_element",
            TEXT,
            {"a.json": b"[" + b",".join(json.dumps(g).encode() for g in good) + b', {"text": "x \\udc80"}]'},
            {"bronze": {"invalid_unicode": 1}},
            check=lambda run: len(run.silver) == 20,
        ),  # all on line 1
        Case(
            "drop_whose_name_is_not_utf8_is_refused_and_the_others_still_run",
            TEXT,
            {"caf\udce9.jsonl": jl(*good), "ok.jsonl": jl(*good[:3])},
            check=lambda run: sorted({r["source_file"] for r in run.silver}) == ["ok.jsonl"],
        ),
        Case(
            "csv_with_a_duplicate_header_counts_every_data_row",
            TEXT,
            {"a.csv": b"text,text\na,b\nc,d\n\ne,f\n"},
            {"bronze": {"csv_duplicate_header": 3}},
            frozenset({"raw_records_reject_rate"}),
        ),
    ]


NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_cases() -> list[Case]:
    tools = [{"name": "get_weather", "description": "the weather", "parameters": {"type": "object"}}]
    hanging = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + NO_TOOLS_TEMPLATE
    huge = "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}" + NO_TOOLS_TEMPLATE
    two = jl(chat(("user", "hi"), ("assistant", "hello there")), chat(("user", "yo"), ("assistant", "hey")))
    return [
        Case(
            "template_that_hangs_is_stopped_and_its_record_rejected",
            {**CHAT, "tokenizer": {"chat_template": hanging, "chat_template_file": None}},
            {"a.jsonl": jl(chat(("user", "hi"), ("assistant", "hello")))},
            {"gold": {"chat_template_error": 1}},
            frozenset({"tokenized_examples_reject_rate"}),
            check=reject_detail("gold", "time limit"),
        ),
        Case(
            "template_that_writes_megabytes_is_refused",
            {**CHAT, "tokenizer": {"chat_template": huge, "chat_template_file": None}},
            {"a.jsonl": jl(chat(("user", "hi"), ("assistant", "hello")))},
            {"gold": {"chat_template_error": 1}},
            frozenset({"tokenized_examples_reject_rate"}),
            check=reject_detail("gold", "size limit"),
        ),
        Case(
            "template_ignoring_tools_rejects_the_records_that_have_them",
            {**CHAT, "tokenizer": {"chat_template": NO_TOOLS_TEMPLATE, "chat_template_file": None}},
            {"a.jsonl": two + jl(chat(("user", "weather?"), ("assistant", "sunny"), tools=tools))},
            {"gold": {"chat_template_dropped_tools": 1}},
            frozenset({"tokenized_examples_reject_rate"}),
            check=reject_detail("gold", "get_weather"),
        ),
        Case(
            "template_rendering_tools_keeps_them",
            {**CHAT, "sequence": {"max_seq_len": 512}},
            {"a.jsonl": jl(chat(("user", "weather?"), ("assistant", "sunny"), tools=tools))},
        ),
        Case(
            "assistant_content_led_by_newlines_is_kept_with_its_newlines",
            CHAT,
            {
                "a.jsonl": jl(
                    chat(("user", "hi"), ("assistant", "\n\nhello")), chat(("user", "a"), ("assistant", " b"))
                )
            },
            check=lambda run: len(run.gold) == 2,
        ),
    ]


def record_order(*lines: int) -> Callable[[CaseRun], None]:
    """The records of the one gold example, in order, are the drop's data rows at these lines."""

    def check(run: CaseRun) -> None:
        line_of = {r["record_id"]: r["source_line"] for r in run.silver}
        assert [[line_of[i] for i in g["record_ids"]] for g in run.gold] == [list(lines)]

    return check


def groups(*names: str) -> Callable[[CaseRun], None]:
    def check(run: CaseRun) -> None:
        assert sorted(k for g in run.gold for k in g["group_keys"]) == sorted(names)

    return check


def tabular_cases() -> list[Case]:
    grouped = {
        "input": {"type": "tabular"},
        "tabular": {"group_by": "dev", "order_by": "t"},
        "sequence": {"max_seq_len": 512},
        "packing": {"max_sequences_per_example": 1},
    }
    csv = lambda *rows: ("dev,t,v\n" + "".join(f"{r}\n" for r in rows)).encode()  # noqa: E731
    return [
        Case(
            "order_by_m_d_yyyy_is_chronological_not_textual",
            grouped,
            {"a.csv": csv("A,1/10/2024 00:00,2", "A,1/9/2024 22:00,1", "A,12/31/2023 23:59,0")},
            check=record_order(4, 3, 2),
        ),
        Case(
            "order_by_integers_is_numeric_not_textual",
            grouped,
            {"a.csv": csv("A,10,b", "A,9,a", "A,100,c")},
            check=record_order(3, 2, 4),
        ),
        Case(
            "order_by_epoch_ms_is_chronological",
            grouped,
            {"a.csv": csv("A,1700000000500,b", "A,1700000000000,a", "A,1699999999999,z")},
            check=record_order(4, 3, 2),
        ),
        Case(
            "order_by_iso_with_zones_compares_instants",
            grouped,
            {"a.csv": csv("A,2024-01-01T10:00:00+02:00,b", "A,2024-01-01T09:30:00Z,c", "A,2024-01-01T07:00Z,a")},
            check=record_order(4, 2, 3),
        ),
        Case(
            "order_by_unreadable_value_is_a_gold_reject",
            grouped,
            {"a.csv": csv("A,1/9/2024 22:00,1", "A,not a date,2", "A,1/10/2024 00:00,3")},
            {"gold": {"unorderable_value": 1}},
            frozenset({"tokenized_examples_reject_rate"}),  # 1 of 3
            check=every(record_order(2, 4), reject_detail("gold", "not a date")),
        ),
        Case(
            "empty_group_key_is_a_bronze_reject_not_a_group",
            grouped,
            {"a.csv": csv("A,1,x", ",2,y", "A,3,z")},
            {"bronze": {"empty_group_key": 1}},
            frozenset({"raw_records_reject_rate"}),
            check=groups("A"),
        ),  # 1 of 3 rows > 5%: blocking
        Case(
            "literal_null_group_is_a_group_and_never_merges_with_an_empty_cell",
            grouped,
            {"a.csv": csv("null,1,x", ",2,y", "null,3,z")},
            {"bronze": {"empty_group_key": 1}},
            frozenset({"raw_records_reject_rate"}),
            check=groups("null"),
        ),
    ]


def spec_cases() -> list[SpecCase]:
    tok = "tokenizer: {path: tok}"
    return [
        SpecCase(
            "spec_typo_names_file_and_key", f"input: {{type: text, colour: red}}\n{tok}\n", "input.colour: unknown key"
        ),
        SpecCase(
            "spec_missing_tokenizer_path",
            "input: {type: text}\ntokenizer: {path: missing_dir}\n",
            "tokenizer.path: 'missing_dir' is not a directory",
        ),
        SpecCase(
            "spec_template_leaving_the_data_dir",
            "input: {type: chat}\ntokenizer: {path: tok, chat_template_file: ../../../../etc/passwd}\n",
            "leaves the data dir",
        ),
        SpecCase(
            "spec_template_via_dotdot_inside_path",
            "input: {type: chat}\ntokenizer: {path: tok, chat_template_file: tok/../../outside.jinja}\n",
            "leaves the data dir",
        ),
        SpecCase(
            "spec_training_files_matching_nothing",
            "input: {type: text}\ntokenizer: {train: {files: [corpus/none-*.txt]}}\n",
            "matches no file",
        ),
        SpecCase("spec_not_a_mapping", "- just\n- a list\n", "must be a mapping"),
        SpecCase("spec_invalid_yaml", "input: {type: text\n", "not valid YAML"),
        SpecCase("spec_not_utf8", "input: {type: text}\n# caf\udce9\n", "not valid YAML"),
        SpecCase("spec_absolute_paths_are_allowed", "input: {type: text}\ntokenizer: {path: ABS_TOK}\n", None),
    ]


CASES: list[Case] = cleaning_cases() + reading_cases() + tabular_cases() + chat_cases()
SPEC_CASES: list[SpecCase] = spec_cases()


# ---------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample datasets' byte-level BPE, trained once (offline) and pinned: every case's tokenizer."""
    data = tmp_path_factory.mktemp("tokenizer")
    shutil.copytree(SAMPLE_DATA / "corpus", data / "corpus")
    spec = parse_spec(
        {
            "input": {"type": "text"},
            "tokenizer": {"train": {"files": ["corpus/*.txt", "corpus/chat/*.txt"], "vocab_size": 1024}},
        },
        path=Path("t.yaml"),
        default_name="t",
    )
    paths = dataset_paths(data, "t")
    build_tokenizer(spec, paths, data)
    return paths.tokenizer_dir


def _rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist() if path.is_file() else []


def run_case(case: Case, data_dir: Path, tokenizer: Path) -> CaseRun:
    # tiny drops: short rows, and no utilization floor (a one-record drop cannot fill a row)
    sections = {"sequence": {"max_seq_len": 64}, "checks": {"min_sequence_utilization": 0}, **case.sections}
    tok = {"path": str(tokenizer)}
    if sections["input"]["type"] in ("chat", "preference"):
        tok["chat_template_file"] = str(SAMPLE_DATA / "templates" / "chatml.jinja")
    sections["tokenizer"] = {k: v for k, v in {**tok, **sections.get("tokenizer", {})}.items() if v is not None}
    (data_dir / "datasets").mkdir(parents=True)
    (data_dir / "datasets" / "adv.yaml").write_text(yaml.safe_dump(sections), encoding="utf-8")
    raw = data_dir / "raw" / "adv"
    raw.mkdir(parents=True)
    for name, data in case.files.items():
        (raw / name).write_bytes(data)  # a name with surrogate escapes is written as the bytes they stand for
    spec = load_spec(data_dir / "datasets" / "adv.yaml")
    paths = dataset_paths(data_dir, "adv")
    register_drops(paths)
    build_tokenizer(spec, paths, data_dir)
    rejects: dict[str, list[dict[str, Any]]] = {layer: [] for layer in LAYERS}
    gold: list[dict[str, Any]] = []
    silver: list[dict[str, Any]] = []
    failed: set[str] = set()
    unaccounted = 0
    for key in sorted(registered_drops(paths)):
        build_partition(spec, paths, key)
        b, s, g = (paths.partition_dir(x, key) for x in ("bronze", "silver", "gold"))
        for gate, outcome in outcomes(spec, paths, key, gates_for(spec)):
            if isinstance(outcome, Exception):
                raise AssertionError(f"gate {gate.name} raised: {outcome!r}")
            if not outcome.passed:
                failed.add(gate.name)
            if gate.name in ACCOUNTING:
                unaccounted += outcome.violations
        for layer, d in zip(LAYERS, (b, s, g), strict=True):
            rejects[layer] += _rows(d / "rejects.parquet")
        silver += _rows(s / "records.parquet")
        gold += _rows(g / "examples.parquet")
    build_manifest(spec, paths, sorted(registered_drops(paths)))
    RESULTS[case.id].unaccounted = unaccounted
    return CaseRun(spec, paths, data_dir, rejects, gold, silver, failed)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adversarial(case: Case, tmp_path: Path, trained_tokenizer: Path) -> None:
    RESULTS[case.id] = Result()
    try:
        run = run_case(case, tmp_path / "data", trained_tokenizer)
    except Exception as exc:  # noqa: BLE001 - a traceback is itself the failure this suite looks for
        raise AssertionError(f"{case.id}: raised {exc!r}\n{traceback.format_exc()}") from None
    for layer in LAYERS:
        got = dict(Counter(r["reason"] for r in run.rejects[layer]))
        assert got == case.rejects.get(layer, {}), (layer, run.rejects[layer])
    assert run.failed == set(case.failed)
    if case.check is not None:
        assert case.check(run) is not False, f"{case.id}: its check"  # a check asserts, or returns a bool
    RESULTS[case.id].correct = True


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c.id for c in SPEC_CASES])
def test_adversarial_spec(case: SpecCase, tmp_path: Path) -> None:
    RESULTS[case.id] = Result(unaccounted=0)  # no records: a spec that does not load reads none
    (tmp_path / "datasets").mkdir()
    (tmp_path / "tok").mkdir()
    shutil.copytree(SAMPLE_DATA / "corpus", tmp_path / "corpus")
    path = tmp_path / "datasets" / "x.yaml"
    path.write_bytes(case.text.replace("ABS_TOK", str(tmp_path / "tok")).encode("utf-8", "surrogateescape"))
    if case.error is None:
        load_spec(path)
    else:
        with pytest.raises(SpecError) as err:
            load_spec(path)
        assert case.error in str(err.value) and str(path) in str(err.value), str(err.value)
    RESULTS[case.id].correct = True


def test_summary_every_case_ran_and_was_correct(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last (pytest keeps file order): the cases' own records, summed."""
    ids = [c.id for c in CASES] + [c.id for c in SPEC_CASES]
    missing = [i for i in ids if i not in RESULTS]
    if len(missing) == len(ids):
        pytest.skip("no case ran (deselected)")
    correct = sum(r.correct for r in RESULTS.values())
    unaccounted = sum(r.unaccounted or 0 for r in RESULTS.values())
    with capsys.disabled():
        print(f"\nadversarial: {len(ids)} cases, {correct} correct, {unaccounted} records unaccounted")
    assert not missing, f"cases that did not run: {missing}"
    assert unaccounted == 0 and correct == len(ids)
