"""Retiring a bad drop: out of the dataset, kept for inspection, never registered again unless its bytes change.

`retire_drop` moves the drop's partition folders (bronze, silver, gold, shards, its dedup indexes), its raw file
and its registration under `lake/<dataset>/retired/<partition>/` and writes `retired.json` there (who, when,
why, the file's sha256). The registry then knows its bytes as retired (`core.drops.retired_drops`): the same
bytes dropped again are refused with a note, changed bytes under the same name are a new drop. Leaving the
partition set and the manifest is the caller's part (the Dagster instance: `defs/retire.py`).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prep_assets.core.dedup import DEDUP_INDEX_DIR
from prep_assets.core.drops import RETIRED_REGISTRATION, Drop, registered_drops, retired_drops, superseded_drops
from prep_assets.core.errors import DropError
from prep_assets.core.lake import DatasetPaths, partition_lock, sha256_file, withdraw_manifest, write_json_atomic

RECORD = "retired.json"
LAYERS = ("bronze", "silver", "gold", "shards")


def find_drop(paths: DatasetPaths, drop: str) -> Drop:
    """The registered drop named by its partition key or its file name (the current drop of a replaced file)."""
    drops = registered_drops(paths)
    if drop in drops:
        return drops[drop]
    named = [d for d in drops.values() if d.file == drop]
    if len(named) > 1:
        superseded = superseded_drops(paths)
        named = [d for d in named if d.partition not in superseded] if superseded else named
    if len(named) == 1:
        return named[0]
    if named:
        raise DropError(f"{drop!r} names several drops ({', '.join(sorted(d.partition for d in named))}): give a key")
    retired = [k for k, d in retired_drops(paths).items() if drop in (k, d.file)]
    if retired:
        raise DropError(f"{drop!r} is already retired: {', '.join(str(paths.retired_dir / k) for k in retired)}")
    raise DropError(f"no drop {drop!r} in {paths.drops_dir} (a partition key or a file name of raw/)")


def retire_drop(
    paths: DatasetPaths, drop: str, *, reason: str = "", user: str | None = None, via: str = "cli"
) -> dict[str, Any]:
    """Move a drop's outputs, raw file and registration under `retired/<partition>/`; returns its record.

    The registration moves last: until then the drop is still a registered drop, so an interrupted retire is
    finished by running it again (what was moved already is left where it is)."""
    found = find_drop(paths, drop)
    # the manifest never names files that are gone: out until the retire's refresh (or a run) publishes the next;
    # its lock held until the drop's folders moved, so no manifest job publishes them in between
    shards = paths.partition_dir("shards", found.partition).relative_to(paths.root).as_posix()
    dest = paths.retired_dir / found.partition
    dest.mkdir(parents=True, exist_ok=True)
    with partition_lock(paths.manifest_path):
        withdrawn = withdraw_manifest(paths.manifest_path, shards)
        moved = [_move(paths.partition_dir(layer, found.partition), dest / layer, paths.root) for layer in LAYERS]
    for index in sorted((paths.root / DEDUP_INDEX_DIR).glob(f"*/{found.partition}")):
        moved.append(_move(index, dest / DEDUP_INDEX_DIR / index.parent.name, paths.root))
    raw = paths.raw_dir / found.file
    if raw.is_file() and not raw.is_symlink() and sha256_file(raw) == found.sha256:  # other bytes: a new drop
        moved.append(_move(raw, dest / "raw" / found.file, paths.raw_dir.parent.parent))
    record = {
        "partition": found.partition,
        "file": found.file,
        "sha256": found.sha256,
        "size": found.size,
        "retired_by": user or _os_user(),
        "retired_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "reason": reason,
        "via": via,
        "moved": [m for m in moved if m],
        "manifest_withdrawn": withdrawn,
    }
    write_json_atomic(dest / RECORD, record)
    write_json_atomic(dest / RETIRED_REGISTRATION, asdict(found))
    (paths.drops_dir / f"{found.partition}.json").unlink()
    return record


def _move(src: Path, dst: Path, base: Path) -> str:
    """Move a file or folder (same filesystem: a rename); returns what moved, relative to `base`, or ''."""
    if not src.exists():
        return ""
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)
    return str(src.relative_to(base))


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid {os.getuid()}"
