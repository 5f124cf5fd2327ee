"""The dataset manifest: the shards of the drops it includes, checked against their checksums and gates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prep_assets.core import gates
from prep_assets.core import invariants as inv
from prep_assets.core.errors import ManifestError
from prep_assets.core.lake import (
    STATS,
    DatasetPaths,
    manifest_entries,
    partition_lock,
    read_json,
    sha256_file,
    write_json_atomic,
)
from prep_assets.core.record_types import record_type
from prep_assets.core.records import (
    SPLITS,
    shard_schema,
)
from prep_assets.core.shards import ShardStats, totals
from prep_assets.core.silver import repeats_in
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.tabular import initial_prefill


def manifest_partitions(
    registered: list[str], superseded: dict[str, str], unpassed: dict[str, list[str]]
) -> tuple[list[str], dict[str, str]]:
    """Which drops a manifest holds: every registered drop not replaced by a changed file of the same name whose
    gates all passed on its latest materialization. Returns those (in order) and why each other one is left out
    (`unpassed`: per drop, the gates that did not pass)."""
    excluded = {p: f"superseded by {q}" for p, q in superseded.items()}
    for partition in registered:
        problems = unpassed.get(partition, [])
        if problems and partition not in excluded:
            excluded[partition] = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
    return [p for p in registered if p not in excluded], excluded


def build_manifest(spec: DatasetSpec, paths: DatasetPaths, partitions: list[str]) -> dict[str, Any]:
    """The dataset manifest: every published shard and export of the given partitions, by split, with checksums
    and the split metrics summed over partitions. Built, checked and published under the manifest's lock, so two
    refreshes at once take turns and the later one publishes what it read last; published only when every file
    it names holds the recorded bytes and its own gates pass."""
    with partition_lock(paths.manifest_path):
        manifest = _manifest(spec, paths, partitions)
        problems = manifest_file_problems(paths.root, manifest)
        if problems:
            raise ManifestError(
                f"{paths.manifest_path} not published, {len(problems)} file(s) differ from what "
                "their shards recorded (rebuild those drops): " + "; ".join(problems[:5])
            )
        failed = [o for o in manifest_outcomes(spec, paths, manifest) if not o.passed]
        if failed:  # the manifest's own gates judge it before trainers can read it
            raise ManifestError(
                f"{paths.manifest_path} not published: "
                + "; ".join(f"{o.name} failed ({o.violations} violation(s): {o.description})" for o in failed)
            )
        write_json_atomic(paths.manifest_path, manifest)
    return manifest


def _manifest(spec: DatasetSpec, paths: DatasetPaths, partitions: list[str]) -> dict[str, Any]:
    tok = read_json(paths.tokenizer_dir / "fingerprint.json")
    files: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    exports: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    metrics: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    parts: dict[str, Any] = {}
    partition_exports: list[dict[str, Any]] = []  # formats' partition-level files (a format's `finish`)
    fingerprints = set()
    tabular: dict[str, Any] | None = None
    domains: dict[str, dict[str, int]] = {}  # with input.domain_key: gold's counts per domain, summed over drops
    listed = sorted(p for p in partitions if (paths.partition_dir("shards", p) / STATS).is_file())
    repeats = repeats_in(spec, paths, listed, among=partitions)  # against the earlier drops of this manifest
    for partition in listed:
        stats = ShardStats.from_json(read_json(paths.partition_dir("shards", partition) / STATS))
        fingerprints.add(stats.tokenizer_fingerprint)
        parts[partition] = {"tokenizer_fingerprint": stats.tokenizer_fingerprint, **stats.totals}
        if repeats is not None and partition in repeats:  # dedup_scope drop: kept records an earlier drop holds
            parts[partition]["repeats_of_earlier_drops"] = repeats[partition]
        if stats.tabular is not None:
            tabular = _merge_tabular(tabular, stats.tabular)
        if stats.domains is not None:
            for domain, figures in stats.domains.items():
                acc = domains.setdefault(domain, {})
                for k, v in figures.items():
                    acc[k] = acc.get(k, 0) + v
        base = f"shards/{partition}"
        for split, s in stats.splits.items():
            metrics[split].append(s)
            files[split] += [{**f, "path": f"{base}/{f['path']}", "partition": partition} for f in s["files"]]
            exports[split] += [_located(fmt, e, partition) for fmt, e in sorted(s.get("exports", {}).items())]
        partition_exports += [_located(fmt, e, partition) for fmt, e in sorted((stats.exports or {}).items())]
    L = spec.sequence.max_seq_len
    manifest = {
        "dataset": spec.name,
        "max_seq_len": L,
        "strategy": spec.packing.strategy,
        "config_hash": spec.fingerprint(),
        "tokenizer_fingerprint": tok["fingerprint"],
        "tokenizer_vocab_size": tok["info"]["vocab_size"],
        "pad_id": tok["info"]["pad_id"],
        "shard_tokenizer_fingerprints": sorted(fingerprints),
        "partitions": parts,
        "splits": {s: {**totals(metrics[s], L), "files": files[s], "exports": exports[s]} for s in SPLITS},
        "schema": {f.name: str(f.type) for f in shard_schema(spec.input.domain_key is not None)},
        # a paired type's rows hold both branches of each pair: a DPO trainer's, never SFT targets (mixes and the
        # SFT loader refuse them)
        **({"pairs": True} if record_type(spec.input.type).paired else {}),
        **({"exports": partition_exports} if partition_exports else {}),
        **({"tabular": tabular} if tabular is not None else {}),
        **({"domains": dict(sorted(domains.items()))} if spec.input.domain_key is not None else {}),
    }
    return manifest


def _located(fmt: str, entry: dict[str, Any], partition: str) -> dict[str, Any]:
    """An export entry of a partition's stats with its paths made relative to the dataset root."""
    base = f"shards/{partition}"
    return {
        **entry,
        **{k: f"{base}/{entry[k]}" for k in ("dir", "prefix") if k in entry},
        "format": fmt,
        "partition": partition,
        "files": [{**f, "path": f"{base}/{f['path']}"} for f in entry["files"]],
    }


def manifest_outcomes(spec: DatasetSpec, paths: DatasetPaths, manifest: dict[str, Any]) -> list[inv.Outcome]:
    """The manifest's gates, judged on a manifest (built or published): the asset checks run the same."""
    subject = gates.Subject(spec, paths, given_manifest=manifest)
    return gates.raised(gates.judged(subject, gates.manifest_gates_for(spec)))


def manifest_file_problems(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Every file a manifest names (shards and exports, paths relative to `root`) checked against the sha256 (and
    size, where recorded) its shards step recorded: a manifest never names bytes that are not the recorded ones."""
    problems = []
    for entry in manifest_entries(manifest):
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']}: missing")
        elif "bytes" in entry and path.stat().st_size != entry["bytes"]:
            problems.append(f"{entry['path']}: {path.stat().st_size} bytes, {entry['bytes']} recorded")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['path']}: sha256 differs from the recorded one")
    return problems


def _merge_tabular(acc: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """The dataset's tabular section: the first partition's schema (in partition order); `initial_prefill` per
    group: the earliest 3 (by order_by) of the training records every partition kept for it."""
    if acc is None:
        acc = {**part, "initial_prefill": {} if part["mode"] == "sequential" else None}
    if acc["initial_prefill"] is None:
        return acc
    if any(isinstance(v, str) for v in (part.get("initial_prefill") or {}).values()):
        # assembly safe_synthesizer: SS's one string per group, from the first partition that has the group
        acc["initial_prefill"] = {**part["initial_prefill"], **acc["initial_prefill"]}
        return acc
    gathered = {g: list(v) for g, v in acc["initial_prefill"].items()}
    for group, records in (part.get("initial_prefill") or {}).items():
        gathered.setdefault(group, []).extend(records)
    acc["initial_prefill"] = initial_prefill(gathered, part.get("order_by"))
    return acc
