"""`prep-assets run` as a newcomer runs it: a subprocess, a fresh DAGSTER_HOME, the shipped sample data."""

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, DagsterRunStatus

from prep_assets.cli import TerminalBars, main
from prep_assets.core import decode
from prep_assets.core.decode import decode_row, decode_rows
from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.progress import Progress, drawing
from prep_assets_tests.conftest import PROJECT, copy_sample_data, tree_digests, write_dataset

pytestmark = pytest.mark.slow


def _run(args: list[str], home: Path, cwd: Path, **env_over: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(home), **env_over}
    env.pop("PREP_ASSETS_DATA_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "prep_assets.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_run_sample_data_records_runs_and_skips_up_to_date(tmp_path: Path):
    data = copy_sample_data(tmp_path / "data")
    home = tmp_path / "home"
    first = _run(["run", "--data-dir", str(data)], home, PROJECT)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "19/19" in first.stdout and "21/21" in first.stdout and "0 failed" in first.stdout
    assert "mix sample_mix: 2 phase(s), rows per bucket: instruct 10, text 14; checks 5/5" in first.stdout
    assert (home / "dagster.yaml").is_file() and (home / ".nux" / "nux.yaml").is_file()
    for ds in SAMPLE_DATASETS:
        manifest = json.loads((data / "lake" / ds / "manifest.json").read_text())
        assert manifest["splits"]["train"]["files"] and manifest["partitions"]
    # the sample chat's planted bad records are accounted for, each with its reason
    chat = data / "lake" / "sample_chat"
    assert [r["reason"] for r in _rows(chat, "bronze", "rejects")] == ["unknown_role"]
    assert [r["reason"] for r in _rows(chat, "gold", "rejects")] == ["no_trained_tokens"]
    # the sample table: the ragged row is a bronze reject; every other row is in exactly one example
    sensors = data / "lake" / "sample_sensors"
    assert [(r["reason"], r["source_line"]) for r in _rows(sensors, "bronze", "rejects")] == [("csv_field_count", 54)]
    examples = _rows(sensors, "gold", "examples")
    assert sum(len(e["record_ids"]) for e in examples) == 240 and all(len(e["group_keys"]) == 1 for e in examples)
    prefill = json.loads((sensors / "manifest.json").read_text())["tabular"]["initial_prefill"]
    assert all(len(v) == 3 for v in prefill.values()) and len(prefill) == 10 - _test_devices(examples)
    pairs = _rows(data / "lake" / "sample_pref", "gold", "examples")
    assert len(pairs) == 2 * len({r["pair_id"] for r in pairs}) == 238
    with DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 17 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)
        jobs = {r.job_name for r in runs}
        assert {"sample_text_drops", "sample_instruct_drops", "sample_text_manifest", "mix_sample_mix_job"} <= jobs
    again = _run(["run", "--data-dir", str(data), "--dataset", "sample_text"], home, PROJECT)
    assert again.returncode == 0 and again.stdout.count("up to date") == 2 and "mix sample_mix" not in again.stdout
    before = tree_digests(data / "lake")
    forced = _run(["run", "--data-dir", str(data), "--all"], home, PROJECT)
    assert forced.returncode == 0 and "up to date" not in forced.stdout
    assert tree_digests(data / "lake") == before  # every output file byte-identical after a full rematerialization
    # a new drop through `--dataset`: the mix drawing on it is named as not up to date (it used to say nothing)
    raw = data / "raw" / "sample_text"
    notes = (raw / "field_notes_2026-11-01.jsonl").read_text("utf-8")
    (raw / "field_notes_2026-11-03.jsonl").write_text(notes.replace("Day ", "Night "), "utf-8")
    one = _run(["run", "--data-dir", str(data), "--dataset", "sample_text"], home, PROJECT)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "mix sample_mix: draws on sample_text and is stale; `prep-assets run` without --dataset" in one.stdout
    before = {k: v for k, v in tree_digests(data / "lake").items() if k.startswith("_mixes/")}  # not planned again
    mix_spec = data / "mixes" / "sample_mix.yaml"  # a plan its inventory gate fails: held, mix.json kept
    mix_spec.write_text(
        mix_spec.read_text().replace("total_tokens: 6144", "total_tokens: 43008").replace("4096", "40960"), "utf-8"
    )
    short = _run(["run", "--data-dir", str(data)], home, PROJECT)
    assert short.returncode == 1 and "training_mix_inventory" in short.stderr
    assert "rows per bucket: instruct 10, text 14; checks 4/5 FAILED (plan held at " in short.stdout
    published = "_mixes/sample_mix/"
    assert tree_digests(data / "lake" / published) == {
        k.removeprefix(published): v for k, v in before.items() if k.startswith(published)
    }


SAMPLE_DATASETS = ("sample_text", "sample_instruct", "sample_chat", "sample_pref", "sample_sensors")


def _test_devices(examples: list[dict]) -> int:
    return len({e["group_keys"][0] for e in examples if e["split"] != "train"})


def _rows(lake_ds: Path, layer: str, table: str) -> list[dict]:
    return [r for f in sorted(lake_ds.glob(f"{layer}/*/{table}.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the sample data, a fresh DAGSTER_HOME and a neutral working directory for `main()`."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREP_ASSETS_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    return copy_sample_data(tmp_path / "data")


def test_run_exits_non_zero_when_a_gate_fails(in_process: Path, capsys: pytest.CaptureFixture[str]):
    data = in_process
    spec = (
        (data / "datasets" / "sample_text.yaml").read_text().replace("max_reject_rate: 0.05", "max_reject_rate: 0.0")
    )
    write_dataset(data, "strict", {}, {"notes.jsonl": b'{"text": "a fine line of text here"}\n{broken\n'})
    (data / "datasets" / "strict.yaml").write_text(spec, encoding="utf-8")
    code = main(["run", "--data-dir", str(data), "--dataset", "strict"])
    out = capsys.readouterr()
    assert code == 1
    assert (
        "raw_records_reject_rate failed (1 violation): 1 of 2 records rejected (50.00%) > max_reject_rate 0.00%"
        in out.err
    )
    assert "FAILED" in out.out and "Stack Trace" not in out.err  # a failed gate is the user's to fix: no traceback


def test_unknown_dataset_and_bad_spec_are_clear_errors(in_process: Path, capsys: pytest.CaptureFixture[str]):
    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "nope"]) == 2
    assert "no dataset 'nope'" in capsys.readouterr().err
    (data / "datasets" / "broken.yaml").write_text("input: {type: text, colour: red}\ntokenizer: {path: x}\n")
    assert main(["run", "--data-dir", str(data), "--dataset", "broken"]) == 1
    err = capsys.readouterr().err
    assert "broken.yaml: input.colour: unknown key" in err and "Traceback" not in err


def test_a_broken_spec_a_missing_tokenizer_and_an_undecodable_drop_name_stop_only_their_own_dataset(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    data = in_process
    for name in ("sample_chat", "sample_instruct", "sample_pref", "sample_sensors"):
        (data / "datasets" / f"{name}.yaml").unlink()
    (data / "datasets" / "typo.yaml").write_text("input: {type: text, colour: red}\ntokenizer: {path: x}\n")
    (data / "datasets" / "no_tok.yaml").write_text("input: {type: text}\ntokenizer: {path: tokenizers/missing}\n")
    (data / "datasets" / "escape.yaml").write_text(
        "input: {type: chat}\ntokenizer: {path: /nonexistent-abs, chat_template_file: ../../../../etc/passwd}\n"
    )
    raw = data / "raw" / "sample_text"
    with open(os.path.join(os.fsencode(raw), b"caf\xe9.jsonl"), "wb") as f:  # Latin-1 bytes: not UTF-8
        f.write(b'{"text": "a line in a file whose name is not UTF-8"}\n')
    code = main(["run", "--data-dir", str(data)])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err
    assert "FAILED dataset typo: " in out.err and "input.colour: unknown key" in out.err
    assert (
        "FAILED dataset no_tok: " in out.err and "tokenizer.path: 'tokenizers/missing' is not a directory" in out.err
    )
    assert "leaves the data dir" in out.err and "../../../../etc/passwd" in out.err
    assert "'caf\\udce9.jsonl': refused, its name is not valid UTF-8" in out.out
    assert out.out.count("sample_text ") == 2 and "0 failed, 3 dataset(s) in error, 1 raw file(s) not read" in out.out
    assert "NOT READ in raw/sample_text/: 'caf\\udce9.jsonl': refused" in out.err
    # the raw folders whose specs were removed are named: nothing read them (a typo'd folder looks the same)
    assert "NOT READ raw/sample_chat/: no dataset spec datasets/sample_chat.yaml reads it" in out.err
    assert "1 raw file(s) not read, 4 entries of raw/ no spec reads" in out.out
    assert json.loads((data / "lake" / "sample_text" / "manifest.json").read_text())["partitions"]
    # --dataset works whatever the other specs hold; the refused file fails it until it is moved or named `_...`
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 1
    assert "up to date" in capsys.readouterr().out
    os.rename(os.path.join(os.fsencode(raw), b"caf\xe9.jsonl"), os.path.join(os.fsencode(raw), b"_caf\xe9.jsonl"))
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    assert "0 dataset(s) in error, 0 raw file(s) not read" in capsys.readouterr().out


def test_a_file_no_reader_takes_fails_the_run_naming_it_while_every_drop_is_built(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    """A spreadsheet or a symlink in raw/ was logged among the progress lines and the run exited 0: its rows were
    never read and nothing said so at the end."""
    data = in_process
    raw = data / "raw" / "sample_text"
    (raw / "notes.xlsx").write_bytes(b"PK not a reader's format")
    (raw / "more.jsonl").symlink_to(next(raw.glob("*.jsonl")))
    code = main(["run", "--data-dir", str(data), "--dataset", "sample_text"])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err
    assert "NOT READ in raw/sample_text/: 'notes.xlsx': refused, no reader for this name" in out.err
    assert "NOT READ in raw/sample_text/: 'more.jsonl': refused, a symlink (never followed)" in out.err
    assert "0 failed, 0 dataset(s) in error, 2 raw file(s) not read" in out.out
    assert json.loads((data / "lake" / "sample_text" / "manifest.json").read_text())["partitions"]
    # moved out: the next run passes; and it removes the dedup indexes of a configuration no longer used
    (raw / "notes.xlsx").unlink()
    (raw / "more.jsonl").unlink()
    old = data / "lake" / "sample_text" / "dedup_index" / "v1-0123456789ab" / "p"
    old.mkdir(parents=True)
    (old / "hashes.parquet").write_bytes(b"x" * 1000)
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    out = capsys.readouterr()
    assert "removed the dedup indexes of an earlier configuration: v1-0123456789ab (0.0 MiB)" in out.out
    assert not old.parent.exists() and list(
        (data / "lake" / "sample_text" / "dedup_index").glob("v2-*/*/hashes.parquet")
    )


def test_decode_prints_masked_spans_and_segments(in_process: Path, capsys: pytest.CaptureFixture[str]):
    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_instruct"]) == 0
    capsys.readouterr()
    shard = next((data / "lake" / "sample_instruct" / "shards").glob("*/train/part-00000.parquet"))
    assert main(["decode", str(shard), "--row", "0", "--format", "json"]) == 0
    decoded = json.loads(capsys.readouterr().out)
    assert decoded["length"] == 256 and decoded["segments"]
    spans = [sp for s in decoded["segments"] for sp in s["spans"]]
    assert not spans[0]["trained"] and any(sp["trained"] and "<|endoftext|>" in sp["text"] for sp in spans)
    assert main(["decode", str(shard), "--row", "0"]) == 0
    text = capsys.readouterr().out
    assert "--- segment 1 ·" in text and "«" in text
    # not a shard: a clear error, not a traceback or a missing tokenizer
    lake = data / "lake" / "sample_instruct"
    gold = next((lake / "gold").glob("*/examples.parquet"))
    assert main(["decode", str(gold)]) == 2
    assert "not a packed shard (no input_ids, segment_ids, example_ids column)" in capsys.readouterr().err
    assert main(["decode", str(lake / "manifest.json")]) == 2
    assert "manifest.json: not a Parquet file" in capsys.readouterr().err
    # its reader gone (`| head`): the command stops quietly, no traceback
    proc = subprocess.Popen(
        [sys.executable, "-m", "prep_assets.cli", "decode", str(shard), "--row", "0", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=PROJECT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_decode_names_where_a_continued_segment_starts(in_process: Path, capsys: pytest.CaptureFixture[str]):
    data = in_process  # sample_text packs `full`: notes continue across rows
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    capsys.readouterr()
    shard = sorted((data / "lake" / "sample_text" / "shards").glob("*/train/part-00000.parquet"))[0]
    rows = pq.read_table(shard, columns=["example_offsets"]).column(0).to_pylist()
    row = next(i for i, offs in enumerate(rows) if offs[0] > 0)
    assert main(["decode", str(shard), "--row", str(row), "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)["segments"][0]
    assert first["example_offset"] == rows[row][0] and not first["spans"][0]["trained"]
    assert main(["decode", str(shard), "--row", str(row)]) == 0
    assert f"from token {rows[row][0]} ·" in capsys.readouterr().out


def test_decode_of_a_row_in_any_row_group_and_any_read_batch_agrees_with_decoding_every_row(
    in_process: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    shard = sorted((data / "lake" / "sample_text" / "shards").glob("*/train/part-00000.parquet"))[0]
    table = pq.read_table(shard)
    assert table.num_rows >= 5
    small_groups = tmp_path / "part-00000.parquet"
    pq.write_table(table, small_groups, row_group_size=2)  # rows 0-1, 2-3, 4-...: row k in group k // 2
    tok = data / "lake" / "sample_text" / "tokenizer"
    every = list(decode_rows(small_groups, tok))
    assert len(every) == table.num_rows
    for row in (0, 1, 2, 3, table.num_rows - 1):
        got = decode_row(small_groups, row, tok)
        assert got == every[row] and got["segments"] == decode_row(shard, row)["segments"]
    with pytest.raises(PrepAssetsError, match=r"row 99999 out of range"):
        decode_row(small_groups, 99_999, tok)
    monkeypatch.setattr(decode, "_ROWS_PER_READ", 2)  # a row group read in batches of 2: rows past the first batch
    whole = list(decode_rows(shard, tok))
    assert [decode_row(shard, row, tok) for row in range(len(whole))] == whole


def test_failed_gate_keeps_partition_out_of_manifest_and_stale_until_fixed(tmp_path: Path):
    data = copy_sample_data(tmp_path / "data")
    spec_path = data / "datasets" / "sample_instruct.yaml"
    spec = spec_path.read_text()
    spec_path.write_text(spec.replace("min_sequence_utilization: 0.8", "min_sequence_utilization: 0.999"))
    home = tmp_path / "home"
    first = _run(["run", "--data-dir", str(data), "--dataset", "sample_instruct"], home, PROJECT)
    assert first.returncode == 1 and "packed_shards_utilization failed" in first.stderr
    manifest = json.loads((data / "lake" / "sample_instruct" / "manifest.json").read_text())
    assert manifest["partitions"] == {} and manifest["splits"]["train"]["files"] == []
    again = _run(["run", "--data-dir", str(data), "--dataset", "sample_instruct"], home, PROJECT)
    assert again.returncode == 1 and "up to date" not in again.stdout  # a failed gate is never "up to date"
    spec_path.write_text(spec)  # threshold back: the checks section changed, so every layer is rebuilt
    fixed = _run(["run", "--data-dir", str(data), "--dataset", "sample_instruct"], home, PROJECT)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    manifest = json.loads((data / "lake" / "sample_instruct" / "manifest.json").read_text())
    assert len(manifest["partitions"]) == 1


def test_changed_file_supersedes_old_drop_and_changed_corpus_repins_tokenizer(tmp_path: Path):
    data = copy_sample_data(tmp_path / "data")
    home = tmp_path / "home"
    assert _run(["run", "--data-dir", str(data), "--dataset", "sample_text"], home, PROJECT).returncode == 0
    old_fp = json.loads((data / "lake" / "sample_text" / "tokenizer" / "fingerprint.json").read_text())["fingerprint"]
    drop = data / "raw" / "sample_text" / "field_notes_2026-11-02.txt"
    drop.write_text("".join(drop.read_text().splitlines(keepends=True)[:-5]))  # edited in place
    with (data / "corpus" / "sample_corpus.txt").open("a") as f:
        f.write("An extra line about tokenizers, partitions and lineage.\n" * 50)
    result = _run(["run", "--data-dir", str(data), "--dataset", "sample_text"], home, PROJECT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "superseded by field_notes_2026-11-02_txt-" in result.stdout
    assert "materializing tokenizer" in result.stdout
    new_fp = json.loads((data / "lake" / "sample_text" / "tokenizer" / "fingerprint.json").read_text())["fingerprint"]
    assert new_fp != old_fp
    manifest = json.loads((data / "lake" / "sample_text" / "manifest.json").read_text())
    assert len(manifest["partitions"]) == 2  # the jsonl drop and the new txt drop, not the superseded one
    assert manifest["shard_tokenizer_fingerprints"] == [new_fp]


def test_a_corrupted_published_file_is_rebuilt_and_the_manifest_never_names_different_bytes(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    from prep_assets.core.errors import ManifestError
    from prep_assets.core.lake import dataset_paths, sha256_file
    from prep_assets.core.manifest import build_manifest
    from prep_assets.core.spec import load_spec

    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    capsys.readouterr()
    lake = data / "lake" / "sample_text"
    manifest = json.loads((lake / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["files"][0]
    shard = lake / entry["path"]
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])  # truncated after publishing
    spec, paths = load_spec(data / "datasets" / "sample_text.yaml"), dataset_paths(data, "sample_text")
    with pytest.raises(ManifestError, match="part-00000.parquet: sha256 differs from the recorded one"):
        build_manifest(spec, paths, sorted(manifest["partitions"]))
    assert json.loads((lake / "manifest.json").read_text()) == manifest  # the published one is untouched
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"rebuilding shards {entry['partition']}: .*part-00000.parquet: \d+ bytes, \d+ recorded", out)
    assert shard.read_bytes() == good and sha256_file(shard) == entry["sha256"]
    for split in json.loads((lake / "manifest.json").read_text())["splits"].values():
        for f in split["files"]:
            assert sha256_file(lake / f["path"]) == f["sha256"]


def test_a_run_left_started_by_a_killed_process_is_marked_failed_on_the_next_run(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    from dagster import DagsterRun

    from prep_assets.core.lake import process_tag
    from prep_assets.orchestrate import PROCESS_TAG

    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    dead_tag = "999999999-" + process_tag().split("-", 1)[1]  # a pid no process has, on this machine
    with DagsterInstance.get() as instance:
        for run_id, tag in (("deadrun", dead_tag), ("liverun", process_tag())):
            instance.add_run(
                DagsterRun(
                    job_name="sample_text_drops",
                    run_id=run_id,
                    status=DagsterRunStatus.STARTED,
                    tags={PROCESS_TAG: tag},
                )
            )
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    assert "marked run deadrun (sample_text_drops) failed" in capsys.readouterr().out
    with DagsterInstance.get() as instance:
        assert instance.get_run_by_id("deadrun").status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id("liverun").status == DagsterRunStatus.STARTED  # its process is alive


def test_retire_takes_a_drop_out_for_good_unless_its_bytes_change(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    data, ds = in_process, "sample_text"
    assert main(["run", "--data-dir", str(data), "--dataset", ds]) == 0
    out = capsys.readouterr().out
    venv = Path(sys.executable).parent
    assert f"{venv / 'prep-assets'} ui --data-dir {data}" in out  # the UI hint, as run
    assert f"{venv / 'prep-assets'} backfill <dataset> [--drops KEY1,KEY2] --data-dir {data}" in out
    assert "it waits for the runs" in out and "\nunit " not in out and "line " in out  # the summary's unit column
    lake, raw = data / "lake" / ds, data / "raw" / ds
    bad = raw / "field_notes_2026-11-02.txt"
    content = bad.read_bytes()
    (key,) = [p.stem for p in (lake / "drops").glob("field_notes_2026-11-02_txt-*.json")]
    assert len(json.loads((lake / "manifest.json").read_text())["partitions"]) == 2
    capsys.readouterr()
    assert main(["retire", ds, bad.name, "--data-dir", str(data), "--reason", "garbled OCR"]) == 0
    assert f"retired {key}" in capsys.readouterr().out
    manifest = json.loads((lake / "manifest.json").read_text())
    assert key not in manifest["partitions"] and len(manifest["partitions"]) == 1
    folder = lake / "retired" / key
    record = json.loads((folder / "retired.json").read_text())
    assert record["reason"] == "garbled OCR" and record["retired_by"] and record["retired_at"].endswith("+00:00")
    assert record["sha256"] == hashlib.sha256(content).hexdigest() and record["file"] == bad.name
    for layer in ("bronze", "silver", "gold", "shards"):
        assert any((folder / layer).iterdir()) and not (lake / layer / key).exists(), layer
    assert (folder / "raw" / bad.name).read_bytes() == content and not bad.exists()
    with DagsterInstance.get() as instance:
        assert key not in instance.get_dynamic_partitions(f"{ds}_drops")
    assert main(["retire", ds, key, "--data-dir", str(data)]) == 2  # once only
    err = capsys.readouterr().err
    assert "already retired" in err and "Stack Trace" not in err  # the user's error, without Dagster's frames

    bad.write_bytes(content)  # the same bytes dropped again: refused, the manifest unchanged
    assert main(["run", "--data-dir", str(data), "--dataset", ds]) == 0
    assert f"same bytes as retired drop {key}" in capsys.readouterr().out
    assert not (lake / "drops" / f"{key}.json").exists()
    assert json.loads((lake / "manifest.json").read_text())["partitions"].keys() == manifest["partitions"].keys()

    bad.write_bytes(
        content + b"\nOne more note: the river was high again after the rain.\n"
    )  # corrected bytes under the same name: a new drop
    assert main(["run", "--data-dir", str(data), "--dataset", ds]) == 0
    parts = json.loads((lake / "manifest.json").read_text())["partitions"]
    assert len(parts) == 2 and any(k.startswith("field_notes_2026-11-02_txt-") and k != key for k in parts)


def test_the_terminal_bar_draws_rows_of_a_known_total_or_the_share_done_with_rows_as_suffix():
    out = io.StringIO()
    bars = TerminalBars(out, mininterval=0)
    with drawing(bars):
        p = Progress("gold d1: tokenizing", 1000)
        p.advance(250)
        p.advance(750)
        Progress("bronze d1: reading").advance(7200, at=0.5)
    bars.close()
    text = out.getvalue()
    assert "\r" in text and "gold d1: tokenizing" in text and "1000/1000" in text
    assert "bronze d1: reading:  50%" in text and "7,200 rows" in text


def test_a_built_drop_whose_raw_file_is_gone_is_noted_with_the_way_to_take_it_out(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    """Deleting a raw file left its drop in the manifest, reported `up to date`, without a word."""
    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0
    gone = sorted((data / "raw" / "sample_text").glob("*.txt"))[0]
    gone.unlink()
    capsys.readouterr()
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text"]) == 0  # archived raw files are fine
    out = capsys.readouterr().out
    assert f"its raw file raw/sample_text/{gone.name} is gone; its outputs stay in the manifest" in out
    assert "`prep-assets retire sample_text " in out and out.count("NOTE drop") == 1
    # `--all` rebuilt it from the missing file: the drop failed, and left the manifest while the note said it stayed
    manifest = data / "lake" / "sample_text" / "manifest.json"
    before = manifest.read_bytes()
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_text", "--all"]) == 0
    out = capsys.readouterr().out
    assert "its raw file is gone; kept as built, not rematerialized" in out and "FAILED" not in out
    assert f"raw/sample_text/{gone.name} is gone; its outputs stay in the manifest" in out
    assert manifest.read_bytes() == before


def test_a_raw_folder_a_tokenizer_trains_on_is_read_so_never_reported_unread(tmp_path: Path):
    from prep_assets.core.drops import unclaimed_raw_entries
    from prep_assets.orchestrate import _training_folders
    from prep_assets_tests.conftest import make_spec

    for folder in ("tok_corpus", "typo_ds"):
        (tmp_path / "raw" / folder).mkdir(parents=True)
        (tmp_path / "raw" / folder / "a.txt").write_text("words\n")
    spec = make_spec(tokenizer={"train": {"files": ["raw/tok_corpus/*.txt"], "vocab_size": 300}})
    claimed = {spec.name} | _training_folders(tmp_path, [spec])
    assert unclaimed_raw_entries(tmp_path / "raw", claimed) == ["typo_ds/"]


def test_preference_pairs_are_refused_as_a_mix_bucket_and_as_sft_rows_unless_asked_for(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    """A preference dataset as a mix bucket, or read by the SFT loader, trained its rejected answers as targets."""
    from prep_assets.core import reading
    from prep_assets.core.errors import ReadError
    from prep_assets.core.mix import MixError, parse_mix, plan_mix

    data = in_process
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_pref"]) == 0
    lake = data / "lake"
    manifest = lake / "sample_pref" / "manifest.json"
    assert json.loads(manifest.read_text())["pairs"] is True
    with pytest.raises(ReadError, match="pass pairs=True to read them for a preference trainer"):
        reading.PackedRows(manifest)
    rows = reading.PackedRows(manifest, pairs=True)
    assert len(rows) > 0 and str(rows[0]["example_ids"][0]).endswith(("/chosen", "/rejected"))
    phase = {"name": "p", "duration_tokens": 256, "weights": {"pref": 1}}
    raw = {"sources": {"pref": "sample_pref"}, "phases": [phase]}
    spec = parse_mix(raw, path=Path("m.yaml"), default_name="m", datasets={"sample_pref"})
    with pytest.raises(MixError, match="holds preference pairs"):
        plan_mix(spec, lake)


def test_a_header_only_table_drop_builds_empty_and_its_dataset_manifest_publishes(
    in_process: Path, capsys: pytest.CaptureFixture[str]
):
    """A header-only CSV of a grouped table crashed gold (`columns.index(group_by)` of no columns); with that
    fixed, the one-schema manifest gate counted its empty drop as a schema of its own."""
    data = in_process
    raw = data / "raw" / "sample_sensors"
    header = next(raw.glob("*.csv")).read_text(encoding="utf-8").splitlines()[0]
    (raw / "empty.csv").write_text(header + "\n", encoding="utf-8")
    assert main(["run", "--data-dir", str(data), "--dataset", "sample_sensors"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "0 failed" in out.out
    manifest = json.loads((data / "lake" / "sample_sensors" / "manifest.json").read_text())
    assert len(manifest["partitions"]) == 2


def test_backfill_drop_keys_are_read_as_dagster_reads_them():
    """`--drops KEY,` was counted as two runs, Dagster queued one, and the CLI waited for the second forever;
    `KEY,KEY` was refused as "Unknown partitions:" naming none."""
    from prep_assets.cli import drop_keys

    assert drop_keys("a,") == ["a"] and drop_keys(" a , a,b ") == ["a", "b"] and drop_keys(",") == []
