"""Training mixes: `data/mixes/<name>.yaml` weighs the train rows of several datasets (buckets) over phases, and
`plan_mix` turns it, with the sources' manifests, into `lake/_mixes/<name>/mix.json`.

A token budget counts rows × `max_seq_len` (what a trainer consumes, padding included), so a demand is a whole
number of rows: bucket b of phase p takes `ceil(share × duration_tokens / max_seq_len)` rows, share = its weight
over the phase's weights. Each bucket is one stream of its split's rows, epoch after epoch in the order
`reading.order(N, bucket seed, epoch)`; the phases take consecutive runs of it, at most N × `max_epochs` rows in
all. Within a phase the buckets are interleaved by the closed form key (2k + 1) / (2 n_b) of a bucket's k-th row
(ties by bucket order), so the order is reproducible from mix.json alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow.parquet as pq
from pydantic import BeforeValidator, Field, StrictBool, ValidationError, model_validator

from prep_assets.core.errors import PrepAssetsError, SpecError
from prep_assets.core.lake import partition_lock, read_json, sha256_file, staged_dir, write_json_atomic
from prep_assets.core.mix_outputs import Output, gpt_simple_layout, megatron_blend, write_outputs
from prep_assets.core.reading import order
from prep_assets.core.spec import _format_error, load_document
from prep_assets.core.spec_sections import _Strict

MIXES_DIR = "_mixes"  # lake/_mixes/<name>/: no dataset name starts with "_"
HELD_DIR = "_held"  # lake/_mixes/_held/<name>/: a plan its gates failed (no mix name starts with "_")
MIX_FILE = "mix.json"
MIX_VERSION = "2"  # bump when the plan or mix.json's layout changes
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class MixError(PrepAssetsError):
    """A mix cannot be planned from its sources (a source without a manifest or without rows in the split)."""


def _a_number(value: Any) -> Any:
    """A count or weight as written: a number, never a boolean (YAML reads `yes` as true, which a number field
    would take as 1) nor a string (a quoted '0.5')."""
    if isinstance(value, bool):
        raise ValueError(f"a number, not {value!r}")
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            raise ValueError(f"a number, not {value!r}") from None
        raise ValueError(
            f"a number, not the text {value!r} (quoted, or an exponent YAML reads as text: it needs a dot and a "
            "sign, as in 1.0e-3 or 2.0e+9)"
        )
    return value


Count = Annotated[int, BeforeValidator(_a_number)]  # an integral float (1e9) is taken, as pydantic does
Weight = Annotated[float, BeforeValidator(_a_number)]


class SourceSpec(_Strict):
    dataset: str
    max_epochs: Count = Field(default=1, ge=1)  # a small source may repeat up to this many times (upsampling)
    # narrow the bucket to these domains of a dataset with input.domain_key (its shards' domain-pure row ranges)
    domains: list[str] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> SourceSpec:
        if self.domains is not None and len(set(self.domains)) != len(self.domains):
            raise ValueError(f"domains: each domain once, got {self.domains}")
        return self


class PhaseSpec(_Strict):
    name: str
    duration_tokens: Count = Field(gt=0)
    weights: dict[str, Weight]

    @model_validator(mode="after")
    def _weights(self) -> PhaseSpec:
        weights = self.weights.values()
        total = sum(weights)  # finite each, their sum may still overflow (1e308 twice): every share would be 0
        if not self.weights or any(not math.isfinite(w) or w < 0 for w in weights) or not 0 < total < math.inf:
            raise ValueError("weights: give each bucket a finite weight >= 0, at least one above 0")
        return self


class MixSpec(_Strict):
    name: str
    description: str = ""
    sources: dict[str, SourceSpec]
    phases: list[PhaseSpec]
    total_tokens: Count | None = Field(default=None, gt=0)  # when given, the phases' durations must add up to it
    split: str = "train"
    seed: Count = Field(default=0, ge=0)
    allow_bucket_exhaustion: StrictBool = False
    max_items: Count | None = Field(default=None, ge=1)  # at most this many rows per bucket and phase (quick runs)
    outputs: list[Output] = []  # what to write for trainers beside mix.json (core/mix_outputs.py)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, raw: Any) -> Any:
        """`sources: {b: dataset}` for `{b: {dataset: ...}}`; top-level `weights` + `duration_tokens` for a
        single phase named `main`."""
        if not isinstance(raw, dict):
            return raw
        raw = dict(raw)
        if isinstance(raw.get("sources"), dict):
            raw["sources"] = {k: {"dataset": v} if isinstance(v, str) else v for k, v in raw["sources"].items()}
        if "phases" not in raw and ("weights" in raw or "duration_tokens" in raw):
            phase = {"name": "main", **{k: raw.pop(k) for k in ("weights", "duration_tokens") if k in raw}}
            raw["phases"] = [phase]
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> MixSpec:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"name {self.name!r}: use lower-case letters, digits and _ (starting with a letter)")
        if self.split != "train":
            raise ValueError(
                f"split {self.split!r}: a training mix draws from train only; validation and test rows never "
                "enter a training mix"
            )
        if not self.sources:
            raise ValueError("sources: name at least one bucket (bucket: dataset)")
        bad = [b for b in self.sources if not _NAME_RE.match(b)]
        if bad:
            raise ValueError(f"sources: bucket names {bad}: use lower-case letters, digits and _")
        by_dataset: dict[str, list[str]] = {}
        for b, src in self.sources.items():
            by_dataset.setdefault(src.dataset, []).append(b)
        for dataset, buckets in by_dataset.items():
            domains = [self.sources[b].domains for b in buckets]
            named = [d for ds in domains if ds is not None for d in ds]
            if len(buckets) > 1 and (None in domains or len(set(named)) < len(named)):
                raise ValueError(
                    f"sources: buckets {buckets} all draw on dataset {dataset!r}: a row could be taken by more than "
                    "one of them; give the dataset one bucket, or each bucket domains of its own"
                )
        if not self.phases:
            raise ValueError("phases: give at least one phase (or top-level weights and duration_tokens)")
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError(f"outputs: each output once, got {self.outputs}")
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phases: names must be unique, got {names}")
        for i, p in enumerate(self.phases):
            unknown = sorted(set(p.weights) - set(self.sources))
            if unknown:
                raise ValueError(f"phases.{i}.weights: unknown bucket(s) {unknown}; buckets: {sorted(self.sources)}")
        return self

    def fingerprint(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def parse_mix(raw: Any, *, path: Path, default_name: str, datasets: set[str] | None = None) -> MixSpec:
    """Validate a parsed mix document; errors name the file, the key and what is allowed. With `datasets`, a
    source naming another dataset is an error."""
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: the mix must be a mapping of keys (got {type(raw).__name__})")
    if raw.get("name", default_name) != default_name:
        raise SpecError(f"{path}: name: {raw['name']!r} must equal the file name {default_name!r} (or leave it out)")
    try:
        spec = MixSpec.model_validate({**raw, "name": default_name})
    except ValidationError as exc:
        raise SpecError("\n".join(_format_error(path, e, MixSpec) for e in exc.errors())) from None
    if datasets is not None:
        unknown = [f"{path}: sources.{b}.dataset: unknown dataset {s.dataset!r}; datasets: {sorted(datasets)}"
                   for b, s in spec.sources.items() if s.dataset not in datasets]  # fmt: skip
        if unknown:
            raise SpecError("\n".join(unknown))
    return spec


def load_mix(path: Path, datasets: set[str] | None = None) -> MixSpec:
    raw = load_document(path)
    return parse_mix(raw, path=path, default_name=path.stem, datasets=datasets)


@dataclass(frozen=True)
class MixScan:
    """The mixes of a data dir: the valid ones, and each broken one's error by mix name (its file stem)."""

    mixes: list[MixSpec]
    broken: dict[str, str]


def scan_mixes(mixes_dir: Path, datasets: set[str]) -> MixScan:
    """Every mix under `mixes/`, sources checked against the dataset names (one broken file never hides others)."""
    mixes: list[MixSpec] = []
    broken: dict[str, str] = {}
    for path in sorted(mixes_dir.glob("*.yaml")) + sorted(mixes_dir.glob("*.yml")):
        try:
            mixes.append(load_mix(path, datasets))
        except SpecError as exc:
            broken[path.stem] = str(exc)
    return MixScan(sorted(mixes, key=lambda m: m.name), broken)


def mix_path(lake: Path, name: str) -> Path:
    return lake / MIXES_DIR / name / MIX_FILE


def held_path(lake: Path, name: str) -> Path:
    """Where a mix's newest plan is kept when its gates failed it, apart from the published mix.json."""
    return lake / MIXES_DIR / HELD_DIR / name / MIX_FILE


def bucket_seed(seed: int, bucket: str) -> int:
    """The seed of a bucket's stream: the first 6 bytes of sha256("<mix seed>/<bucket>"), recorded in mix.json."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{bucket}".encode()).digest()[:6], "big")


def demanded_rows(share: float, duration_tokens: int, max_seq_len: int) -> int:
    return math.ceil(share * duration_tokens / max_seq_len - 1e-9)


# ---------------------------------------------------------------- the plan


def _source(lake: Path, bucket: str, src: SourceSpec, split: str, seed: int, mix: str) -> dict[str, Any]:
    manifest_file = lake / src.dataset / "manifest.json"
    if not manifest_file.is_file():
        raise MixError(f"source {bucket!r}: dataset {src.dataset!r} has no manifest yet ({manifest_file})")
    manifest = read_json(manifest_file)
    if manifest.get("pairs"):
        raise MixError(
            f"source {bucket!r}: dataset {src.dataset!r} holds preference pairs (chosen and rejected answers in one "
            "row, for a DPO trainer): a mix's rows train every loss token, so the rejected answers would be learned; "
            "train pairs from the dataset's own manifest with a preference trainer"
        )
    files = manifest["splits"].get(split, {}).get("files", [])
    tokens: list[np.ndarray] = []
    loss: list[np.ndarray] = []
    for f in files:
        table = pq.read_table(manifest_file.parent / f["path"], columns=["seq_lengths", "num_loss_tokens"])
        lengths = table.column("seq_lengths").combine_chunks()
        offsets = lengths.offsets.to_numpy()
        cum = np.concatenate([[0], np.cumsum(lengths.values.to_numpy(zero_copy_only=False).astype(np.int64))])
        sums = cum[offsets[1:]] - cum[offsets[:-1]]
        tokens.append(sums)
        loss.append(table.column("num_loss_tokens").to_numpy().astype(np.int64))
    ranges = domain_ranges(manifest, src, f"mixes/{mix}.yaml: sources.{bucket}.domains") if src.domains else None
    starts = np.cumsum([0] + [f["sequences"] for f in files])
    rowmap = (
        np.concatenate(
            [np.arange(starts[fi] + a, starts[fi] + b, dtype=np.int64) for fi, a, b in ranges] or [[]]
        ).astype(np.int64)
        if ranges is not None
        else None
    )
    all_tokens = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    all_loss = np.concatenate(loss) if loss else np.zeros(0, np.int64)
    return {
        "dataset": src.dataset,
        "manifest": f"{src.dataset}/manifest.json",
        "manifest_sha256": sha256_file(manifest_file),
        "config_hash": manifest["config_hash"],
        "tokenizer_fingerprint": manifest["tokenizer_fingerprint"],
        "max_seq_len": manifest["max_seq_len"],
        "max_epochs": src.max_epochs,
        "seed": bucket_seed(seed, bucket),
        "files": [
            {"path": f"{src.dataset}/{f['path']}", "sha256": f["sha256"], "sequences": f["sequences"]} for f in files
        ],
        **({"domains": src.domains, "ranges": ranges} if ranges is not None else {}),
        "rows": len(rowmap) if rowmap is not None else sum(f["sequences"] for f in files),
        "_manifest": manifest,
        "_rowmap": rowmap,  # a bucket row -> its row over the files (None: the same)
        "_tokens": all_tokens if rowmap is None else all_tokens[rowmap],
        "_loss": all_loss if rowmap is None else all_loss[rowmap],
    }


def domain_ranges(manifest: dict[str, Any], src: SourceSpec, key: str, split: str = "train") -> list[list[int]]:
    """The bucket's rows as `[file index, start, stop)` ranges of its domains over the split's files (file order,
    then the spec's domain order); an unknown domain or a dataset without domains is an error naming `key`."""
    known = manifest.get("domains")
    if known is None:
        raise MixError(
            f"{key}: dataset {src.dataset!r} has no domains (set input.domain_key in its spec, or drop `domains`)"
        )
    unknown = [d for d in src.domains or [] if d not in known]
    if unknown:
        raise MixError(f"{key}: dataset {src.dataset!r} has no domain {unknown}; its domains: {sorted(known)}")
    files = manifest["splits"].get(split, {}).get("files", [])
    if any("domain_rows" not in f for f in files):
        raise MixError(
            f"{key}: dataset {src.dataset!r}'s shards predate domain-pure packing (no domain_rows in its manifest): "
            "rematerialize its shards and manifest"
        )
    return [
        [fi, *f["domain_rows"][d]] for fi, f in enumerate(files) for d in src.domains or [] if d in f["domain_rows"]
    ]


def _slices(rows: np.ndarray, files: list[dict[str, Any]]) -> list[list[int]]:
    """The rows (sorted, repeats kept) as [file index, start, stop) runs within files."""
    starts = np.cumsum([0] + [f["sequences"] for f in files])
    out: list[list[int]] = []
    for r in np.sort(rows).tolist():
        fi = int(np.searchsorted(starts, r, side="right")) - 1
        local = r - int(starts[fi])
        if out and out[-1][0] == fi and out[-1][2] == local:
            out[-1][2] += 1
        else:
            out.append([fi, local, local + 1])
    return out


def plan_mix(spec: MixSpec, lake: Path) -> dict[str, Any]:
    """The mix over the sources' published manifests: per phase and bucket the demand and what the bucket gives
    (rows as file slices and as a counter range of its seeded stream), tokens and loss tokens, epochs used,
    shortfalls, and each phase's exact row order. Pure: the same manifests give the same dict."""
    sources = {b: _source(lake, b, s, spec.split, spec.seed, spec.name) for b, s in spec.sources.items()}
    buckets = list(sources)
    L = max(s["max_seq_len"] for s in sources.values())
    consumed = dict.fromkeys(buckets, 0)
    demanded = dict.fromkeys(buckets, 0)
    epoch_orders: dict[tuple[str, int], np.ndarray] = {}
    phases = []
    for phase in spec.phases:
        total_w = sum(phase.weights.values())
        per_bucket: dict[str, Any] = {}
        taken: dict[str, np.ndarray] = {}
        for b in buckets:
            src, w = sources[b], phase.weights.get(b, 0.0)
            share = w / total_w
            want = demanded_rows(share, phase.duration_tokens, L)
            capped = min(want, spec.max_items) if spec.max_items is not None else want
            demanded[b] += capped
            n = src["rows"]
            take = max(0, min(capped, n * src["max_epochs"] - consumed[b]))
            pos = np.arange(consumed[b], consumed[b] + take, dtype=np.int64)
            rows = np.zeros(take, np.int64)
            for e in sorted({int(x) for x in (pos // n).tolist()}) if n else []:
                if (b, e) not in epoch_orders:
                    epoch_orders[(b, e)] = order(n, src["seed"], e)
                sel = pos // n == e
                rows[sel] = epoch_orders[(b, e)][pos[sel] % n]
            tokens = int(src["_tokens"][rows].sum()) if take else 0
            loss = int(src["_loss"][rows].sum()) if take else 0
            if src["_rowmap"] is not None:  # a domain bucket's rows, counted over its source's files
                rows = src["_rowmap"][rows]
            taken[b] = rows
            per_bucket[b] = {
                "weight": w,
                "share": share,
                "demanded_tokens": round(share * phase.duration_tokens),
                "demanded_rows": want,
                "capped_rows": capped,
                "rows": take,
                "shortfall_rows": capped - take,
                "row_tokens": take * L,
                "tokens": tokens,
                "loss_tokens": loss,
                "stream": {"start": consumed[b], "stop": consumed[b] + take},
                "epochs": sorted({int(x) for x in (pos // n).tolist()}) if n else [],
                "slices": _slices(rows, src["files"]),
            }
            consumed[b] += take
        phases.append(
            {
                "name": phase.name,
                "duration_tokens": phase.duration_tokens,
                "buckets": per_bucket,
                "order": _interleave(taken, buckets),
            }
        )
    mix = {
        "version": MIX_VERSION,
        "mix": spec.name,
        "spec_hash": spec.fingerprint(),
        "split": spec.split,
        "seed": spec.seed,
        "max_seq_len": L,
        "allow_bucket_exhaustion": spec.allow_bucket_exhaustion,
        "max_items": spec.max_items,
        "total_tokens": spec.total_tokens,
        "lake": "../..",  # file and manifest paths are relative to the lake (two levels above mix.json)
        "order_scheme": "stream position s of bucket b: epoch s // rows, row reading.order(rows, seed, epoch)"
        "[s % rows]; a bucket narrowed to domains counts its rows over its `ranges` [file, start, stop) in order; "
        "a phase's order lists [bucket index, row]: the index into bucket_order (mix.json's maps are key-sorted), "
        "the row counted over the bucket's files in order",
        "bucket_order": buckets,
        "sources": {b: {k: v for k, v in s.items() if not k.startswith("_")} for b, s in sources.items()},
        "buckets": {
            b: {
                "demanded_rows": demanded[b],
                "rows": consumed[b],
                "shortfall_rows": demanded[b] - consumed[b],
                "available_rows": sources[b]["rows"] * sources[b]["max_epochs"],
                "inventory_rows": sources[b]["rows"],
                "inventory_tokens": int(sources[b]["_tokens"].sum()),
                "inventory_loss_tokens": int(sources[b]["_loss"].sum()),
                "epochs_used": math.ceil(consumed[b] / sources[b]["rows"]) if sources[b]["rows"] else 0,
            }
            for b in buckets
        },
        "phases": phases,
    }
    manifests = {b: s["_manifest"] for b, s in sources.items()}
    outputs: dict[str, Any] = {}
    if "megatron_blend" in spec.outputs:
        outputs["megatron_blend"] = megatron_blend(mix, manifests)
    if "gpt_simple_curriculum" in spec.outputs:
        outputs["gpt_simple_curriculum"] = gpt_simple_layout(mix, manifests)
    return {**mix, **({"outputs": outputs} if outputs else {})}


def _interleave(taken: dict[str, np.ndarray], buckets: list[str]) -> list[list[int]]:
    """A phase's rows in order: a bucket's k-th row of n at (2k + 1) / (2n), ties by bucket order."""
    keys, idx, rows = [], [], []
    for i, b in enumerate(buckets):
        n = len(taken[b])
        keys.append((2 * np.arange(n) + 1) / (2 * n) if n else np.zeros(0))
        idx.append(np.full(n, i))
        rows.append(taken[b])
    key, bucket, row = (np.concatenate(x) for x in (keys, idx, rows))
    perm = np.lexsort((bucket, key))
    return [[int(bucket[j]), int(row[j])] for j in perm]


def mix_inputs_digest(spec: MixSpec, lake: Path) -> str:
    """What a mix is built from: its spec, the plan's code and each source manifest's bytes (missing = "")."""
    parts = [MIX_VERSION, spec.fingerprint()]
    for b, s in sorted(spec.sources.items()):
        m = lake / s.dataset / "manifest.json"
        parts.append(f"{b}={sha256_file(m) if m.is_file() else ''}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def write_mix(spec: MixSpec, lake: Path, mix: dict[str, Any]) -> Path:
    """Publish `lake/_mixes/<name>/` whole (staged, then exchanged): the same plan gives the same bytes. A plan
    held before (`hold_mix`) is removed: the published mix is the newest plan again."""
    final = mix_path(lake, spec.name).parent
    with staged_dir(final) as staging:
        write_json_atomic(staging / MIX_FILE, mix)
        write_outputs(mix, lake, staging)
    held = held_path(lake, spec.name).parent
    if held.is_dir():
        with partition_lock(held):
            shutil.rmtree(held)
    return final / MIX_FILE


def hold_mix(spec: MixSpec, lake: Path, mix: dict[str, Any]) -> Path:
    """Keep a plan its gates failed at `held_path` (staged, then exchanged), never over the published mix: trainers
    keep reading the last plan that passed, and the gates judge the held one (`mix_gates.MixSubject`)."""
    final = held_path(lake, spec.name).parent
    with staged_dir(final) as staging:
        write_json_atomic(staging / MIX_FILE, mix)
    return final / MIX_FILE
