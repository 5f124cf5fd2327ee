"""AstrAI pipeline configs as `data/datasets/<name>.json`: the guide's examples run unchanged through every layer;
`preprocessing.max_items` and the text-mode `min_chars`/`max_chars` reject with reasons; errors name file and key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from prep_assets.core.errors import SpecError
from prep_assets.core.spec import load_spec, scan_specs
from prep_assets_tests.conftest import shared_path
from prep_assets_tests.core.helpers import run_core

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "astrai"


def _chat_records() -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": f"What is {i}+{i}?"},
                {"role": "assistant", "content": f"{2 * i}"},
            ],
            "source": ("wiki", "web")[i % 2],
        }
        for i in range(8)
    ]


def _text_records() -> list[dict[str, Any]]:
    long = "A paragraph long enough to pass AstrAI's fifty character minimum, number {}."
    return [{"content": long.format(i)} for i in range(6)] + [{"content": "too short"}]


# (config, tokenizer AstrAI would be given as `params`, drop file, drop records or a shared file)
CASES = {
    "sft_instruction": ("gpt2", "alpaca_en_demo.json", "instruction/alpaca_en_demo.json"),
    "sft_chat": ("tinyllama", "chats.jsonl", _chat_records()),
    "pretraining": ("gpt2", "docs.jsonl", _text_records()),
}


def _data_dir(tmp_path: Path, name: str, config: dict[str, Any] | None = None) -> Path:
    """A data dir holding the config as `datasets/<name>.json`, its tokenizer at AstrAI's default `params`."""
    tokenizer, fname, source = CASES[name]
    (tmp_path / "datasets").mkdir()
    if config is None:
        shutil.copyfile(FIXTURES / f"{name}.json", tmp_path / "datasets" / f"{name}.json")
    else:
        (tmp_path / "datasets" / f"{name}.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copytree(shared_path(f"tokenizers/{tokenizer}"), tmp_path / "params")
    raw = tmp_path / "raw" / name
    raw.mkdir(parents=True)
    if isinstance(source, str):
        shutil.copyfile(shared_path(f"datasets/{source}"), raw / fname)
    else:
        (raw / fname).write_text("".join(json.dumps(r) + "\n" for r in source), encoding="utf-8")
    return tmp_path


def _run(data: Path, name: str) -> dict[str, Any]:
    ((_, result),) = run_core(data, load_spec(data / "datasets" / f"{name}.json", data)).items()
    return result


@pytest.mark.parametrize("name", sorted(CASES))
def test_astrai_guide_configs_run_as_is_through_every_layer(tmp_path: Path, name: str):
    data = _data_dir(tmp_path, name)
    assert [s.name for s in scan_specs(data / "datasets").specs] == [name]
    result = _run(data, name)
    bronze, silver, gold = (result[layer] for layer in ("bronze", "silver", "gold"))
    assert silver.records + silver.rejects == bronze.records > 0  # every record kept or rejected with a reason
    assert gold.examples > 0
    shards = result["dirs"][3]
    assert list((shards / "train" / "astrai").glob("*/shard_0000/sequence.bin"))  # AstrAI's `bin` storage
    examples = pq.read_table(result["dirs"][2] / "examples.parquet").to_pylist()
    assert all(sum(e["loss_mask"]) > 0 for e in examples)
    if name == "sft_chat":  # output.domain_key routes AstrAI's folders
        assert {p.name for p in (shards / "train" / "astrai").iterdir()} <= {"wiki", "web"}


def test_text_mode_min_chars_rejects_short_texts_with_a_reason(tmp_path: Path):
    result = _run(_data_dir(tmp_path, "pretraining"), "pretraining")
    assert result["silver"].rejects_by_reason == {"too_short": 1}
    assert result["silver"].records == 6
    rejects = pq.read_table(result["dirs"][1] / "rejects.parquet").to_pylist()
    assert rejects[0]["detail"] == "9 chars < min_chars 50"


def test_max_items_caps_kept_records_and_rejects_the_rest(tmp_path: Path):
    config = json.loads((FIXTURES / "pretraining.json").read_text(encoding="utf-8"))
    config["preprocessing"]["max_items"] = 4
    result = _run(_data_dir(tmp_path, "pretraining", config), "pretraining")
    silver = result["silver"]
    assert silver.records == 4 and silver.rejects_by_reason == {"max_items": 2, "too_short": 1}
    kept = pq.read_table(result["dirs"][1] / "records.parquet").column("source_line").to_pylist()
    assert kept == [1, 2, 3, 4]  # the first ones, in input order


def test_instruction_config_maps_response_to_our_completion(tmp_path: Path):
    spec = load_spec(_data_dir(tmp_path, "sft_instruction") / "datasets" / "sft_instruction.json", tmp_path)
    assert spec.input.prompt_key == "instruction" and spec.input.completion_key == "output"
    assert spec.mask_action("completion") == "train" and spec.mask_action("prompt") == "mask"
    assert spec.sequence.max_seq_len == 2048 and spec.sequence.overflow == "truncate_right"
    assert spec.clean.dedup == "exact" and spec.clean.min_chars == 1  # length filters: text mode only
    assert spec.output.formats == ["parquet", "astrai_bin"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"preprocessing": {"max_itemz": 3}}, "preprocessing.max_itemz: unknown key; allowed keys here: max_seq_len"),
        ({"output": {"storage_format": "h5"}}, "output.storage_format: Input should be 'bin'"),
        ({"preprocessing": {"packing_strategy": "bfd"}}, "preprocessing.packing_strategy: unknown key"),
        ({"mask": {"response": "learn"}}, "mask.response: Input should be 'train' or 'mask'"),
        ({"version": 2}, "version: Input should be 1"),
    ],
)
def test_astrai_config_errors_name_the_file_and_the_key(tmp_path: Path, change: dict[str, Any], message: str):
    config = {**json.loads((FIXTURES / "sft_instruction.json").read_text(encoding="utf-8")), **change}
    data = _data_dir(tmp_path, "sft_instruction", config)
    with pytest.raises(SpecError) as err:
        load_spec(data / "datasets" / "sft_instruction.json", data)
    assert f"sft_instruction.json: {message}" in str(err.value)


def test_a_json_and_a_yaml_spec_of_one_dataset_are_refused(tmp_path: Path):
    data = _data_dir(tmp_path, "sft_instruction")
    (data / "datasets" / "sft_instruction.yaml").write_text("input: {type: text}\n", encoding="utf-8")
    scan = scan_specs(data / "datasets")
    assert scan.specs == [] and "has 2 spec files" in scan.broken["sft_instruction"]


def test_a_json_spec_in_our_own_keys_validates_like_yaml(tmp_path: Path):
    (tmp_path / "datasets").mkdir()
    path = tmp_path / "datasets" / "ours.json"
    path.write_text(json.dumps({"input": {"type": "text", "txt_key": "x"}, "tokenizer": {"path": "/t"}}))
    with pytest.raises(SpecError, match=r"ours.json: input.txt_key: unknown key"):
        load_spec(path, tmp_path)
