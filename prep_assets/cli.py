"""`prep-assets`: the headless way in. It goes through Dagster, never around it.

prep-assets run [--dataset NAME] [--data-dir DIR] [--all]
    register new drops as partitions and materialize every layer that is missing or out of date,
    as Dagster runs recorded in the instance under $DAGSTER_HOME (visible in the UI afterwards).
prep-assets retire DATASET DROP [--reason TEXT] [--data-dir DIR]
    take a bad drop (partition key or file name) out of the partition set and the manifest; its outputs and raw
    file move under lake/DATASET/retired/<partition>/ with retired.json; the same bytes never come back.
prep-assets backfill DATASET [--drops KEY1,KEY2] [--data-dir DIR] [--no-wait]
    rebuild drops as a Dagster backfill of the <dataset>_drops job (run by the daemon of `prep-assets ui`); waits
    until every run has finished and says how they ended (--no-wait: says how many runs it queued).
prep-assets decode SHARD [--row N] [--format text|json]
    print a packed row as text with masked spans, segments and padding marked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TextIO

from prep_assets.core.errors import PrepAssetsError
from prep_assets.core.lake import data_dir_from_uri
from prep_assets.core.progress import drawing
from prep_assets.defs.resources import DATA_DIR_ENV

DEFAULT_HOME = ".dagster_home"
PROJECT_INSTANCE = Path(__file__).resolve().parents[1] / "dagster.yaml"  # the project's instance config
_DEFAULT_INSTANCE_YAML = """\
telemetry:
  enabled: false
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 1
    dequeue_interval_seconds: 1
"""


def ensure_dagster_home() -> Path:
    """$DAGSTER_HOME, else ./.dagster_home; with a copy of the project's instance config (its `dagster.yaml`, when
    the home has none) and the UI's first-visit note."""
    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    target = home / "dagster.yaml"
    if not target.exists():  # written whole (a process starting beside this one never reads half of it)
        local = PROJECT_INSTANCE if PROJECT_INSTANCE.is_file() else Path("dagster.yaml")
        text = local.read_text(encoding="utf-8") if local.is_file() and local.resolve() != target else None
        tmp = target.with_name(f".dagster.yaml.tmp-{os.getpid()}")
        tmp.write_text(text if text is not None else _DEFAULT_INSTANCE_YAML, encoding="utf-8")
        os.replace(tmp, target)
    nux = home / ".nux" / "nux.yaml"
    if not nux.exists():
        nux.parent.mkdir(parents=True, exist_ok=True)
        nux.write_text("seen: 1\n", encoding="utf-8")
    return home


class TerminalBars:
    """Progress of long layer work drawn as one tqdm bar at a time on a terminal: rows against the total where it
    is known, else the share done (a file's bytes read) with the rows as a suffix; log lines go above it."""

    def __init__(self, stream: TextIO, mininterval: float = 0.1) -> None:
        self.stream, self.mininterval, self.label, self.bar = stream, mininterval, "", None

    def __call__(self, label: str, done: int, total: int | None, share: float | None) -> None:
        from tqdm import tqdm

        if label != self.label or self.bar is None:
            self.close()
            self.label = label
            by_share = total is None and share is not None
            self.bar = tqdm(
                total=total or (100 if by_share else None),
                desc=label,
                unit="%" if by_share else " rows",
                file=self.stream,
                leave=False,
                dynamic_ncols=True,
                mininterval=self.mininterval,
            )
        if self.bar.unit == "%":
            self.bar.n = round(100 * min(share or 0.0, 1.0))
            self.bar.set_postfix_str(f"{done:,} rows", refresh=False)
        else:
            self.bar.n = done
        self.bar.update(0)  # redraws at most every tqdm's mininterval

    def write(self, line: str) -> None:
        """A log line printed above the bar (stdout), the bar redrawn below it."""
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.label, self.bar = "", None


def _resolve_data_dir(arg: str | None) -> Path:
    data_dir = data_dir_from_uri(arg or os.environ.get(DATA_DIR_ENV) or "data")
    if not (data_dir / "datasets").is_dir():
        raise PrepAssetsError(f"{data_dir}: no datasets/ folder here; pass --data-dir or set {DATA_DIR_ENV}")
    return data_dir


def cmd_run(args: argparse.Namespace) -> int:
    data_dir = _resolve_data_dir(args.data_dir)
    home = ensure_dagster_home()
    from prep_assets.orchestrate import run_datasets

    print(f"data dir: {data_dir}\nDAGSTER_HOME: {home}")
    bars = TerminalBars(sys.stderr) if sys.stderr.isatty() else None  # plain progress lines otherwise
    with drawing(bars) if bars is not None else nullcontext():
        report = run_datasets(data_dir, dataset=args.dataset, rerun_all=args.all, log=bars.write if bars else print)
    if bars is not None:
        bars.close()
    print()
    print(format_summary(report["rows"]))
    for m in report.get("mixes", []):
        print(f"mix {m['mix']}: {m['phases']} phase(s), rows per bucket: {m['rows'] or 'none'}; checks {m['checks']}")
    for name in report.get("stale_mixes", []):
        print(
            f"mix {name}: draws on {args.dataset} and is stale; `prep-assets run` without --dataset (or the UI) plans "
            "it again"
        )
    for note in report.get("gone", []):
        print(f"NOTE drop {note}")
    failed = [r for r in report["runs"] if not r["success"]]
    for r in failed:
        print(f"FAILED {r['job']} {r.get('partition') or ''}: {r['error']}", file=sys.stderr)
    for name, error in sorted(report["errors"].items()):
        print(f"FAILED dataset {name}: {error}", file=sys.stderr)
    for name, error in sorted(report.get("mix_errors", {}).items()):
        print(f"FAILED mix {name}: {error}", file=sys.stderr)
    refused = [(name, note) for name, notes in sorted(report.get("refused", {}).items()) for note in notes]
    for name, note in refused:
        print(
            f"NOT READ in raw/{name}/: {note}; move it out of raw/{name}/, or start its name with `_` to keep it "
            "there unread",
            file=sys.stderr,
        )
    unclaimed = report.get("unclaimed", [])
    for entry in unclaimed:
        what = (
            f"no dataset spec datasets/{entry[:-1]}.yaml reads it" if entry.endswith("/") else "not a dataset's folder"
        )
        print(
            f"NOT READ raw/{entry}: {what}; add the spec (or move it into its dataset's folder), or start its name "
            "with `_` to keep it there unread",
            file=sys.stderr,
        )
    env = f"DAGSTER_HOME={home} PREP_ASSETS_DATA_DIR={data_dir} {Path(sys.executable).parent / 'dagster'}"
    ui = f"DAGSTER_HOME={home} {Path(sys.executable).parent / 'prep-assets'} ui --data-dir {data_dir}"
    print(
        f"\n{len(report['runs'])} run(s), {len(failed)} failed, {len(report['errors'])} dataset(s) in error, "
        f"{len(refused)} raw file(s) not read"
        + (
            f", {len(unclaimed)} entr{'y' if len(unclaimed) == 1 else 'ies'} of raw/ no spec reads"
            if unclaimed
            else ""
        )
        + "; "
        f"open the UI: {ui}\n"
        f"rebuild drops while it runs: {Path(sys.executable).parent / 'prep-assets'} backfill <dataset> "
        f"[--drops KEY1,KEY2] --data-dir {data_dir} (it waits for the runs; Dagster's own: {env} job backfill ...)"
    )
    return 1 if failed or report["errors"] or report.get("mix_errors") or refused or unclaimed else 0


_SUMMARY_COLUMNS = (
    "dataset",
    "partition",
    "unit",
    "bronze",
    "silver",
    "gold",
    "examples",
    "tokens",
    "loss_tokens",
    "sequences",
    "utilization",
    "checks",
)
_SUMMARY_LEGEND = (
    "bronze: units parsed (`unit`: JSONL/TXT lines, JSON array elements, table rows; blank lines not counted)"
    "/records kept/rejected; "
    "silver, gold: records in/kept/rejected"
)


def format_summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no drops)"
    table = [list(_SUMMARY_COLUMNS)] + [[str(r.get(c, "")) for c in _SUMMARY_COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_SUMMARY_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"{r['dataset']} {r['partition']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join([*lines, f"({_SUMMARY_LEGEND})", *notes])


UI_WORKSPACE = """\
# written by `prep-assets ui`: the installed package's code location (the data dir comes from PREP_ASSETS_DATA_DIR)
load_from:
  - python_module:
      module_name: prep_assets.code_location
      location_name: prep_assets
"""


def _automation_shown_on(home: Path) -> None:
    """Clear the pre-sensor auto-materialize daemon's pause flag, which a new instance starts with. Our automation
    is an automation condition sensor (on by default), which that flag does not stop; but the UI's job pages show
    the flag as "Auto-materialize off" while automation runs."""
    from dagster import DagsterInstance
    from dagster._daemon.asset_daemon import get_auto_materialize_paused, set_auto_materialize_paused

    with DagsterInstance.from_config(str(home)) as instance:
        if get_auto_materialize_paused(instance):
            set_auto_materialize_paused(instance, False)


def _ui_home(data_dir: Path) -> tuple[Path, dict[str, str]]:
    """$DAGSTER_HOME with the UI's workspace.yaml written in it, and the environment `dagster` runs with there."""
    home = ensure_dagster_home()
    (home / "workspace.yaml").write_text(UI_WORKSPACE, encoding="utf-8")
    return home, {**os.environ, "DAGSTER_HOME": str(home), DATA_DIR_ENV: str(data_dir)}


def cmd_ui(args: argparse.Namespace) -> int:
    """`dagster dev` (webserver and daemons) on this data dir, started in $DAGSTER_HOME so Dagster reads the instance
    config there (no dagster.yaml elsewhere for it to warn about); stops with Ctrl-C."""
    data_dir = _resolve_data_dir(args.data_dir).resolve()
    home, env = _ui_home(data_dir)
    _automation_shown_on(home)
    dagster = Path(sys.executable).parent / "dagster"
    cmd = [str(dagster), "dev", "-w", "workspace.yaml", "-h", args.host, "-p", str(args.port)]
    print(f"data dir: {data_dir}\nDAGSTER_HOME: {home}\nUI: http://{args.host}:{args.port}", flush=True)
    try:
        return subprocess.run(cmd, cwd=home, env=env, check=False).returncode
    except KeyboardInterrupt:
        return 0


_LAUNCHED = re.compile(r"Launched backfill job `([^`]+)`")


def drop_keys(text: str) -> list[str]:
    """`--drops`' keys as Dagster reads them: stripped, each once, none empty. The runs followed are counted from
    these (`KEY,` counted an empty key that Dagster drops: the wait for a second run never ended)."""
    return list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))


def cmd_backfill(args: argparse.Namespace) -> int:
    """Dagster's `job backfill` of the dataset's drop job (it queues one run per drop and returns at once), then,
    unless --no-wait, the runs followed in the instance until each has finished."""
    data_dir = _resolve_data_dir(args.data_dir).resolve()
    from prep_assets.core.drops import registered_drops, superseded_drops
    from prep_assets.core.lake import dataset_paths
    from prep_assets.core.spec import scan_specs
    from prep_assets.defs.keys import drop_job_name

    spec = next((s for s in scan_specs(data_dir / "datasets").specs if s.name == args.dataset), None)
    if spec is None:
        raise PrepAssetsError(f"no loadable dataset {args.dataset!r} in {data_dir / 'datasets'}")
    job = drop_job_name(spec)
    paths = dataset_paths(data_dir, spec.name)
    drops = (
        drop_keys(args.drops)
        if args.drops is not None
        else sorted(set(registered_drops(paths)) - set(superseded_drops(paths)))
    )
    if not drops and args.drops is not None:
        raise PrepAssetsError(f"--drops {args.drops!r} names no drop (give keys separated by commas)")
    if not drops:
        raise PrepAssetsError(f"{args.dataset}: no registered drops in {paths.root} (run `prep-assets run` first)")
    home, env = _ui_home(data_dir)
    cmd = [str(Path(sys.executable).parent / "dagster"), "job", "backfill", "-j", job]
    cmd += ["--partitions", ",".join(drops), "--noprompt", "-w", "workspace.yaml"]
    done = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, check=False)
    launched = _LAUNCHED.search(done.stdout)
    if done.returncode != 0 or launched is None:
        raise PrepAssetsError(f"the backfill was not submitted: {(done.stderr or done.stdout).strip()[-2000:]}")
    backfill = launched.group(1)
    print(f"backfill {backfill}: {len(drops)} run(s) of {job} queued", flush=True)
    if args.no_wait:
        print("they run one at a time under the daemon of `prep-assets ui`; follow them in its Runs page")
        return 0
    return _follow_backfill(backfill, len(drops), args.start_timeout)


def _follow_backfill(backfill: str, expected: int, start_timeout: float) -> int:
    """Poll the instance until the backfill's `expected` runs have all finished, printing each change of counts;
    2 if none started within `start_timeout` seconds (no daemon), 1 if any failed."""
    import time

    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    finished = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    started, last = time.monotonic(), ""
    with DagsterInstance.get() as instance:
        while True:
            runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": backfill}))
            counts = {s: sum(r.status == s for r in runs) for s in DagsterRunStatus}
            line = ", ".join(f"{n} {s.value.lower()}" for s, n in counts.items() if n)
            if line != last:
                print(f"backfill {backfill}: {line}", flush=True)
                last = line
            if len(runs) >= expected and all(r.status in finished for r in runs):
                break
            waiting = all(r.status in (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED) for r in runs)
            if waiting and time.monotonic() - started > start_timeout:
                print(
                    f"no run started within {start_timeout:.0f} s: the runs stay queued until a daemon runs them "
                    "(start `prep-assets ui` on this DAGSTER_HOME)",
                    file=sys.stderr,
                )
                return 2
            time.sleep(1.0)
    failed = counts[DagsterRunStatus.FAILURE] + counts[DagsterRunStatus.CANCELED]
    print(f"backfill {backfill}: {expected - failed} of {expected} run(s) succeeded")
    return 1 if failed else 0


def cmd_retire(args: argparse.Namespace) -> int:
    data_dir = _resolve_data_dir(args.data_dir)
    ensure_dagster_home()
    from prep_assets.orchestrate import retire

    record = retire(data_dir, args.dataset, args.drop, reason=args.reason or "", log=print)
    folder = data_dir / "lake" / args.dataset / "retired" / record["partition"]
    print(
        f"retired {record['partition']} ({record['file']}, sha256 {record['sha256'][:12]}) by {record['retired_by']} "
        f"at {record['retired_at']} in run {record['run_id']}: out of the partitions and the manifest; "
        f"its outputs and raw file are in {folder}"
    )
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from prep_assets.core.decode import decode_row, render_text

    decoded = decode_row(Path(args.shard), args.row)
    print(json.dumps(decoded, indent=2, ensure_ascii=False) if args.format == "json" else render_text(decoded))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prep-assets", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="register drops and materialize every stale layer through Dagster")
    run.add_argument("--dataset", help="only this dataset (default: all specs in <data-dir>/datasets)")
    run.add_argument("--data-dir", help=f"folder with datasets/ and raw/ (default: ${DATA_DIR_ENV} or ./data)")
    run.add_argument("--all", action="store_true", help="rematerialize every partition, even up-to-date ones")
    run.set_defaults(fn=cmd_run)
    ret = sub.add_parser("retire", help="take a bad drop out of the partitions and the manifest, kept for inspection")
    ret.add_argument("dataset")
    ret.add_argument("drop", help="its partition key, or its file name in raw/<dataset>/")
    ret.add_argument("--reason", help="why (kept in retired.json)")
    ret.add_argument("--data-dir", help=f"folder with datasets/ and raw/ (default: ${DATA_DIR_ENV} or ./data)")
    ret.set_defaults(fn=cmd_retire)
    ui = sub.add_parser("ui", help="open the Dagster UI (dagster dev) on the data dir, with this DAGSTER_HOME")
    ui.add_argument("--data-dir", help=f"folder with datasets/ and raw/ (default: ${DATA_DIR_ENV} or ./data)")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(fn=cmd_ui)
    bf = sub.add_parser("backfill", help="rebuild drops through the daemon's queue, waiting until the runs finish")
    bf.add_argument("dataset")
    bf.add_argument("--drops", help="comma-separated partition keys (default: every registered drop)")
    bf.add_argument("--data-dir", help=f"folder with datasets/ and raw/ (default: ${DATA_DIR_ENV} or ./data)")
    bf.add_argument("--no-wait", action="store_true", help="return once the runs are queued")
    bf.add_argument("--start-timeout", type=float, default=120.0, help="seconds to wait for the first run to start")
    bf.set_defaults(fn=cmd_backfill)
    dec = sub.add_parser("decode", help="print a packed row with masks, segments and padding marked")
    dec.add_argument("shard", help="a shard Parquet file (lake/<dataset>/shards/<drop>/<split>/part-*.parquet)")
    dec.add_argument("--row", type=int, default=0)
    dec.add_argument("--format", choices=("text", "json"), default="text")
    dec.set_defaults(fn=cmd_decode)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    saved = os.environ.get("DAGSTER_HOME")
    try:
        return int(args.fn(args))
    except PrepAssetsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:  # a caller in the same process (a test, a notebook) gets its environment back
        if saved is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = saved


def entry() -> int:
    """The `prep-assets` command: a process that only prepares data, as are the processes it starts
    (`keep_torch_out`), then `main`."""
    from prep_assets import NO_TORCH_ENV, keep_torch_out

    os.environ[NO_TORCH_ENV] = "1"
    keep_torch_out()
    try:
        code = main()
        sys.stdout.flush()  # here, not at exit: a reader gone (`| head`) is then handled below
        return code
    except BrokenPipeError:  # the reader of stdout stopped reading (a pager, `head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's flush at exit too
        return 141  # 128 + SIGPIPE, the shell's code for it


if __name__ == "__main__":
    sys.exit(entry())
