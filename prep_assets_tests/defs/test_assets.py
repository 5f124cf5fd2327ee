"""Assets materialized through Dagster (`materialize` with a partition key) on real shared data + GPT-2."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, AssetSelection, materialize

from prep_assets.core.lake import read_json
from prep_assets.core.records import GOLD_SCHEMA
from prep_assets.defs.resources import LakeResource
from prep_assets_tests.conftest import shared_path, write_dataset
from prep_assets_tests.defs.helpers import dataset_defs, materialize_drops, metadata

pytestmark = pytest.mark.slow


def _spec(gpt2: Path, input_: dict, **extra) -> dict:
    return {
        "input": input_,
        "tokenizer": {"path": str(gpt2)},
        "sequence": {"max_seq_len": 1024},
        "split": {"validation_ratio": 0.1},
        **extra,
    }


def test_gsm8k_instruction_through_every_layer(tmp_path: Path, gpt2_dir: Path, instance):
    src = shared_path("datasets/instruction/gsm8k_train.jsonl")
    spec = _spec(
        gpt2_dir, {"type": "instruction", "prompt_key": "question", "completion_key": "answer", "prompt_postfix": "\n"}
    )
    data = write_dataset(tmp_path / "data", "gsm", spec, [src])
    ((key, result),) = materialize_drops(data, "gsm", instance).items()
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 21 and all(c.passed for c in checks)
    bronze = metadata(result, "gsm", "raw_records")
    assert bronze["dagster/row_count"] == 7473 and bronze["num_rejects"] == 0
    gold = metadata(result, "gsm", "tokenized_examples")
    shards = metadata(result, "gsm", "packed_shards")
    assert gold["num_tokens"] == shards["num_output_tokens"] == shards["num_input_tokens"] > 1_000_000
    assert shards["num_tokens_dropped_by_overflow"] == 0 and shards["max_batch_size"] >= 1
    assert 0 < gold["num_loss_tokens"] < gold["num_tokens"]
    assert shards["sequence_utilization"] > 0.95
    lake = data / "lake" / "gsm"
    assert pq.read_schema(lake / "gold" / key / "examples.parquet").equals(GOLD_SCHEMA, check_metadata=False)
    assert (lake / "shards" / key / "train" / "part-00000.parquet").is_file()
    runs = instance.get_runs()
    assert len(runs) == 2 and all(r.is_success for r in runs)


def test_alpaca_json_array_with_joined_prompt_keys(tmp_path: Path, gpt2_dir: Path, instance):
    src = shared_path("datasets/instruction/alpaca_en_demo.json")
    spec = _spec(
        gpt2_dir,
        {
            "type": "instruction",
            "prompt_key": ["instruction", "input"],
            "completion_key": "output",
            "prompt_postfix": "\n",
        },
    )
    data = write_dataset(tmp_path / "data", "alpaca", spec, [src])
    ((key, result),) = materialize_drops(data, "alpaca", instance).items()
    assert result.success, [c.check_name for c in result.get_asset_check_evaluations() if not c.passed]
    acct = read_json(data / "lake" / "alpaca" / "bronze" / key / "accounting.json")
    assert acct["unit"] == "element" and acct["records"] == acct["lines_in"] > 500
    shown = metadata(result, "alpaca", "raw_records")  # the UI names what was read: a JSON array's elements
    assert shown["elements_in"] == acct["lines_in"] and "lines_in" not in shown
    rec = pq.read_table(data / "lake" / "alpaca" / "bronze" / key / "records.parquet").slice(0, 1).to_pylist()[0]
    assert rec["source_line"] == 2 and rec["byte_offset"] > 0  # the first element starts on line 2


def test_c4_text_trains_every_token(tmp_path: Path, gpt2_dir: Path, instance):
    src = shared_path("datasets/text/c4_demo.jsonl")
    spec = _spec(
        gpt2_dir, {"type": "text", "text_key": "text"}, sequence={"max_seq_len": 2048, "overflow": "truncate_right"}
    )
    data = write_dataset(tmp_path / "data", "c4", spec, [src])
    ((key, result),) = materialize_drops(data, "c4", instance).items()
    assert result.success
    gold = pq.read_table(
        data / "lake" / "c4" / "gold" / key / "examples.parquet",
        columns=["num_tokens", "num_loss_tokens", "num_prompt_tokens"],
    ).to_pylist()
    assert all(r["num_loss_tokens"] == r["num_tokens"] - 1 and r["num_prompt_tokens"] == 0 for r in gold)


def test_malformed_drop_fails_bronze_gate_and_stops_lower_layers(tmp_path: Path, gpt2_dir: Path, instance):
    src = shared_path("datasets/bad/gdp_json_load_error.jsonl")
    spec = _spec(gpt2_dir, {"type": "instruction"}, checks={"max_reject_rate": 0.01})
    data = write_dataset(tmp_path / "data", "bad", spec, [src])
    ((key, result),) = materialize_drops(data, "bad", instance).items()
    assert not result.success
    failed = {c.check_name: c for c in result.get_asset_check_evaluations() if not c.passed}
    assert set(failed) == {"raw_records_reject_rate"}
    offending = failed["raw_records_reject_rate"].metadata["offending"].value
    assert "gdp_json_load_error.jsonl:" in offending and "malformed_json" in offending
    assert result.is_node_untouched("bad__clean_records") and result.is_node_untouched("bad__packed_shards")
    rejects = pq.read_table(data / "lake" / "bad" / "bronze" / key / "rejects.parquet").to_pylist()
    assert {r["reason"] for r in rejects} == {"malformed_json"} and all(r["byte_offset"] >= 0 for r in rejects)
    acct = read_json(data / "lake" / "bad" / "bronze" / key / "accounting.json")
    assert acct["records"] + acct["rejects"] + acct["blank_lines"] == acct["lines_in"]


def test_corrupted_gold_fails_gate_and_shards_are_not_materialized(tmp_path: Path, gpt2_dir: Path, instance):
    src = shared_path("datasets/instruction/gsm8k_train.jsonl")
    spec = _spec(gpt2_dir, {"type": "instruction", "prompt_key": "question", "completion_key": "answer"})
    data = write_dataset(tmp_path / "data", "gsm", spec, [src])
    ((key, first),) = materialize_drops(
        data, "gsm", instance, selection=["raw_records", "clean_records", "tokenized_examples"]
    ).items()
    assert first.success
    gold_file = data / "lake" / "gsm" / "gold" / key / "examples.parquet"
    table = pq.read_table(gold_file)
    masks = table.column("loss_mask").to_pylist()
    masks[3] = masks[3][:-1]  # one example's mask one token short: misaligned
    corrupted = table.set_column(
        table.schema.get_field_index("loss_mask"), "loss_mask", pa.array(masks, pa.list_(pa.uint8()))
    )
    pq.write_table(corrupted, gold_file)
    gold_key, shards_key = AssetKey(["gsm", "tokenized_examples"]), AssetKey(["gsm", "packed_shards"])
    result = materialize(
        dataset_defs(data, "gsm"),
        selection=AssetSelection.checks_for_assets(gold_key) | AssetSelection.assets(shards_key),
        partition_key=key,
        instance=instance,
        resources={"lake": LakeResource(data_dir=str(data))},
        raise_on_error=False,
    )
    failed = [c for c in result.get_asset_check_evaluations() if not c.passed]
    assert [c.check_name for c in failed] == ["tokenized_examples_mask_aligned"]
    assert "gsm8k_train.jsonl:4" in failed[0].metadata["offending"].value
    assert result.is_node_untouched("gsm__packed_shards")
    assert not (data / "lake" / "gsm" / "shards" / key).exists()
