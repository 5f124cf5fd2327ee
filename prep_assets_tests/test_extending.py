"""The worked examples of docs/extending.md, executed as written: each registers its extension, uses it
through the real layers, and takes it out of the registry again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prep_assets.core import formats
from prep_assets.core.errors import SpecError
from prep_assets.core.lake import read_json, sha256_file
from prep_assets_tests.conftest import PROJECT, SAMPLE_DATA, make_spec

DOC = PROJECT / "docs" / "extending.md"


def run_layers(data_dir: Path, spec, files: dict[str, bytes]) -> dict:
    """Every layer of one drop through the core builders, with the sample's trained tokenizer."""
    import shutil

    import pyarrow.parquet as pq

    from prep_assets.core.build import build_partition
    from prep_assets.core.drops import register_drops
    from prep_assets.core.gold import build_tokenizer
    from prep_assets.core.lake import dataset_paths
    from prep_assets.core.manifest import build_manifest
    from prep_assets.core.spec import parse_spec

    shutil.copytree(SAMPLE_DATA / "corpus", data_dir / "corpus")
    tok = parse_spec(
        {"input": {"type": "text"}, "tokenizer": {"train": {"files": ["corpus/*.txt"], "vocab_size": 512}}},
        path=Path("t.yaml"),
        default_name="t",
    )
    spec = spec.model_copy(update={"tokenizer": tok.tokenizer})
    paths = dataset_paths(data_dir, spec.name)
    paths.raw_dir.mkdir(parents=True)
    for name, data in files.items():
        (paths.raw_dir / name).write_bytes(data)
    (drop,), _ = register_drops(paths)
    build_tokenizer(spec, paths, data_dir)
    key = drop.partition
    build_partition(spec, paths, key)
    shards = paths.partition_dir("shards", key)
    build_manifest(spec, paths, [key])
    parts = sorted((shards / "train").glob("part-*.parquet"))
    silver = pq.read_table(paths.partition_dir("silver", key) / "records.parquet").to_pylist()
    return {
        "shards": shards,
        "manifest": paths.manifest_path,
        "partition": key,
        "record_ids": [r["record_id"] for r in sorted(silver, key=lambda r: r["source_line"])],
        "shard_rows": [r for p in parts for r in pq.read_table(p).to_pylist()],
    }


def example(section: str) -> str:
    """The python code block of one `## ` section of docs/extending.md."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    return code


def registered(section: str, registry: dict):
    """Run a section's example (which registers its extension in `registry`), yield its names, then put the
    registry back as it was."""
    before = dict(registry)
    namespace: dict = {}
    exec(compile(example(section), str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    yield namespace
    registry.clear()
    registry.update(before)


@pytest.fixture
def registered_format():
    yield from registered("Add an output format", formats.FORMATS)


def test_the_output_format_example_writes_every_row_with_labels_and_is_listed_in_the_manifest(
    registered_format, tmp_path: Path
):
    lines = b"".join(json.dumps({"prompt": f"q{i} ", "completion": f"answer {i}"}).encode() + b"\n" for i in range(9))
    spec = make_spec(
        "ext",
        input={"type": "instruction"},
        sequence={"max_seq_len": 64},
        output={"formats": ["parquet", "jsonl_rows"]},
        checks={"min_sequence_utilization": 0},
    )
    run = run_layers(tmp_path, spec, {"a.jsonl": lines})
    stats = read_json(run["shards"] / "stats.json")
    entry = stats["splits"]["train"]["exports"]["jsonl_rows"]
    path = run["shards"] / entry["files"][0]["path"]
    assert sha256_file(path) == entry["files"][0]["sha256"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    shards = run["shard_rows"]
    assert [r["input_ids"] for r in rows] == [s["input_ids"] for s in shards]
    assert [r["labels"] for r in rows] == [
        [t if m else -100 for t, m in zip(s["input_ids"], s["loss_mask"])] for s in shards
    ]
    manifest = read_json(run["manifest"])
    listed = manifest["splits"]["train"]["exports"]
    assert [e["format"] for e in listed] == ["jsonl_rows"]


def test_a_format_refuses_at_spec_load_what_it_cannot_represent(registered_format):
    with pytest.raises(SpecError, match="jsonl_rows: preference pairs need both branches together"):
        make_spec(input={"type": "preference"}, output={"formats": ["parquet", "jsonl_rows"]})


def test_the_gate_example_passes_a_clean_partition_and_names_the_record_that_breaks_it(tmp_path: Path):
    namespace: dict = {}
    exec(compile(example("Add a gate"), str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    gate = namespace["GATE"]
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in ("fine\ntext", "ok\nok\nok\nthen more", "no stutter")]
    spec = make_spec("gate", sequence={"max_seq_len": 64}, checks={"min_sequence_utilization": 0})
    run = run_layers(tmp_path, spec, {"a.jsonl": b"".join(lines)})
    from prep_assets.core.lake import dataset_paths

    outcome = gate.probe(spec, dataset_paths(tmp_path, "gate"), run["partition"])
    assert outcome.name == "clean_records_no_stutter" and outcome.violations == 1
    assert outcome.offending == [{"record_id": run["record_ids"][1], "line": 2}]
    assert outcome.description == "no kept record repeats a non-blank line three times in a row"


@pytest.fixture
def registered_type():
    from prep_assets.core import record_types

    yield from registered("Add an input type", record_types.TYPES)


def test_the_input_type_example_trains_on_the_first_answer_and_rejects_a_record_without_one(
    registered_type, tmp_path: Path
):
    import pyarrow.parquet as pq
    from transformers import PreTrainedTokenizerFast

    from prep_assets.core.lake import dataset_paths

    lines = [
        {"question": "What is 2+2? ", "answers": ["4", "four"]},
        {"question": "Capital of France? ", "answers": []},
        {"question": "Colour of the sky? ", "answers": ["blue"]},
    ]
    spec = make_spec(
        "qa",
        input={"type": "qa"},
        sequence={"max_seq_len": 64},
        checks={"min_sequence_utilization": 0, "max_reject_rate": 1},
    )
    run = run_layers(tmp_path, spec, {"a.jsonl": b"".join(json.dumps(r).encode() + b"\n" for r in lines)})
    paths = dataset_paths(tmp_path, "qa")
    rejects = pq.read_table(paths.partition_dir("bronze", run["partition"]) / "rejects.parquet").to_pylist()
    assert [(r["source_line"], r["reason"]) for r in rejects] == [(2, "no_answer")]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(paths.tokenizer_dir / "tokenizer.json"))
    gold = pq.read_table(paths.partition_dir("gold", run["partition"]) / "examples.parquet").to_pylist()
    texts = sorted(tok.decode(g["token_ids"]) for g in gold)
    assert texts == ["Colour of the sky? blue<|endoftext|>", "What is 2+2? 4<|endoftext|>"]
    for g in gold:  # the question masked, the answer and its EOS trained
        trained = tok.decode([t for t, m in zip(g["token_ids"], g["loss_mask"]) if m])
        assert trained in ("4<|endoftext|>", "blue<|endoftext|>") or trained.strip() in (
            "4<|endoftext|>",
            "blue<|endoftext|>",
        )


def test_an_unknown_input_type_names_the_registered_ones():
    with pytest.raises(SpecError, match="input.type 'qa': unknown; registered types: .*'instruction'"):
        make_spec(input={"type": "qa"})
