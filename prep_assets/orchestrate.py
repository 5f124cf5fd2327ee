"""Headless orchestration: register drops and launch the dataset jobs as real Dagster runs.

Runs are recorded in the instance under $DAGSTER_HOME, so the UI shows them afterwards. A partition
is rerun when any of its layers has never been materialized, was materialized with another code
version (a spec field that shapes that layer changed, `checks` included) or with another tokenizer,
lost its output, or has a gate that failed or did not run on its latest materialization. The tokenizer
is re-pinned when its sources (training files, source directory) changed. Drops replaced by a changed
file of the same name are reported and left alone.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    ExecuteInProcessResult,
    RunsFilter,
)

from prep_assets.core.bronze import BronzeStats
from prep_assets.core.dedup import earlier_set_changed, remove_other_indexes
from prep_assets.core.drops import register_drops, registered_drops, superseded_drops, unclaimed_raw_entries
from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.gold import GoldStats
from prep_assets.core.lake import (
    ACCOUNTING,
    STATS,
    DatasetPaths,
    dataset_paths,
    exclusive,
    process_alive,
    process_tag,
    read_json,
    sweep_stale_staging,
    verify_published,
)
from prep_assets.core.mix import MixSpec, held_path, mix_inputs_digest, mix_path, scan_mixes
from prep_assets.core.progress import bar_shown, reporting
from prep_assets.core.shards import ShardStats
from prep_assets.core.silver import SilverStats, repeats_of_earlier_drops
from prep_assets.core.spec import DatasetSpec, scan_specs
from prep_assets.core.stats import S
from prep_assets.core.tokenizer import FINGERPRINT_FILE, source_digest
from prep_assets.definitions import build_definitions
from prep_assets.defs.checks import unpassed_gates
from prep_assets.defs.keys import (
    CLEAN_RECORDS,
    PACKED_SHARDS,
    RAW_RECORDS,
    TOKENIZED_EXAMPLES,
    TOKENIZER,
    asset_key,
    code_version,
    drop_job_name,
    manifest_job_name,
    mix_asset_key,
    mix_job_name,
    tokenizer_job_name,
)
from prep_assets.defs.mix import INPUTS_DIGEST
from prep_assets.defs.partitions import drops_partitions

_LAYER_OF = {RAW_RECORDS: "bronze", CLEAN_RECORDS: "silver", TOKENIZED_EXAMPLES: "gold", PACKED_SHARDS: "shards"}
_QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _latest(instance: DagsterInstance, key: AssetKey, partition: str | None) -> dict[str, Any] | None:
    flt = AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    records = instance.fetch_materializations(flt, limit=1).records
    if not records:
        return None
    mat = records[0].event_log_entry.asset_materialization
    assert mat is not None
    return {"tags": dict(mat.tags or {}), "metadata": {k: getattr(v, "value", v) for k, v in mat.metadata.items()}}


def _fresh(
    instance: DagsterInstance,
    spec: DatasetSpec,
    name: str,
    layer: str,
    partition: str | None,
    output: Path,
    fingerprint: str | None,
    log: Callable[[str], None] = print,
) -> bool:
    latest = _latest(instance, asset_key(spec, name), partition)
    if latest is None or not output.exists():
        return False
    problems = verify_published(output)  # "up to date" means the published bytes are the recorded ones
    if problems:
        log(f"[{spec.name}] rebuilding {layer} {partition or ''}: " + "; ".join(problems[:3]))
        return False
    if latest["tags"].get("dagster/code_version") != code_version(spec, layer):
        return False
    recorded = latest["metadata"].get("tokenizer_fingerprint")
    return recorded is None or fingerprint is None or recorded == fingerprint


def partition_up_to_date(
    instance: DagsterInstance,
    spec: DatasetSpec,
    paths: DatasetPaths,
    partition: str,
    log: Callable[[str], None] = print,
) -> bool:
    """Every layer materialized with today's code version and tokenizer, its files the bytes recorded when it was
    published, and every gate passed on it (and with dedup_scope dataset, silver built against the drops that
    count as earlier today)."""
    fingerprint = _fingerprint(paths)
    fresh = all(
        _fresh(instance, spec, name, layer, partition, paths.partition_dir(layer, partition), fingerprint, log)
        for name, layer in _LAYER_OF.items()
    )
    if not fresh or earlier_set_changed(spec, paths, partition):
        return False
    return not unpassed_gates(instance, spec, [partition])[partition]


def tokenizer_up_to_date(
    instance: DagsterInstance,
    spec: DatasetSpec,
    paths: DatasetPaths,
    data_dir: Path,
    log: Callable[[str], None] = print,
) -> bool:
    """Pinned with today's code version from sources that have not changed since, its files as published."""
    if not _fresh(instance, spec, TOKENIZER, "tokenizer", None, paths.tokenizer_dir, None, log):
        return False
    recorded = read_json(paths.tokenizer_dir / FINGERPRINT_FILE).get("source_digest")
    try:
        return recorded == source_digest(spec.tokenizer, data_dir)
    except OSError:
        return False


def _fingerprint(paths: DatasetPaths) -> str | None:
    fp = paths.tokenizer_dir / FINGERPRINT_FILE
    return read_json(fp)["fingerprint"] if fp.is_file() else None


def _violations(evaluation: AssetCheckEvaluation) -> str:
    """' (3 violations)': what a failed gate counted (`defs.checks.outcome_result`), where it says."""
    n = getattr(evaluation.metadata.get("num_violations"), "value", None)
    return f" ({n} violation{'' if n == 1 else 's'})" if isinstance(n, int) else ""


def _failure(result: ExecuteInProcessResult) -> str:
    reasons = [
        f"check {e.check_name} failed{_violations(e)}" + (f": {e.description}" if e.description else "")
        for e in result.get_asset_check_evaluations()
        if not e.passed
    ]
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            if reasons and getattr(event.step_failure_data.error, "cls_name", None) == "DagsterAssetCheckFailedError":
                continue  # the failed checks, named above with what they found
            error = event.step_failure_data.user_failure_data
            message = error.description if error is not None else event.step_failure_data.error.message
            reasons.append(f"{event.step_key}: {(message or '').strip().splitlines()[0] if message else ''}")
    return "; ".join(r for r in reasons if r) or "run failed"


def _launch(defs: Definitions, instance: DagsterInstance, job: str, partition: str | None = None) -> dict[str, Any]:
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance,
        partition_key=partition,
        raise_on_error=False,
        run_config=_QUIET,
        tags={PROCESS_TAG: process_tag()},
    )
    checks = result.get_asset_check_evaluations()
    return {
        "job": job,
        "partition": partition,
        "run_id": result.run_id,
        "success": result.success,
        "checks_passed": sum(1 for c in checks if c.passed),
        "checks_run": len(checks),
        "error": "" if result.success else _failure(result),
    }


def summary_row(spec: DatasetSpec, paths: DatasetPaths, partition: str, run: dict[str, Any] | None) -> dict[str, Any]:
    """One drop's line of the run summary: where its records went at each layer, and what it became."""

    def stats(layer: str, name: str, kind: type[S]) -> S | None:
        path = paths.partition_dir(layer, partition) / name
        return kind.from_json(read_json(path)) if path.is_file() else None

    def flow(total: Any, kept: Any, rejects: Any) -> str:
        return f"{total}/{kept}/{rejects}"

    b, s = stats("bronze", ACCOUNTING, BronzeStats), stats("silver", STATS, SilverStats)
    g, p = stats("gold", STATS, GoldStats), stats("shards", STATS, ShardStats)
    checks = "up to date" if run is None else f"{run['checks_passed']}/{run['checks_run']}"
    if run is not None and not run["success"]:
        checks += " FAILED"
    totals = p.totals if p else {}
    repeats = repeats_of_earlier_drops(spec, paths, partition)  # asked now, once every drop of the run is built
    return {
        "dataset": spec.name,
        "partition": partition,
        "unit": b.unit if b else "",  # what bronze read: lines, JSON array elements or table rows
        "bronze": flow(b.records + b.rejects, b.records, b.rejects) if b else "",
        "silver": flow(s.records_in, s.records, s.rejects) if s else "",
        # silver's stats may be gone after a failure
        "gold": flow(s.records, s.records - g.rejects, g.rejects) if g and s else "",
        "examples": g.examples if g else "",
        "tokens": g.tokens if g else "",
        "loss_tokens": g.loss_tokens if g else "",
        "sequences": totals.get("sequences", ""),
        "utilization": totals.get("sequence_utilization", ""),
        "checks": checks,
        "note": f"{repeats} records of this drop repeat earlier drops; set clean.dedup_scope: dataset to remove them"
        if repeats
        else "",
    }


def run_datasets(
    data_dir: Path, *, dataset: str | None = None, rerun_all: bool = False, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Register drops and materialize what is missing or stale, dataset by dataset.

    A dataset whose spec does not load, or whose run cannot start (no tokenizer, an unreadable drop), is
    reported in `errors` by name; every other dataset runs as usual. Files of a raw folder that no reader
    reads (a symlink, a folder, a name without a reader's suffix) are listed in `refused` by dataset; on a run of
    every dataset, what `raw/` holds that no spec reads (a folder without a spec) in `unclaimed`."""
    scan = scan_specs(data_dir / "datasets")
    names = sorted([s.name for s in scan.specs] + list(scan.broken))
    if dataset is not None:
        if dataset not in names:
            raise PrepAssetsError(f"no dataset {dataset!r} in {data_dir / 'datasets'}; available: {names}")
        scan = scan.only(dataset)
    defs = build_definitions(data_dir, dataset)
    report: dict[str, Any] = {"rows": [], "runs": [], "errors": dict(scan.broken), "refused": {}}
    # overlapping runs on one data dir take turns (the later one then finds the work done), whatever their
    # DAGSTER_HOME: each publishes whole outputs, and the manifest is judged on settled gate results
    with exclusive(data_dir / "lake" / RUN_LOCK, lambda: log("waiting for another prep-assets run on this data dir")):
        instance = _instance()
        _fail_dead_runs(instance, log)
        for spec in scan.specs:
            try:
                _run_dataset(defs, instance, spec, data_dir, rerun_all, log, report)
            except PrepAssetsError as exc:
                report["errors"][spec.name] = str(exc)
            except (OSError, ValueError) as exc:  # an unreadable file or record of the lake: this dataset only
                report["errors"][spec.name] = f"{type(exc).__name__}: {exc}"
        if dataset is None:
            claimed = set(names) | _training_folders(data_dir, scan.specs)
            report["unclaimed"] = unclaimed_raw_entries(data_dir / "raw", claimed)
            _run_mixes(defs, instance, data_dir, {s.name for s in scan.specs} | set(scan.broken), rerun_all, report)
        else:
            report["stale_mixes"] = stale_mixes(instance, data_dir, dataset, set(names))
    return report


def _training_folders(data_dir: Path, specs: Iterable[DatasetSpec]) -> set[str]:
    """The folders of `raw/` a spec's tokenizer trains on (`tokenizer.train.files`): read, though by no dataset."""
    raw = (data_dir / "raw").resolve()
    out: set[str] = set()
    for spec in specs:
        train = spec.tokenizer.train
        for pattern in train.files if train is not None else []:
            where = pattern if Path(pattern).is_absolute() else str(data_dir / pattern)
            for match in glob.glob(where, recursive=True):
                path = Path(match).resolve()
                if path != raw and path.is_relative_to(raw):
                    out.add(path.relative_to(raw).parts[0])
    return out


def stale_mixes(instance: DagsterInstance, data_dir: Path, dataset: str, datasets: set[str]) -> list[str]:
    """The mixes drawing on `dataset` that are not up to date (`run --dataset` leaves mixes alone: it names them)."""
    out = []
    for spec in scan_mixes(data_dir / "mixes", datasets).mixes:
        if all(src.dataset != dataset for src in spec.sources.values()):
            continue
        try:
            fresh = mix_up_to_date(instance, spec, data_dir / "lake")
        except (PrepAssetsError, OSError, ValueError):  # a source without a manifest yet: it cannot be up to date
            fresh = False
        if not fresh:
            out.append(spec.name)
    return out


def mix_up_to_date(instance: DagsterInstance, spec: MixSpec, lake: Path) -> bool:
    """The mix's latest materialization was planned from today's spec, code and source manifests, and its
    mix.json holds the bytes published then; a new drop in a source (a new manifest) makes it stale."""
    latest = _latest(instance, mix_asset_key(spec.name), None)
    folder = mix_path(lake, spec.name).parent
    if latest is None or not folder.is_dir() or verify_published(folder) or held_path(lake, spec.name).is_file():
        return False  # a held plan (its gates failed it) is planned and judged again on every run
    return latest["metadata"].get(INPUTS_DIGEST) == mix_inputs_digest(spec, lake)


def _run_mixes(
    defs: Definitions, instance: DagsterInstance, data_dir: Path, datasets: set[str], rerun_all: bool, report: dict
) -> None:
    """Every mix of `mixes/` after the datasets: materialized when missing or stale; one line each in `mixes`."""
    scan = scan_mixes(data_dir / "mixes", datasets)
    report["mix_errors"] = dict(scan.broken)
    report["mixes"] = []
    for spec in scan.mixes:
        run = None
        if rerun_all or not mix_up_to_date(instance, spec, data_dir / "lake"):
            run = _launch(defs, instance, mix_job_name(spec.name))
            report["runs"].append(run)
        path = mix_path(data_dir / "lake", spec.name)
        mix = read_json(path) if path.is_file() else {"buckets": {}, "phases": []}
        rows = ", ".join(f"{b} {f['rows']}" for b, f in mix["buckets"].items())
        checks = "up to date" if run is None else f"{run['checks_passed']}/{run['checks_run']}"
        checks += "" if run is None or run["success"] else " FAILED"
        held = held_path(data_dir / "lake", spec.name)
        if held.is_file():  # the newest plan failed its gates: the rows shown are those of the last that passed
            last = "mix.json is the last plan that passed" if path.is_file() else "no plan has passed yet"
            checks += f" (plan held at {held}; {last})"
        report["mixes"].append({"mix": spec.name, "phases": len(mix["phases"]), "rows": rows, "checks": checks})


RUN_LOCK = ".run.lock"
PROCESS_TAG = "prep_assets/process"
_UNFINISHED = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def _instance() -> DagsterInstance:
    """The instance of $DAGSTER_HOME, its storage created by one process at a time (two processes creating the
    schema of a fresh SQLite instance at once race on its tables)."""
    home = Path(os.environ["DAGSTER_HOME"])
    with exclusive(home / ".prep_assets_init.lock"):
        instance = DagsterInstance.get()
        instance.get_runs(limit=1)
        instance.get_asset_keys(limit=1)
        instance.all_instigator_state()
    return instance


def _fail_dead_runs(instance: DagsterInstance, log: Callable[[str], None]) -> None:
    """Runs this command started in a process that died (killed, out of memory) are marked failed, not left
    STARTED for ever; runs of processes still alive, or of other machines, are left alone."""
    for run in instance.get_runs(RunsFilter(statuses=_UNFINISHED)):
        tag = run.tags.get(PROCESS_TAG)
        if tag is not None and not process_alive(tag):
            instance.report_run_failed(run, message=f"the process that ran it ({tag}) is gone: it was killed or died")
            log(f"marked run {run.run_id} ({run.job_name}) failed: its process {tag} is gone")


def _run_dataset(
    defs: Definitions,
    instance: DagsterInstance,
    spec: DatasetSpec,
    data_dir: Path,
    rerun_all: bool,
    log: Callable[[str], None],
    report: dict[str, Any],
) -> None:
    rows, runs = report["rows"], report["runs"]
    paths = dataset_paths(data_dir, spec.name)
    for left in sweep_stale_staging(paths.root):
        log(f"[{spec.name}] removed {left.name}, left by a process that died while writing")
    refused: list[str] = []  # files of raw/ no reader reads: the run fails for them once its drops are built
    new, notes = register_drops(paths, refused)
    for note in [*refused, *notes]:
        log(f"[{spec.name}] {note}")
    if refused:
        report["refused"][spec.name] = refused
    for drop in new:
        log(f"[{spec.name}] new drop {drop.file} -> partition {drop.partition}")
    keys = sorted(registered_drops(paths))
    pdef_name = drops_partitions(spec.name).name
    known = set(instance.get_dynamic_partitions(pdef_name))
    instance.add_dynamic_partitions(pdef_name, [k for k in keys if k not in known])
    if rerun_all or not tokenizer_up_to_date(instance, spec, paths, data_dir, log):
        log(f"[{spec.name}] materializing tokenizer")
        run = _launch(defs, instance, tokenizer_job_name(spec))
        runs.append(run)
        if not run["success"]:
            return
    superseded = superseded_drops(paths)
    drops = registered_drops(paths)
    gone = {k for k, d in drops.items() if k not in superseded and not (paths.raw_dir / d.file).is_file()}
    unbuilt: set[str] = set()  # drops whose raw file is gone that this run tried to rebuild and could not
    for key in keys:
        run = None
        if key in superseded:
            rows.append({**summary_row(spec, paths, key, None), "checks": f"superseded by {superseded[key]}"})
            continue
        current = None if rerun_all and key not in gone else partition_up_to_date(instance, spec, paths, key, log)
        if rerun_all and current:  # `--all` cannot rebuild a drop without its raw file: its built bytes stand
            log(f"[{spec.name}] drop {key}: its raw file is gone; kept as built, not rematerialized")
        elif not current:
            log(f"[{spec.name}] materializing drop {key}")
            # long layers' progress as plain lines, unless a bar draws it on this terminal
            lines = nullcontext() if bar_shown() else reporting(lambda line: log(f"[{spec.name}] {line}"))
            with lines:
                run = _launch(defs, instance, drop_job_name(spec), key)
            runs.append(run)
            if key in gone and not run["success"]:
                unbuilt.add(key)
        rows.append(summary_row(spec, paths, key, run))
    drops = registered_drops(paths)  # read again: a drop retired from the UI meanwhile is not noted
    for key in keys:  # its outputs stay (raw files may be archived once built); say so, and how to take it out
        drop = drops.get(key)
        if drop is not None and key in gone:
            raw = f"raw/{spec.name}/{drop.file}"
            report.setdefault("gone", []).append(
                f"{spec.name} {key}: its raw file {raw} is gone and its layers are not up to date (never built, "
                f"or built with another spec or code version), which cannot be rebuilt without it: no new manifest "
                f"includes the drop; put the file back, or `prep-assets retire {spec.name} {key}` takes it out"
                if key in unbuilt
                else f"{spec.name} {key}: its raw file {raw} is gone; its outputs stay in the manifest "
                f"(`prep-assets retire {spec.name} {key}` takes the drop out)"
            )
    runs.append(_launch(defs, instance, manifest_job_name(spec)))
    for folder, size in remove_other_indexes(spec, paths):
        log(f"[{spec.name}] removed the dedup indexes of an earlier configuration: {folder} ({size / 2**20:.1f} MiB)")


def retire(data_dir: Path, dataset: str, drop: str, reason: str = "", log: Callable[[str], None] = print) -> dict:
    """Run the dataset's retire job in process (a Dagster run in the instance, as the UI's would be): the drop
    leaves the partition set and the manifest, its outputs and raw file go under `lake/<dataset>/retired/`."""
    from prep_assets.core.retire import RECORD
    from prep_assets.defs.retire import retire_job_name, retire_op_name

    spec = next((s for s in scan_specs(data_dir / "datasets").specs if s.name == dataset), None)
    if spec is None:
        raise PrepAssetsError(f"no dataset {dataset!r} with a spec that loads in {data_dir / 'datasets'}")
    defs = build_definitions(data_dir, dataset)
    config = {"ops": {retire_op_name(spec): {"config": {"drop": drop, "reason": reason}}}}
    with exclusive(data_dir / "lake" / RUN_LOCK, lambda: log("waiting for another prep-assets run on this data dir")):
        result = defs.resolve_job_def(retire_job_name(spec)).execute_in_process(
            instance=_instance(),
            run_config={**_QUIET, **config},
            raise_on_error=False,
            tags={PROCESS_TAG: process_tag()},
        )
    if not result.success:
        raise PrepAssetsError(_failure(result))
    records = sorted(dataset_paths(data_dir, dataset).retired_dir.glob(f"*/{RECORD}"), key=lambda p: p.stat().st_mtime)
    return {"run_id": result.run_id, **read_json(records[-1])}
