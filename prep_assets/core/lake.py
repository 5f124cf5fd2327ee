"""Where every layer's files live, and how they are published atomically.

Layout under the data dir (`<data-dir>/lake/<dataset>/`):
    drops/<partition>.json              the registered drop: original file name, sha256, size
    tokenizer/                          the pinned tokenizer files + fingerprint.json
    bronze/<partition>/                 records.parquet, rejects.parquet, accounting.json
    silver/<partition>/                 records.parquet, rejects.parquet, stats.json
    gold/<partition>/                   examples.parquet, rejects.parquet, stats.json
    shards/<partition>/<split>/         part-00000.parquet ... ; shards/<partition>/stats.json
    manifest.json                       what a trainer points at

A layer writes its partition into a staging directory beside the final one and publishes it with one
atomic directory exchange, so readers see the previous complete output or the new one, never a mix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

import orjson

from prep_assets.core.errors import PrepAssetsError, WriteError
from prep_assets.core.faults import write_point

_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
# Staging names carry <pid>-<host>-<random>: the lake may be a filesystem several machines mount, and a pid
# only says whether a writer is alive on the machine that started it.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _owner_tag() -> str:
    return f"{os.getpid()}-{_HOST}-{uuid.uuid4().hex[:8]}"


def _in_root(name: str) -> property:
    return property(lambda paths: paths.root / name, doc=f"<dataset lake>/{name}")


@dataclass(frozen=True)
class DatasetPaths:
    root: Path  # <data-dir>/lake/<dataset>
    raw_dir: Path  # <data-dir>/raw/<dataset>

    drops_dir = _in_root("drops")  # registrations: <partition>.json
    retired_dir = _in_root("retired")
    tokenizer_dir = _in_root("tokenizer")
    manifest_path = _in_root("manifest.json")

    def layer_dir(self, layer: str) -> Path:
        return self.root / layer

    def partition_dir(self, layer: str, partition: str) -> Path:
        return self.root / layer / partition


def data_dir_from_uri(uri: str) -> Path:
    """The data dir a base URI names: a local path or `file://` URI (absolute once resolved).

    Every machine that runs steps must mount the same filesystem at that path (NFS, EFS, Filestore, a
    shared volume): the layers publish by atomic rename and serialize a partition's writers with `flock`,
    which object stores do not offer, so `s3://`, `gs://` and the like are refused with that reason."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise PrepAssetsError(
                f"{uri}: a file:// URI names a path on this machine (file:///mnt/lake/data); "
                "mount the shared filesystem and give its mount path"
            )
        return Path(unquote(parts.path)).resolve()
    if parts.scheme and len(parts.scheme) > 1:  # one letter: a Windows drive, i.e. a path
        raise PrepAssetsError(
            f"{uri}: the lake must be a local path or a file:// URI of a filesystem every worker mounts; "
            f"{parts.scheme}:// is not supported (publishing is an atomic rename and partitions are locked "
            "with flock, which object stores do not provide)"
        )
    return Path(uri).resolve()


def dataset_paths(data_dir: Path, dataset: str) -> DatasetPaths:
    return DatasetPaths(root=data_dir / "lake" / dataset, raw_dir=data_dir / "raw" / dataset)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    with path.open("rb") as f:
        return sha256_handle(f, chunk)


def sha256_handle(handle: BinaryIO, chunk: int = 1 << 20) -> str:
    """sha256 of an open file from its start; the handle is left at its start again, to be read."""
    handle.seek(0)
    h = hashlib.sha256()
    while block := handle.read(chunk):
        h.update(block)
    handle.seek(0)
    return h.hexdigest()


_INT64 = 2**63
# Deeper JSON is refused by the readers: every layer recurses once per level, well inside Python's limit of 1000.
JSON_MAX_DEPTH = 128


def _plain(value: Any, depth: int = 1) -> bool:
    """Only strings, booleans, None, 64-bit integers, lists and string-keyed objects of them, nested at most
    `JSON_MAX_DEPTH` levels: the values orjson reads and writes exactly as the `json` module does (floats print
    differently; bigger integers it reads as floats; lone surrogates it refuses; it nests 254 levels at most)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_INT64 <= value < _INT64
    if depth > JSON_MAX_DEPTH:
        return False
    if kind is dict:  # loops, not all(<genexpr>), and strings checked inline: the leaves are mostly strings
        for k, v in value.items():
            if type(k) is not str or (type(v) is not str and not _plain(v, depth + 1)):
                return False
        return True
    if kind is list:
        for v in value:
            if type(v) is not str and not _plain(v, depth + 1):
                return False
        return True
    return False


def canonical_json(value: Any) -> str:
    """Key-sorted, compact, UTF-8 JSON: the one serialisation used for hashing and comparison.

    The bytes are `json.dumps(sort_keys, compact, ensure_ascii=False)`'s; for plain values (`_plain`) orjson writes
    the same bytes 5x faster (a test compares the two on every code point)."""
    if _plain(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except orjson.JSONEncodeError:  # a lone surrogate: the json module's output below
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads_json(text: str | bytes, slow: Callable[[str], Any] = json.loads) -> Any:
    """`slow(text)` (json.loads), 3x faster where orjson reads the text to the same value: a plain value
    (`_plain`). Anything else (floats, huge integers, text orjson refuses) is read by `slow`, errors included."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if _plain(value):
            return value
    return slow(text if isinstance(text, str) else text.decode("utf-8"))


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON (indented, key-sorted) to a temp file and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(path)
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{_owner_tag()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
            f.write("\n")
            write_point()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False where the OS lacks it."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # this filesystem cannot exchange: rename instead
        return False
    raise OSError(err, os.strerror(err), str(b))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_alive(tag: str) -> bool:
    """Whether the writer named by a staging tag may still run: its pid is alive on this machine, or it ran on
    another machine (which cannot be asked). Tags without a host (older names) count as this machine's."""
    parts = tag.split("-")
    if not parts[0].isdigit():
        return False
    pid = int(parts[0])
    if len(parts) >= 2 and len(parts[1]) == len(_HOST) and parts[1] != _HOST:
        return True
    return pid != os.getpid() and _pid_alive(pid)


# The files of a published layer partition.
RECORDS, REJECTS, EXAMPLES, STATS, ACCOUNTING = (
    "records.parquet",
    "rejects.parquet",
    "examples.parquet",
    "stats.json",
    "accounting.json",
)
LAKE_DIR = "lake"
STAGING_DIR = ".lake-staging"  # beside `lake/`: staged files never match a glob over the lake's published files


def _staging_place(final: Path) -> tuple[Path, str]:
    """Where `final`'s staging directory goes and its name prefix. Under a data dir's `lake/` (the `lake` folder
    beside a `datasets/` folder): the data dir's `.lake-staging/`, named after the path inside the lake, so
    `lake/**/*.parquet` never sees a half-written file; elsewhere, or where that folder is not on the device of
    `final`'s folder (a dataset folder mounted elsewhere), beside `final`."""
    for lake in final.parents:
        if lake.name == LAKE_DIR and (lake.parent / "datasets").is_dir():
            root = lake.parent / STAGING_DIR
            root.mkdir(exist_ok=True)
            final.parent.mkdir(parents=True, exist_ok=True)
            steps = final.parent.relative_to(lake).parts
            linked = any((lake.joinpath(*steps[: i + 1])).is_symlink() for i in range(len(steps)))
            if not linked and os.stat(root).st_dev == os.stat(final.parent).st_dev:
                return root, f"{'.'.join(final.relative_to(lake).parts)}{_TMP_MARK}"
            break
    return final.parent, f".{final.name}{_TMP_MARK}"


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def clean_stale_staging(final: Path, *, locked: bool = False) -> list[Path]:
    """Remove staging/old directories (or temp files) of `final` left by writers that no longer run.

    `locked`: the caller holds `final`'s partition lock, so no other writer (on any machine) can be
    writing its staging directory: every one left is stale."""
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    root, tmp_prefix = _staging_place(final)
    places = [
        (root, tmp_prefix),
        (final.parent, f".{final.name}{_TMP_MARK}"),
        (final.parent, f".{final.name}{_OLD_MARK}"),
    ]
    for folder, prefix in dict.fromkeys(places):
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not entry.name.startswith(prefix):
                continue
            if not locked and _writer_alive(entry.name[len(prefix) :]):
                continue
            _remove(entry)
            removed.append(entry)
    return removed


def sweep_stale_staging(lake_root: Path) -> list[Path]:
    """Every staging leftover of dead writers under a dataset's lake folder and in the data dir's staging
    folder (a kill during a layer whose output is then up to date would otherwise stay for good)."""
    removed: list[Path] = []
    if not lake_root.is_dir():
        return removed
    staging = lake_root.parent.parent / STAGING_DIR
    prefix = f"{lake_root.name}."
    for entry in sorted(staging.iterdir()) if staging.is_dir() else []:
        tag = entry.name.rpartition(_TMP_MARK)[2]
        if entry.name.startswith(prefix) and _TMP_MARK in entry.name and not _writer_alive(tag):
            _remove(entry)
            removed.append(entry)
    for entry in sorted(lake_root.rglob(f"*{_TMP_MARK}*")) + sorted(lake_root.rglob(f"*{_OLD_MARK}*")):
        mark = _TMP_MARK if _TMP_MARK in entry.name else _OLD_MARK
        if entry.name.startswith(".") and entry.exists() and not _writer_alive(entry.name.rpartition(mark)[2]):
            _remove(entry)
            removed.append(entry)
    return removed


CHECKSUMS = ".checksums.json"


def _checksums(folder: Path) -> dict[str, Any]:
    return {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS
    }


def manifest_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file a dataset manifest names (shards and exports): `path` relative to the dataset's root, `sha256`."""
    return [
        f
        for split in manifest["splits"].values()
        for f in [*split["files"], *(g for e in split["exports"] for g in e["files"])]
    ] + [f for e in manifest.get("exports", []) for f in e["files"]]


def withdraw_manifest(manifest_path: Path, folder: str, next_sums: dict[str, Any] | None = None) -> bool:
    """Remove the published manifest where it names a file under `folder` (relative to the dataset's root, a
    drop's `shards/<partition>`) whose bytes are about to change: any of them when `next_sums` is None (the
    folder goes), else those the folder's next checksums (`staged_dir`'s) do not hold with the same sha256.
    Returns whether it was removed. A trainer then finds no manifest, loudly, until the manifest job publishes
    a new one, where it would have read the manifest's files' new bytes as if they were the listed ones
    (readers that do not check sha256, HF `datasets`)."""
    try:
        manifest = read_json(manifest_path)
    except FileNotFoundError:
        return False
    prefix = folder.rstrip("/") + "/"
    for entry in manifest_entries(manifest):
        name = entry["path"]
        if name.startswith(prefix) and (
            next_sums is None or next_sums.get(name[len(prefix) :], {}).get("sha256") != entry["sha256"]
        ):
            manifest_path.unlink(missing_ok=True)
            return True
    return False


def verify_published(final: Path) -> list[str]:
    """What differs between a published folder and the sizes and sha256 recorded when it was published
    (nothing: an empty list). A folder published without checksums, or missing, is reported as such."""
    record = final / CHECKSUMS
    if not record.is_file():
        return [f"{final}: {'no checksums recorded' if final.is_dir() else 'missing'}"]
    try:
        expected = read_json(record)
        entries = {str(rel): (int(want["bytes"]), str(want["sha256"])) for rel, want in expected.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{record}: unreadable ({exc})"]
    problems = []
    for rel, (size, digest) in entries.items():
        path = final / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != size:
            problems.append(f"{path}: {path.stat().st_size} bytes, {size} recorded")
        elif sha256_file(path) != digest:
            problems.append(f"{path}: sha256 differs from the one recorded at publish")
    present = {p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file() and p.name != CHECKSUMS}
    extra = sorted(present - set(entries)) if not problems else []
    return problems + [f"{final / rel}: not in the published checksums" for rel in extra]


@contextmanager
def scratch_dir(near: Path) -> Iterator[Path]:
    """A temporary directory beside `near` (same filesystem), removed on exit; those left by processes that
    died are removed first."""
    near.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(near)
    path = near.with_name(f".{near.name}{_TMP_MARK}{_owner_tag()}")
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        # the partition locks of what was staged inside it (`lock_path`: `.locks/<this dir>.<name>.lock` beside it),
        # released by now: left, the next run would report them as left by a process that died
        for lock in (near.parent / ".locks").glob(f"{glob_escape(path.name)}.*.lock"):
            lock.unlink(missing_ok=True)


def lock_path(final: Path) -> Path:
    """`lake/<dataset>/<layer>/<partition>` locks `lake/<dataset>/.locks/<layer>.<partition>.lock`: out of the
    layer's folder, so listing a layer shows partitions only."""
    return final.parent.parent / ".locks" / f"{final.parent.name}.{final.name}.lock"


@contextmanager
def partition_lock(final: Path) -> Iterator[None]:
    """Hold an exclusive lock on `final` (a `.locks/` file beside its folder) for as long as the block runs: two
    runs of one partition at once take turns instead of interleaving their outputs. Released by the OS if the
    process dies."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(lock_path(final)):
        yield


@contextmanager
def staged_dir(
    final: Path, before_publish: Callable[[dict[str, Any]], AbstractContextManager[object]] | None = None
) -> Iterator[Path]:
    """Yield an empty staging directory; on success it atomically replaces `final`.

    Holds the partition's lock throughout. On an exception the staging directory is removed and `final` is
    untouched; an OS error while writing (a full disk) is reported with both paths. `before_publish` is called
    with the staged files' checksums (path relative to the folder: bytes, sha256); the replacement happens inside
    the context it returns (a lock held across it).
    """
    with partition_lock(final):
        clean_stale_staging(final, locked=True)
        tag = _owner_tag()
        root, prefix = _staging_place(final)
        staging = root / f"{prefix}{tag}"
        staging.mkdir()
        try:
            try:
                yield staging
                sums = _checksums(staging)
                (staging / CHECKSUMS).write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n", encoding="utf-8")
                _fsync_tree(staging)
                with before_publish(sums) if before_publish is not None else nullcontext():
                    publish_dir(staging, final, tag=tag)
            except OSError as exc:
                raise WriteError(
                    f"writing {final} failed: {exc.strerror or exc} (while writing under {staging}); "
                    "the previous output is unchanged"
                ) from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def publish_dir(staging: Path, final: Path, *, tag: str) -> None:
    write_point()
    if not final.exists():
        os.rename(staging, final)
        return
    if _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous output
        return
    # Fallback without renameat2: a short window where `final` is absent; recovered by the next run.
    old = final.with_name(f".{final.name}{_OLD_MARK}{tag}")
    os.rename(final, old)
    try:
        os.rename(staging, final)
    except OSError:
        os.rename(old, final)  # the previous output back where it was
        raise
    shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def process_tag() -> str:
    """This process as `<pid>-<host>` (the prefix of its staging tags), to tag what it starts."""
    return f"{os.getpid()}-{_HOST}"


def process_alive(tag: str) -> bool:
    """Whether the process a `process_tag` (or staging tag) names may still run (another machine's: assumed)."""
    return _writer_alive(tag) or tag.startswith(f"{os.getpid()}-{_HOST}")


@contextmanager
def exclusive(lock: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock` (created if needed) while the block runs; `waiting` is called once if
    another process holds it first. Released by the OS if the process dies."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
