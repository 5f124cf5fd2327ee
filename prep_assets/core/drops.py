"""Drops: files in `raw/<dataset>/` that become partitions.

A partition key is a safe slug of the file name plus a short content hash (`[a-z0-9_-]`, at most
64 characters). The registry (`lake/<dataset>/drops/<key>.json`) maps a key back to its file and
sha256, so the bronze layer reads exactly the bytes the key names.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from prep_assets.core.errors import DropError
from prep_assets.core.lake import DatasetPaths, read_json, sha256_file, write_json_atomic
from prep_assets.core.readers_common import shown
from prep_assets.core.spec_sections import FORMAT_SUFFIXES

SLUG_MAX = 48
HASH_LEN = 10
RETIRED_REGISTRATION = "drop.json"  # a retired drop's registration, under retired/<key>/
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload")


@dataclass(frozen=True)
class Drop:
    partition: str
    file: str  # name relative to the dataset's raw folder
    sha256: str
    size: int
    seq: int = 0  # registration order in the dataset (earlier drops first); 0 for drops registered before it existed


def slugify(name: str) -> str:
    """A lower-case `[a-z0-9_-]` slug of a file name, bounded in length, never empty."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii").lower()
    slug = re.sub(r"[^a-z0-9_-]+", "_", ascii_name).strip("_-")
    slug = re.sub(r"_+", "_", slug)[:SLUG_MAX].strip("_-")
    return slug or "drop"


def partition_key(name: str, sha256: str) -> str:
    return f"{slugify(name)}-{sha256[:HASH_LEN]}"


def format_of(name: str) -> str | None:
    """The input format a file name implies, or None when no reader takes it."""
    lower = name.lower()
    for fmt, suffixes in FORMAT_SUFFIXES.items():
        if lower.endswith(suffixes):
            return fmt
    return None


def is_candidate_name(name: str) -> bool:
    """Hidden, underscore and temp names are never drops (writers use them while a file is incomplete)."""
    return not (name.startswith((".", "_")) or name.lower().endswith(_IGNORED_SUFFIXES))


def scan_raw_dir(raw_dir: Path, refused: list[str] | None = None) -> list[Path]:
    """Regular files directly in the raw folder that could be drops, sorted by name.

    Symlinks, anything resolving outside the folder, folders and names no reader takes are refused (not
    followed); each refusal is described in `refused` when given. Hidden, `_` and temp names are ignored
    silently (writers use them while a file is incomplete).
    """
    if not raw_dir.is_dir():
        return []
    root = raw_dir.resolve()
    found: list[Path] = []
    for entry in sorted(raw_dir.iterdir(), key=lambda p: p.name):
        if not is_candidate_name(entry.name):
            continue
        reason = None
        if not _utf8(entry.name):
            reason = "its name is not valid UTF-8 (rename the file)"
        elif entry.is_symlink():
            reason = "a symlink (never followed)"
        elif not entry.is_file():
            reason = "not a regular file"
        elif entry.resolve().parent != root:
            reason = "resolves outside the raw folder"
        elif format_of(entry.name) is None:
            reason = f"no reader for this name (suffixes: {', '.join(s for v in FORMAT_SUFFIXES.values() for s in v)})"
        if reason is not None:
            if refused is not None:
                refused.append(f"{entry.name!r}: refused, {reason}")
            continue
        found.append(entry)
    return found


def unclaimed_raw_entries(raw_root: Path, datasets: set[str]) -> list[str]:
    """What `raw/` holds that no dataset spec reads: a folder with no spec of its name (a dataset not configured
    yet, or a typo such as `sample_txt`), or a file beside the folders; hidden and `_` names are left alone."""
    if not raw_root.is_dir():
        return []
    out = []
    for entry in sorted(raw_root.iterdir(), key=lambda p: p.name):
        if entry.name.startswith((".", "_")) or (entry.is_dir() and entry.name in datasets):
            continue
        out.append(f"{shown(entry.name)}/" if entry.is_dir() else shown(entry.name))
    return out


def _utf8(name: str) -> bool:
    """False for a name the OS gave as undecodable bytes (surrogate escapes): it cannot be stored or printed."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def registered_drops(paths: DatasetPaths) -> dict[str, Drop]:
    if not paths.drops_dir.is_dir():
        return {}
    drops = {}
    for entry in sorted(paths.drops_dir.glob("*.json")):
        drop = Drop(**read_json(entry))
        drops[drop.partition] = drop
    return drops


def retired_drops(paths: DatasetPaths) -> dict[str, Drop]:
    """Drops retired by `prep-assets retire` (`retired/<key>/drop.json`), by partition: never registered again."""
    if not paths.retired_dir.is_dir():
        return {}
    entries = sorted(paths.retired_dir.glob(f"*/{RETIRED_REGISTRATION}"))
    return {d.partition: d for d in (Drop(**read_json(e)) for e in entries)}


def register_drops(paths: DatasetPaths, refused: list[str] | None = None) -> tuple[list[Drop], list[str]]:
    """Register every new file of the raw folder; returns (new drops, notes on files skipped). The files no reader
    reads (`scan_raw_dir`) are described in `refused` when given, else among the notes."""
    registry = _Registry(paths)
    new: list[Drop] = []
    notes: list[str] = []
    for path in scan_raw_dir(paths.raw_dir, notes if refused is None else refused):
        drop = registry.register(path, notes)
        if drop is not None:
            new.append(drop)
    return new, notes


class _Registry:
    """Registered drops by content hash; registering writes `drops/<key>.json` before anything else."""

    def __init__(self, paths: DatasetPaths) -> None:
        self.paths = paths
        drops = registered_drops(paths).values()
        self.by_hash = {d.sha256: d for d in drops}
        self.retired = {d.sha256: d for d in retired_drops(paths).values()}
        self.next_seq = max((d.seq for d in [*drops, *self.retired.values()]), default=0) + 1

    def register(self, path: Path, notes: list[str]) -> Drop | None:
        digest = sha256_file(path)
        gone = self.retired.get(digest)
        if gone is not None:
            notes.append(f"{path.name!r}: same bytes as retired drop {gone.partition}; not registered again")
            return None
        twin = self.by_hash.get(digest)
        if twin is not None:
            if twin.file != path.name:
                old = self.paths.raw_dir / twin.file
                # the drop's file was renamed: its registration follows, where no other registration had its name
                # (the name stands for a replaced file's versions, docs/decisions.md: the drop keeps it)
                alone = [d for d in [*self.by_hash.values(), *self.retired.values()] if d.file == twin.file] == [twin]
                if alone and (not old.is_file() or old.is_symlink()):
                    renamed = replace(twin, file=path.name)
                    write_json_atomic(self.paths.drops_dir / f"{twin.partition}.json", asdict(renamed))
                    self.by_hash[digest] = renamed
                    notes.append(f"{path.name!r}: drop {twin.partition}'s file {twin.file!r}, renamed; it follows")
                    return None
                owners = [d.partition for d in self.by_hash.values() if d.file == path.name]
                said = f"; it was drop {', '.join(owners)}'s file, whose bytes are gone from raw/" if owners else ""
                notes.append(
                    f"{path.name!r}: same bytes as drop {twin.partition} ({twin.file!r}); not a new drop{said}"
                )
            return None
        drop = Drop(
            partition=partition_key(path.name, digest),
            file=path.name,
            sha256=digest,
            size=path.stat().st_size,
            seq=self.next_seq,
        )
        write_json_atomic(self.paths.drops_dir / f"{drop.partition}.json", asdict(drop))
        self.by_hash[digest] = drop
        self.next_seq += 1
        return drop


@dataclass(frozen=True)
class Poll:
    """One sensor tick over a raw folder."""

    new: list[Drop]  # registered this tick
    waiting: list[str] = field(default_factory=list)  # new or still changing: looked at again next tick
    notes: list[str] = field(default_factory=list)  # refused names, same bytes under another name
    cursor: str = ""


def poll_drops(paths: DatasetPaths, cursor: str | None) -> Poll:
    """Register files that are complete: the same size and mtime as at the previous tick.

    The cursor (JSON) holds the (size, mtime_ns) of files seen changing (`pending`) and of files already
    handled (`seen`), so an unchanged file is neither hashed nor reported again. A registered drop is
    durable in the lake before the tick returns; a tick that fails later loses nothing (the caller adds
    every registered drop the instance lacks).
    """
    state = json.loads(cursor) if cursor else {}
    pending_before: dict[str, list[int]] = state.get("pending", {})
    seen: dict[str, list[int]] = state.get("seen", {})
    registry = _Registry(paths)
    new: list[Drop] = []
    waiting: list[str] = []
    notes: list[str] = []
    pending: dict[str, list[int]] = {}
    files = scan_raw_dir(paths.raw_dir, notes)
    for path in files:
        st = path.stat()
        sig = [st.st_size, st.st_mtime_ns]
        if seen.get(path.name) == sig:
            continue
        if pending_before.get(path.name) != sig:
            pending[path.name] = sig
            waiting.append(path.name)
            continue
        drop = registry.register(path, notes)
        if drop is not None:
            new.append(drop)
        seen[path.name] = sig
    present = {p.name for p in files}
    seen = {k: v for k, v in sorted(seen.items()) if k in present}
    return Poll(new, waiting, notes, json.dumps({"pending": pending, "seen": seen}, sort_keys=True))


def resolve_drop(paths: DatasetPaths, partition: str) -> tuple[Drop, Path]:
    """The registered drop of a partition and its file, checked to still hold the registered bytes."""
    entry = paths.drops_dir / f"{partition}.json"
    if not entry.is_file():
        raise DropError(f"partition {partition!r} is not a registered drop of {paths.raw_dir} (run `prep-assets run`)")
    drop = Drop(**read_json(entry))
    path = paths.raw_dir / drop.file
    if path.is_symlink() or not path.is_file():
        raise DropError(f"drop {partition}: file {path} is missing (or a symlink); its outputs stay as they are")
    digest = sha256_file(path)
    if digest != drop.sha256:
        twin = next((d for d in registered_drops(paths).values() if d.sha256 == digest), None)
        if twin is not None:  # registering it again would find the bytes registered already
            raise DropError(
                f"drop {partition}: {path} now holds the bytes of drop {twin.partition} ({twin.file!r}), not its "
                f"own (sha256 {drop.sha256[:12]}): put its bytes back, or take it out with `prep-assets retire "
                f"{paths.raw_dir.name} {partition}`"
            )
        raise DropError(
            f"drop {partition}: {path} changed since it was registered (sha256 {digest[:12]} != {drop.sha256[:12]}); "
            "the changed file is a new drop: run `prep-assets run` to register it"
        )
    return drop, path


def superseded_drops(paths: DatasetPaths) -> dict[str, str]:
    """Drops whose file name was registered again with other bytes: partition -> the partition standing for the
    name.

    A changed file under the same name is a new drop; the old partition keeps its outputs but no longer belongs
    in the dataset manifest. Where the file holds the bytes of one of the name's registrations, that one stands
    for it (putting an earlier version back brings it back). Where the file is gone (deleted, or moved away by
    `prep-assets retire`) or holds bytes not registered yet, the name's latest registration stands for it,
    retired ones included: an older version never comes back because a newer one was retired or deleted.
    """
    retired = retired_drops(paths)
    by_name: dict[str, list[Drop]] = {}
    for drop in [*registered_drops(paths).values(), *retired.values()]:
        by_name.setdefault(drop.file, []).append(drop)
    out: dict[str, str] = {}
    for name, drops in sorted(by_name.items()):
        if len(drops) < 2:
            continue
        path = paths.raw_dir / name
        current = None
        if path.is_file() and not path.is_symlink():
            digest = sha256_file(path)
            current = next((d for d in drops if d.sha256 == digest), None)
        if current is None:
            current = max(drops, key=drop_order)
        out.update({d.partition: current.partition for d in drops if d is not current and d.partition not in retired})
    return out


def drop_order(drop: Drop) -> tuple[int, str]:
    """The dataset's drop order: registration order, ties (drops registered before `seq`) by partition key."""
    return drop.seq, drop.partition


@dataclass(frozen=True)
class DropSet:
    """The registered drops and which are superseded, read once (superseding hashes replaced files)."""

    drops: dict[str, Drop]
    superseded: dict[str, str]

    @classmethod
    def read(cls, paths: DatasetPaths) -> DropSet:
        return cls(registered_drops(paths), superseded_drops(paths))

    def earlier(self, partition: str, raw_dir: Path | None = None) -> list[Drop]:
        """The drops registered before `partition`, earliest first, without superseded ones (their replacement
        stands for their file, and they are out of the manifest)."""
        if partition not in self.drops:
            raise DropError(f"partition {partition!r} is not a registered drop of {raw_dir} (run `prep-assets run`)")
        me = drop_order(self.drops[partition])
        return sorted(
            (d for d in self.drops.values() if drop_order(d) < me and d.partition not in self.superseded),
            key=drop_order,
        )


def earlier_drops(paths: DatasetPaths, partition: str) -> list[Drop]:
    return DropSet.read(paths).earlier(partition, paths.raw_dir)
