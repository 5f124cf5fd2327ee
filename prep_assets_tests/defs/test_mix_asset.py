"""The training_mix asset through real Dagster: blocking gates, metadata, reruns, staleness after a new drop."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, materialize

from prep_assets.core.errors import ManifestMismatchError, ReadError
from prep_assets.core.lake import read_json, verify_published
from prep_assets.core.mix import held_path, load_mix, mix_path
from prep_assets.core.reading import MixRows
from prep_assets.core.spec import load_spec
from prep_assets.definitions import build_definitions
from prep_assets.defs.keys import mix_asset_key, mix_job_name
from prep_assets.defs.mix import mix_asset, mix_checks
from prep_assets.defs.resources import LakeResource
from prep_assets.orchestrate import mix_up_to_date
from prep_assets_tests.conftest import SAMPLE_DATA, copy_sample_data
from prep_assets_tests.core.helpers import run_core

DATASETS = {"sample_instruct", "sample_text", "sample_chat"}
TEXT_ONLY = {"sources": {"text": "sample_text"}, "weights": {"text": 1}}  # a mix of sample_text's 24 train rows


@pytest.fixture
def data(tmp_path: Path) -> Path:
    data = copy_sample_data(tmp_path / "data")
    for name in sorted(DATASETS):
        run_core(data, load_spec(data / "datasets" / f"{name}.yaml", data))
    (data / "mixes").mkdir(exist_ok=True)  # the sample copy holds sample_mix.yaml
    return data


def write_mix_spec(data: Path, name: str, doc: dict[str, Any] | None = None) -> Path:
    path = data / "mixes" / f"{name}.yaml"
    if doc is None:
        shutil.copyfile(SAMPLE_DATA / "mixes" / "sample_mix.yaml", path)
    else:
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run_mix(data: Path, name: str, instance: DagsterInstance):
    spec = load_mix(data / "mixes" / f"{name}.yaml", DATASETS)
    return spec, materialize(
        [mix_asset(spec), mix_checks(spec)],
        resources={"lake": LakeResource(data_dir=str(data))},
        instance=instance,
        raise_on_error=False,
    )


def checks(result) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def materialization(result):
    (event,) = result.get_asset_materialization_events()
    return event.materialization


def metadata(result) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in materialization(result).metadata.items()}


def test_the_sample_mix_materializes_with_its_gates_and_reruns_byte_identically(data: Path) -> None:
    write_mix_spec(data, "sample_mix")
    with DagsterInstance.ephemeral() as instance:
        spec, result = run_mix(data, "sample_mix", instance)
        assert result.success and all(e.passed for e in checks(result).values()) and len(checks(result)) == 5
        shown = metadata(result)
        assert (
            "| text | 0.75 | 1536 | 1536 |" in shown["phase_warmup"]
            and "| instruct | 0.5 | 2048 | 2048 |" in (shown["phase_main"])
        )
        plot = shown["planned_vs_achieved"]
        assert plot.startswith("![planned vs achieved tokens](data:image/png;base64,iVBORw0KGgo")  # a PNG
        assert "phases left to right (warmup, main)" in plot and "instruct `#1f77b4`" in plot
        first = mix_path(data / "lake", "sample_mix").read_bytes()
        for phases in (["mian"], []):  # a misspelled phase, or none: an error naming the mix's phases
            with pytest.raises(ReadError, match=r"no phase .*; its phases are \['warmup', 'main'\]"):
                MixRows(data / "lake" / "_mixes" / "sample_mix", phases=phases)
        assert {r["phase"] for r in MixRows(data / "lake" / "_mixes" / "sample_mix", phases="main")} == {"main"}
        assert mix_up_to_date(instance, spec, data / "lake")
        _, again = run_mix(data, "sample_mix", instance)
        assert again.success and mix_path(data / "lake", "sample_mix").read_bytes() == first
        assert metadata(again)["planned_vs_achieved"] == plot  # the image's bytes too


def test_a_shortfall_fails_the_blocking_gate_unless_exhaustion_is_allowed(data: Path) -> None:
    doc = {**TEXT_ONLY, "duration_tokens": 40 * 256}
    write_mix_spec(data, "short", doc)
    lake = data / "lake"
    with DagsterInstance.ephemeral() as instance:
        spec, result = run_mix(data, "short", instance)
        assert not result.success
        failed = checks(result)["training_mix_inventory"]
        assert not failed.passed
        assert "from bucket 'text' but only 6.1K available" in failed.description
        assert "10,240 tokens" in failed.description and "allow_bucket_exhaustion: true" in failed.description
        assert not mix_path(lake, "short").exists() and held_path(lake, "short").is_file()  # nothing to train on
        assert metadata(result)["published"] is False and not mix_up_to_date(instance, spec, lake)
        write_mix_spec(data, "short", {**doc, "allow_bucket_exhaustion": True})
        _, allowed = run_mix(data, "short", instance)
        assert allowed.success and checks(allowed)["training_mix_inventory"].passed
        assert mix_path(lake, "short").is_file() and not held_path(lake, "short").parent.exists()
        shown = metadata(allowed)
        assert "bucket 'text'" in shown["warnings"] and "| text | 16 |" in shown["shortfalls"]


def test_a_plan_failing_its_gates_is_held_and_trainers_keep_reading_the_last_one_that_passed(data: Path) -> None:
    write_mix_spec(data, "notes", {**TEXT_ONLY, "duration_tokens": 10 * 256})
    lake = data / "lake"
    with DagsterInstance.ephemeral() as instance:
        spec, good = run_mix(data, "notes", instance)
        assert good.success and metadata(good)["published"] is True
        published = mix_path(lake, "notes").read_bytes()
        assert len(MixRows(lake / "_mixes" / "notes")) == 10
        write_mix_spec(data, "notes", {**TEXT_ONLY, "duration_tokens": 40 * 256})  # more than the bucket holds
        _, short = run_mix(data, "notes", instance)
        assert not short.success and not checks(short)["training_mix_inventory"].passed  # judged: the held plan
        assert mix_path(lake, "notes").read_bytes() == published and not verify_published(
            mix_path(lake, "notes").parent
        )
        assert read_json(held_path(lake, "notes"))["buckets"]["text"]["shortfall_rows"] == 16
        assert len(MixRows(lake / "_mixes" / "notes")) == 10  # the last plan that passed, whole
        assert not mix_up_to_date(instance, spec, lake)  # planned and judged again on the next run
        notes = [f"Note {i}: the tide gauge read high again at the harbor before dawn." for i in range(60)]
        (data / "raw" / "sample_text" / "more_notes.txt").write_text("\n".join(notes) + "\n", encoding="utf-8")
        run_core(data, load_spec(data / "datasets" / "sample_text.yaml", data))  # the published plan goes stale
        with pytest.raises(ManifestMismatchError, match="its newest plan is held at .*failing its gates"):
            MixRows(lake / "_mixes" / "notes")
        write_mix_spec(data, "notes", {**TEXT_ONLY, "duration_tokens": 20 * 256})
        _, fixed = run_mix(data, "notes", instance)
        assert fixed.success and len(MixRows(lake / "_mixes" / "notes")) == 20
        assert not held_path(lake, "notes").parent.exists()


def test_mixed_tokenizers_fail_the_gate(data: Path) -> None:
    doc = {"sources": {"instruct": "sample_instruct", "chat": "sample_chat"}, "weights": {"instruct": 1, "chat": 1}}
    write_mix_spec(data, "mixed", {**doc, "duration_tokens": 1024})
    with DagsterInstance.ephemeral() as instance:
        _, result = run_mix(data, "mixed", instance)
    gate = checks(result)["training_mix_one_tokenizer"]
    assert not result.success and not gate.passed
    assert "chat (sample_chat)" in gate.description and "instruct (sample_instruct)" in gate.description


def test_a_new_drop_makes_the_mix_stale_and_a_refresh_includes_it(data: Path) -> None:
    write_mix_spec(data, "sample_mix")
    with DagsterInstance.ephemeral() as instance:
        spec, result = run_mix(data, "sample_mix", instance)
        before = mix_path(data / "lake", "sample_mix").read_bytes()
        version = materialization(result).tags["dagster/data_version"]
        notes = [
            f"Field note {i}: the ferry crew checked the tide gauge at the harbor before dawn." for i in range(80)
        ]
        (data / "raw" / "sample_text" / "more_notes.txt").write_text("\n".join(notes) + "\n", encoding="utf-8")
        run_core(data, load_spec(data / "datasets" / "sample_text.yaml", data))
        assert not mix_up_to_date(instance, spec, data / "lake")
        _, refreshed = run_mix(data, "sample_mix", instance)
        assert refreshed.success
        after = mix_path(data / "lake", "sample_mix").read_bytes()
        assert after != before and materialization(refreshed).tags["dagster/data_version"] != version
        files = [f["path"] for f in read_json(mix_path(data / "lake", "sample_mix"))["sources"]["text"]["files"]]
        assert any("more_notes" in p for p in files)
        assert mix_up_to_date(instance, spec, data / "lake")


def test_definitions_hold_each_mix_and_a_broken_one_as_an_error_asset(data: Path) -> None:
    write_mix_spec(data, "sample_mix")
    write_mix_spec(data, "broken", {"sources": {"x": "no_such_dataset"}, "weights": {"x": 1}, "duration_tokens": 5})
    defs = build_definitions(data)
    keys = set(defs.resolve_asset_graph().get_all_asset_keys())
    assert mix_asset_key("sample_mix") in keys and AssetKey(["mix_broken", "spec_error"]) in keys
    assert (
        AssetKey(["sample_text", "dataset_manifest"])
        in defs.resolve_asset_graph().get(mix_asset_key("sample_mix")).parent_keys
    )


def test_a_failing_mix_job_launched_without_run_config_prints_no_dagster_traceback(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mix_spec(data, "short", {**TEXT_ONLY, "duration_tokens": 40 * 256})
    job = build_definitions(data).resolve_job_def(mix_job_name("short"))
    with DagsterInstance.ephemeral() as instance:  # as a sensor or `dagster job execute` launches it: no config
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    err = capsys.readouterr().err
    assert not result.success and "training_mix_inventory" in err and "not published" in err
    assert "Stack Trace" not in err  # the job's own console logger (defs/logs.py), not Dagster's default
