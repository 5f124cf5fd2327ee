"""The blocking gates of a training mix, declared once (`MIX_GATES`): each a pure judge of the mix's newest plan
(mix.json, or the plan held because they failed it) and its sources' manifests, returning the `Outcome` every
other gate returns. The Dagster asset checks (`defs/mix.py`) and the tests run these declarations; `publish_mix`
publishes a plan only when every gate passes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from prep_assets.core.invariants.common import Outcome
from prep_assets.core.lake import read_json, sha256_file
from prep_assets.core.mix import MixError, MixSpec, SourceSpec, domain_ranges, held_path, hold_mix, mix_path, write_mix
from prep_assets.core.mix_outputs import curriculum_demand

EXHAUSTION_REMEDY = (
    "lower its weights or the phases' duration_tokens, raise its max_epochs, add drops to its dataset, or set "
    "allow_bucket_exhaustion: true to let it run short"
)


@dataclass(frozen=True)
class MixSubject:
    """What a mix gate judges: the spec, the lake, and the mix (the given plan, else the newest one written: the
    plan held because its gates failed it, if there is one, else the published mix.json)."""

    spec: MixSpec
    lake: Path
    given_mix: dict[str, Any] | None = None

    @cached_property
    def mix(self) -> dict[str, Any]:
        if self.given_mix is not None:
            return self.given_mix
        held = held_path(self.lake, self.spec.name)
        return read_json(held if held.is_file() else mix_path(self.lake, self.spec.name))

    def manifest(self, bucket: str) -> dict[str, Any] | None:
        path = self.lake / self.mix["sources"][bucket]["manifest"]
        return read_json(path) if path.is_file() else None


def human(tokens: float) -> str:
    """Tokens as GPT-Simple prints them: 5.0B, 3.2M, 12.3K, or the count below a thousand."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if tokens >= size:
            return f"{tokens / size:.1f}{unit}"
    return str(int(tokens))


def one_tokenizer(on: MixSubject) -> Outcome:
    sources = on.mix["sources"]
    offending = [
        {"bucket": b, "dataset": s["dataset"], "tokenizer_fingerprint": s["tokenizer_fingerprint"][:12],
         "max_seq_len": s["max_seq_len"]}
        for b, s in sources.items()
    ]  # fmt: skip
    differ = [k for k in ("tokenizer_fingerprint", "max_seq_len") if len({str(r[k]) for r in offending}) > 1]
    if not differ:
        return Outcome(0)
    named = "; ".join(
        f"{k}: " + ", ".join(f"{r['bucket']} ({r['dataset']}) {r[k]}" for r in offending) for k in differ
    )
    return Outcome(
        len(offending) - 1,
        offending,
        {"differ_on": differ},
        f"the mix's sources differ on {' and '.join(differ)} ({named}): a training mix is one token stream; "
        "rebuild the sources with one tokenizer and max_seq_len",
    )


def inventory(on: MixSubject) -> Outcome:
    """Cumulative demand over the phases ≤ inventory × max_epochs per bucket; with allow_bucket_exhaustion a
    shortfall passes with a warning in the facts."""
    mix, L = on.mix, on.mix["max_seq_len"]
    short = []
    for b, figures in mix["buckets"].items():
        if figures["demanded_rows"] > figures["available_rows"]:
            src = mix["sources"][b]
            demand, have = figures["demanded_rows"] * L, figures["available_rows"] * L
            short.append(
                {
                    "bucket": b,
                    "dataset": src["dataset"],
                    "demanded_tokens": demand,
                    "available_tokens": have,
                    "message": f"Mix demands {human(demand)} ({demand:,} tokens, {figures['demanded_rows']} rows) "
                    f"from bucket '{b}' but only {human(have)} available ({figures['inventory_rows']} rows × {L} "
                    f"tokens × max_epochs {src['max_epochs']})",
                }
            )
    facts: dict[str, Any] = {}
    if "gpt_simple_curriculum" in mix.get("outputs", {}):  # the curriculum as GPT-Simple's validator judges it
        curriculum = curriculum_demand(mix)
        facts["curriculum_shortfalls"] = {b: list(v) for b, v in curriculum.items()}
        for b, (demand, have, missing) in curriculum.items():
            short.append(
                {
                    "bucket": b,
                    "dataset": mix["sources"][b]["dataset"],
                    "demanded_tokens": demand,
                    "available_tokens": have,
                    "message": f"Curriculum demands {human(demand)} from bucket '{b}' but only {human(have)} "
                    f"available ({human(missing)} short) in its GPT-Simple files (document tokens, as GPT-Simple's "
                    "validator counts them)",
                }
            )
    if not short:
        return Outcome(0, facts={"warnings": [], **facts})
    messages = [s["message"] for s in short]
    if mix["allow_bucket_exhaustion"]:
        warnings = [f"{m}; allowed by allow_bucket_exhaustion: the bucket runs short" for m in messages]
        return Outcome(0, short, {"warnings": warnings, **facts}, "WARNING: " + "; ".join(warnings))
    return Outcome(
        len(short), short, {"warnings": [], **facts}, "; ".join(messages) + f". Remedy: {EXHAUSTION_REMEDY}"
    )


def budgets(on: MixSubject) -> Outcome:
    total, phases = on.mix["total_tokens"], on.mix["phases"]
    summed = sum(p["duration_tokens"] for p in phases)
    if total is None or total == summed:
        return Outcome(0, facts={"total_tokens": total, "phases_sum": summed})
    return Outcome(
        1,
        [{"phase": p["name"], "duration_tokens": p["duration_tokens"]} for p in phases],
        {"total_tokens": total, "phases_sum": summed},
        f"the phases' duration_tokens add up to {summed:,}, the mix declares total_tokens {total:,}",
    )


def _rows_of(mix: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """Per bucket the (file index, row in file) of every slice the phases name."""
    out: dict[str, list[tuple[int, int]]] = {b: [] for b in mix["sources"]}
    for phase in mix["phases"]:
        for b, figures in phase["buckets"].items():
            out[b] += [(fi, stop - 1) for fi, _start, stop in figures["slices"]]
    return out


def train_only(on: MixSubject) -> Outcome:
    """The mix draws from train, and every file it names is a train file of its source (none of validation or
    test)."""
    offending = []
    if on.mix["split"] != "train":
        offending.append({"bucket": "*", "path": "", "why": f"the mix draws from split {on.mix['split']!r}"})
    for b, src in on.mix["sources"].items():
        manifest = on.manifest(b) or {"splits": {}}
        prefix = src["dataset"] + "/"
        for f in src["files"]:
            where = [
                s for s, v in manifest["splits"].items() if any(prefix + g["path"] == f["path"] for g in v["files"])
            ]
            if where != ["train"]:
                offending.append({"bucket": b, "path": f["path"], "why": f"in split(s) {where or 'none'}"})
    return Outcome(len(offending), offending)


def rows_in_manifest(on: MixSubject) -> Outcome:
    """Every file of the mix is in its source's manifest with the same sha256 and rows, holds those bytes, and every
    row the mix names is inside its file."""
    offending = []
    for b, src in on.mix["sources"].items():
        manifest = on.manifest(b)
        listed = {} if manifest is None else {
            src["dataset"] + "/" + g["path"]: g for v in manifest["splits"].values() for g in v["files"]
        }  # fmt: skip
        for f in src["files"]:
            entry, path = listed.get(f["path"]), on.lake / f["path"]
            if entry is None:
                why = "not in its source manifest"
            elif (entry["sha256"], entry["sequences"]) != (f["sha256"], f["sequences"]):
                why = "sha256 or rows differ from its source manifest's"
            elif not path.is_file() or sha256_file(path) != f["sha256"]:
                why = "missing, or its bytes differ from the recorded sha256"
            else:
                continue
            offending.append({"bucket": b, "path": f["path"], "why": why})
        for fi, last in _rows_of(on.mix)[b]:
            if not (0 <= fi < len(src["files"]) and last < src["files"][fi]["sequences"]):
                offending.append({"bucket": b, "path": f"file {fi}", "why": f"row {last} outside the file"})
        if "ranges" in src and manifest is not None:
            offending += _outside_domains(on.mix, b, src, manifest)
    return Outcome(len(offending), offending)


def _outside_domains(mix: dict[str, Any], b: str, src: dict[str, Any], manifest: dict[str, Any]) -> list[dict]:
    """A bucket narrowed to domains: its ranges are still its manifest's, and every slice lies inside one."""
    try:
        now = domain_ranges(manifest, SourceSpec(dataset=src["dataset"], domains=src["domains"]), f"sources.{b}")
    except MixError as exc:
        return [{"bucket": b, "path": src["manifest"], "why": str(exc)}]
    if now != src["ranges"]:
        return [{"bucket": b, "path": src["manifest"], "why": "its domains' row ranges differ from the manifest's"}]
    return [
        {"bucket": b, "path": f"file {fi}", "why": f"rows [{start}, {stop}) outside the domains {src['domains']}"}
        for phase in mix["phases"]
        for fi, start, stop in phase["buckets"][b]["slices"]
        if not any(r[0] == fi and r[1] <= start and stop <= r[2] for r in src["ranges"])
    ]


@dataclass(frozen=True)
class MixGate:
    """One blocking gate of a mix: its check's name, its description and its judge."""

    name: str
    description: str
    judge: Callable[[MixSubject], Outcome]

    def evaluate(self, subject: MixSubject) -> Outcome:
        outcome = self.judge(subject)
        return replace(outcome, name=self.name, description=outcome.description or self.description)


MIX_GATES: tuple[MixGate, ...] = (
    MixGate(
        "training_mix_one_tokenizer",
        "all sources share one tokenizer fingerprint and max_seq_len (else the sources that differ are named)",
        one_tokenizer,
    ),
    MixGate(
        "training_mix_inventory",
        "cumulative demand per bucket over the phases ≤ its train rows × max_epochs, unless "
        "allow_bucket_exhaustion (then a warning)",
        inventory,
    ),
    MixGate("training_mix_budgets", "the phases' duration_tokens add up to total_tokens, when declared", budgets),
    MixGate("training_mix_train_only", "no validation or test row enters a training mix", train_only),
    MixGate(
        "training_mix_rows_in_manifest",
        "every row of the mix is in its source manifest, in a file with the recorded sha256 (and, for a bucket "
        "narrowed to domains, inside those domains' row ranges)",
        rows_in_manifest,
    ),
)


def judge_mix(spec: MixSpec, lake: Path, mix: dict[str, Any] | None = None) -> list[Outcome]:
    subject = MixSubject(spec, lake, mix)
    return [g.evaluate(subject) for g in MIX_GATES]


def publish_mix(spec: MixSpec, lake: Path, mix: dict[str, Any]) -> tuple[Path, list[Outcome]]:
    """`mix` published as the mix's mix.json when every gate passes it, else held apart (`hold_mix`) with the
    published mix left as it was; the path written and the gates' outcomes."""
    outcomes = judge_mix(spec, lake, mix)
    if all(o.passed for o in outcomes):
        return write_mix(spec, lake, mix), outcomes
    return hold_mix(spec, lake, mix), outcomes
