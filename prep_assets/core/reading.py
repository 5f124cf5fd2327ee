"""Reading a manifest split for training, torch-free: verified shard files, an indexable row view, the epoch order
and the resumable cursor every loader (ours in `prep_assets.torch`, or any other) shares.

Order, sharding and the cursor (one scheme, so a run resumes exactly whatever its worker count):
    epoch order   `order(N, seed, epoch)`: a permutation of the N rows of the split from numpy's PCG64 seeded with
                  (seed, epoch); the same on every machine and numpy version that keeps PCG64's stream.
    ranks         rank r of world size W takes the positions p of that order with p % W == r: its *rank stream*.
    cursor        `{"epoch", "seed", "consumed"}`: the rows of its rank stream a rank has consumed, in order.
    workers       the remaining rank stream (from `consumed`) is cut into chunks of `batch_size` rows, and
                  DataLoader worker w of K takes the chunks c with c % K == w. A DataLoader (in order, as by
                  default) hands batch i from worker i % K, so batch i is chunk i: the batches come in the rank
                  stream's order whatever K is, the rows consumed are always a prefix of the remaining stream, and
                  a resume with another worker count yields exactly the rows not yet consumed.
Rows-per-worker round robin would not do: after k batches with k not a multiple of K, some workers would be one
batch ahead, so the consumed rows would not be a prefix a single count can name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow.parquet as pq

from prep_assets.core.errors import ManifestMismatchError, ReadError, ShardIntegrityError, SplitNotFoundError
from prep_assets.core.lake import CHECKSUMS, sha256_file, sha256_handle

MANIFEST = "manifest.json"
# the fixed-length token columns (max_seq_len per row) and the per-segment ones
TOKEN_COLUMNS = ("input_ids", "loss_mask", "position_ids", "segment_ids", "token_type_ids")
SEGMENT_COLUMNS = ("seq_lengths", "example_ids", "example_offsets")
Row = dict[str, Any]


@dataclass(frozen=True)
class ShardFile:
    """One Parquet shard of a split: where it is, the rows and sha256 its manifest recorded."""

    path: Path
    rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A published manifest and the directory its relative shard paths start from."""

    path: Path
    data: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.path.parent

    def split_files(self, split: str) -> list[ShardFile]:
        """The split's shard files, in manifest order; a split the manifest lacks is an error naming the others."""
        splits = self.data.get("splits", {})
        available = sorted(s for s, v in splits.items() if v.get("files"))
        if not splits.get(split, {}).get("files"):
            raise SplitNotFoundError(
                f"{self.path}: split {split!r} has no shard files; splits with shards: {available or 'none'}"
            )
        return [ShardFile(self.root / f["path"], int(f["sequences"]), f["sha256"]) for f in splits[split]["files"]]


def load_manifest(path: str | Path) -> Manifest:
    """A manifest from its path or its dataset's lake directory (`lake/<dataset>/`)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    if not p.is_file():
        raise ReadError(f"{p}: no manifest (give lake/<dataset>/ or its manifest.json)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReadError(f"{p}: not a readable manifest: {e}") from e
    missing = [k for k in ("max_seq_len", "tokenizer_fingerprint", "pad_id", "splits") if k not in data]
    if missing:
        raise ReadError(f"{p}: not a dataset manifest, missing {missing}")
    return Manifest(p, data)


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    """(size, mtime in ns, inode) of a file: what changes when it is rewritten."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def verify_files(files: Sequence[ShardFile]) -> None:
    """Every file exists and holds the bytes its manifest recorded; the first that does not is named."""
    for f in files:
        if not f.path.is_file():
            raise ShardIntegrityError(f"{f.path}: shard file named in the manifest is missing")
        if sha256_file(f.path) != f.sha256:
            raise ShardIntegrityError(f"{f.path}: sha256 differs from the manifest's {f.sha256} (changed or corrupt)")


def agree(manifests: Sequence[Manifest]) -> None:
    """Manifests read as one stream must share the tokenizer fingerprint and max_seq_len."""
    for key in ("tokenizer_fingerprint", "max_seq_len"):
        values = {m.data[key] for m in manifests}
        if len(values) > 1:
            named = ", ".join(f"{m.path}: {m.data[key]}" for m in manifests)
            raise ManifestMismatchError(f"manifests read together disagree on {key} ({named})")


def order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's permutation of `num_rows` rows (int64), from PCG64 seeded with (seed, epoch)."""
    return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_rows)


def rank_positions(num_rows: int, seed: int, epoch: int, rank: int, world_size: int) -> np.ndarray:
    """The rows of rank `rank`'s stream for the epoch, in order (positions p of `order` with p % W == r)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    return order(num_rows, seed, epoch)[rank::world_size]


def worker_positions(remaining: np.ndarray, batch_size: int, worker: int, num_workers: int) -> np.ndarray:
    """Worker `worker`'s rows of the remaining stream: the `batch_size` chunks c with c % num_workers == worker."""
    chunk = np.arange(len(remaining)) // batch_size
    return remaining[chunk % num_workers == worker]


def new_cursor(seed: int) -> dict[str, int]:
    return {"epoch": 0, "seed": int(seed), "consumed": 0}


def advance(cursor: dict[str, int], rows: int, stream_len: int) -> dict[str, int]:
    """The cursor after `rows` more rows consumed; a finished stream rolls over to the next epoch."""
    consumed = cursor["consumed"] + rows
    if consumed > stream_len:
        raise ValueError(f"{consumed} rows consumed of a rank stream of {stream_len}")
    if consumed == stream_len:
        return {**cursor, "epoch": cursor["epoch"] + 1, "consumed": 0}
    return {**cursor, "consumed": consumed}


_COUNTS = ("epoch", "seed", "consumed")


def stream_id(files: Sequence[ShardFile], split: str, rank: int, world_size: int) -> str:
    """What a rank stream is made of, as 16 hex digits: the split's files (sha256 and rows, in order), the rank and
    the world size. A cursor records it, so it is never resumed over other rows (a new drop, a rebuild, another
    rank), which would repeat some rows and skip others."""
    doc = {"split": split, "rank": rank, "world_size": world_size, "files": [[f.sha256, f.rows] for f in files]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def check_cursor(state: dict[str, Any]) -> dict[str, Any]:
    """A cursor as saved by `state_dict`: the non-negative integers epoch, seed and consumed, and the `stream_id` of
    the rows it counts (`stream`; cursors saved before it was recorded have none)."""
    if not isinstance(state, dict) or not set(_COUNTS) <= set(state) <= {*_COUNTS, "stream"}:
        raise ValueError(f"not a loader cursor (want keys epoch, seed, consumed and stream): {state!r}")
    if not all(type(state[k]) is int and state[k] >= 0 for k in _COUNTS):  # a bool is no count
        raise ValueError(f"a cursor holds non-negative integers: {state!r}")
    if not isinstance(state.get("stream", ""), str):
        raise ValueError(f"a cursor's stream is a string: {state!r}")
    return dict(state)


class PackedRows:
    """The rows of one split across the shard files of one or more manifests, indexable 0..N-1 in manifest and
    file order. Verified when built (see the module doc); rows are read a row group at a time, keeping at most
    `cache_groups` decoded row groups, so memory stays bounded whatever the split's size."""

    def __init__(
        self,
        manifests: str | Path | Sequence[str | Path],
        split: str = "train",
        *,
        verify: bool = True,
        cache_groups: int = 4,
        pairs: bool = False,
    ) -> None:
        paths = [manifests] if isinstance(manifests, (str, Path)) else list(manifests)
        if not paths:
            raise ReadError("no manifest given")
        self.manifests = [load_manifest(p) for p in paths]
        paired = [m.path for m in self.manifests if m.data.get("pairs")]
        if paired and not pairs:  # read as SFT rows, the rejected answers would be trained: said, never done
            raise ReadError(
                f"{paired[0]}: preference pairs (each row holds a chosen and a rejected answer, both with loss "
                "tokens: as SFT rows the rejected answers would be learned); pass pairs=True to read them for a "
                "preference trainer (example ids end in /chosen and /rejected)"
            )
        agree(self.manifests)
        self.split = split
        self.files = [f for m in self.manifests for f in m.split_files(split)]
        # before verifying: a change after it is caught (None: no file yet; read, it is hashed first)
        self._seen = [_signature(f.path.stat()) if f.path.is_file() else None for f in self.files]
        if verify:
            verify_files(self.files)
        first = self.manifests[0].data
        self.max_seq_len: int = int(first["max_seq_len"])
        self.pad_id: int = int(first["pad_id"])
        self.tokenizer_fingerprint: str = first["tokenizer_fingerprint"]
        self._file_starts = np.cumsum([0] + [f.rows for f in self.files])
        self._groups: dict[int, np.ndarray] = {}  # file index -> row-group start rows (read on first use)
        self._cache: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
        self._cache_groups = max(1, cache_groups)

    def __len__(self) -> int:
        return int(self._file_starts[-1])

    def __getitem__(self, index: int) -> Row:
        n = len(self)
        i = int(index) + n if int(index) < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"row {index} of a split of {n} rows")
        fi = int(np.searchsorted(self._file_starts, i, side="right")) - 1
        local = i - int(self._file_starts[fi])
        starts = self._group_starts(fi)
        gi = int(np.searchsorted(starts, local, side="right")) - 1
        group = self._group(fi, gi)
        j = local - int(starts[gi])
        row: Row = {c: group[c][j] for c in TOKEN_COLUMNS}
        for c in SEGMENT_COLUMNS:
            offsets = group[c + ".offsets"]
            row[c] = group[c][offsets[j] : offsets[j + 1]]
        row["num_loss_tokens"] = int(group["num_loss_tokens"][j])
        row["row_index"] = i
        return row

    def __iter__(self) -> Iterator[Row]:
        for i in range(len(self)):
            yield self[i]

    @contextmanager
    def _handle(self, fi: int) -> Iterator[BinaryIO]:
        """File `fi` opened, if it still holds the bytes its manifest recorded: one whose size, mtime or inode changed
        since the split was read is hashed again through the handle it is then read by (a lake rebuilt in place
        during training would otherwise be read unverified)."""
        path = self.files[fi].path
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise ShardIntegrityError(f"{path}: missing since this split was read") from None
        with handle:
            now = _signature(os.fstat(handle.fileno()))
            if now != self._seen[fi]:  # rewritten: read only the bytes the manifest recorded (a rerun's are the same)
                if sha256_handle(handle) != self.files[fi].sha256:
                    raise ShardIntegrityError(
                        f"{path}: changed since this split was read (its sha256 differs from the manifest's); build "
                        "the dataset again to read the new lake"
                    )
                self._seen[fi] = now
            yield handle

    @contextmanager
    def _opened(self, fi: int) -> Iterator[pq.ParquetFile]:
        with self._handle(fi) as handle:
            yield pq.ParquetFile(handle)

    def refresh(self) -> None:
        """Take the files' current signatures where they still hold the recorded bytes (else raise), so processes
        started from this object later (a new epoch's DataLoader workers) do not hash them again."""
        for fi in range(len(self.files)):
            with self._handle(fi):
                pass

    def _group_starts(self, fi: int) -> np.ndarray:
        if fi not in self._groups:
            with self._opened(fi) as pf:
                meta = pf.metadata
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            if sum(sizes) != self.files[fi].rows:
                raise ShardIntegrityError(
                    f"{self.files[fi].path}: {sum(sizes)} rows, the manifest recorded {self.files[fi].rows}"
                )
            self._groups[fi] = np.cumsum([0] + sizes[:-1])
        return self._groups[fi]

    def _group(self, fi: int, gi: int) -> dict[str, Any]:
        key = (fi, gi)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        with self._opened(fi) as pf:
            table = pf.read_row_group(gi)
        L = self.max_seq_len
        group: dict[str, Any] = {}
        for c in TOKEN_COLUMNS:
            col = table.column(c).combine_chunks()
            group[c] = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, L)
        for c in SEGMENT_COLUMNS:
            col = table.column(c).combine_chunks()
            values = col.flatten()
            group[c] = values.to_pylist() if c == "example_ids" else values.to_numpy(zero_copy_only=False)
            group[c + ".offsets"] = (col.offsets.to_numpy() - col.offsets[0].as_py()).astype(np.int64)
        group["num_loss_tokens"] = table.column("num_loss_tokens").to_numpy()
        self._cache[key] = group
        if len(self._cache) > self._cache_groups:
            self._cache.popitem(last=False)
        return group

    def __getstate__(self) -> dict[str, Any]:
        """Sent to DataLoader workers without the decoded row groups."""
        return {**self.__dict__, "_cache": OrderedDict()}


def _verify_mix_file(path: Path) -> None:
    """mix.json's bytes as recorded when its folder was published (`.checksums.json`), else `ReadError`: an edited
    order would read rows the plan never chose (a row twice, a negative index read from the end)."""
    record = path.parent / CHECKSUMS
    try:
        want = json.loads(record.read_text(encoding="utf-8")).get(path.name) if record.is_file() else None
        size, digest = (int(want["bytes"]), str(want["sha256"])) if want is not None else (None, None)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReadError(f"{record}: unreadable ({exc}): not a mix as published") from None
    if size is None:
        raise ReadError(f"{path}: no checksum recorded for it in {record}: not a mix as published")
    if path.stat().st_size != size or sha256_file(path) != digest:
        raise ReadError(
            f"{path}: its bytes differ from those recorded when it was published; materialize the mix again"
        )


class MixRows:
    """The rows of a training mix (`lake/_mixes/<name>/mix.json`, or its folder) in its planned order: phase after
    phase, each phase's `order` of [bucket, row]. Each bucket reads its source manifest's split, which must still
    list the files (sha256 and rows) the mix was planned from; with `verify`, those files' bytes are checked too.
    A row carries `bucket`, `phase` and `mix_index` besides the shard columns."""

    def __init__(self, mix: str | Path, *, phases: str | Sequence[str] | None = None, verify: bool = True) -> None:
        path = Path(mix) / "mix.json" if Path(mix).is_dir() else Path(mix)
        if not path.is_file():
            raise ReadError(f"{path}: no mix (give lake/_mixes/<name>/ or its mix.json)")
        if verify:
            _verify_mix_file(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        names = [p["name"] for p in data["phases"]]
        phases = [phases] if isinstance(phases, str) else phases
        unknown = sorted(set(phases) - set(names)) if phases is not None else []
        if unknown or phases is not None and not phases:  # before any file is hashed
            raise ReadError(f"{path}: no phase {unknown or '(none given)'}; its phases are {names}")
        lake = path.parent / data["lake"]
        self.buckets = list(data.get("bucket_order", data["sources"]))  # what the order's bucket indices index
        self.sources: list[PackedRows | None] = []  # None: a bucket planned without rows (it ran short)
        for bucket in self.buckets:
            src = data["sources"][bucket]
            try:
                rows: PackedRows | None = PackedRows(lake / src["manifest"], data["split"], verify=False)
            except SplitNotFoundError:
                if src["files"]:
                    raise
                rows = None  # planned from a split of no rows, which still has none: nothing of it to read
            listed = [] if rows is None else [(f.sha256, f.rows) for f in rows.files]
            if listed != [(f["sha256"], f["sequences"]) for f in src["files"]]:
                from prep_assets.core.mix import held_path  # here: core.mix imports this module

                held = held_path(path.parent.parent.parent, path.parent.name)
                again = (
                    f"its newest plan is held at {held}, failing its gates: fix the mix (see its checks)"
                    if held.is_file()
                    else "materialize the mix again"
                )
                raise ManifestMismatchError(
                    f"{path}: bucket {bucket!r}: {src['manifest']} no longer lists the files the mix was planned "
                    f"from (a new drop or a rebuild): {again}"
                )
            if verify and rows is not None:
                verify_files(rows.files)
            self.sources.append(rows)
        agree([m for r in self.sources if r is not None for m in r.manifests])
        chosen = [p for p in data["phases"] if phases is None or p["name"] in phases]
        self.phase_names = [p["name"] for p in chosen]
        self.order = np.array(
            [(pi, b, r) for pi, p in enumerate(chosen) for b, r in p["order"]], dtype=np.int64
        ).reshape(-1, 3)
        sizes = np.array([0 if r is None else len(r) for r in self.sources], dtype=np.int64)
        bucket, row = self.order[:, 1], self.order[:, 2]
        outside = (bucket < 0) | (bucket >= len(sizes))
        outside[~outside] = (row[~outside] < 0) | (row[~outside] >= sizes[bucket[~outside]])
        if outside.any():
            at = int(np.flatnonzero(outside)[0])
            raise ReadError(
                f"{path}: order entry {at} names [bucket, row] {self.order[at, 1:].tolist()}, no row there"
            )

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> Row:
        phase, bucket, row = (int(x) for x in self.order[index])
        source = self.sources[bucket]
        assert source is not None  # the order names no row of a bucket without rows (checked when opened)
        out = source[row]
        return {**out, "bucket": self.buckets[bucket], "phase": self.phase_names[phase], "mix_index": int(index)}

    def __iter__(self) -> Iterator[Row]:
        for i in range(len(self)):
            yield self[i]


# ---------------------------------------------------------------- what a batch of rows means to a model


def segment_starts(segment_ids: np.ndarray) -> np.ndarray:
    """[B, L] bool: the first token of each segment (a row's first token, or a change of segment id; not padding)."""
    seg = np.asarray(segment_ids)
    starts = np.ones(seg.shape, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return starts & (seg > 0)


def labels_of(input_ids: np.ndarray, loss_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """[B, L] int64 labels *unshifted* (HF convention: the model predicts labels[t] from position t-1): the token
    where its loss mask is 1, else -100; a segment's first token is always -100, as it would be predicted from the
    previous segment (the shards already mask it: a gate checks it; enforced here for any source)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    keep = (np.asarray(loss_mask) == 1) & ~segment_starts(segment_ids)
    return np.where(keep, ids, -100)


def cu_seqlens_of(segment_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Cumulative segment lengths (int32) over the flattened [B * L] batch, and the longest segment. A row's
    padding is a segment of its own, so the boundaries cover every token and the flattened batch goes to a varlen
    kernel as it is; padding attends only to padding and carries no label."""
    seg = np.asarray(segment_ids)
    B, L = seg.shape
    boundary = np.ones(seg.shape, dtype=bool)
    boundary[:, 1:] = seg[:, 1:] != seg[:, :-1]
    cu = np.append(np.flatnonzero(boundary.reshape(-1)), B * L).astype(np.int32)
    return cu, int(np.diff(cu).max()) if len(cu) > 1 else 0


def block_mask_of(segment_ids: np.ndarray) -> np.ndarray:
    """[B, 1, L, L] bool attention mask: query t sees key s <= t of its own segment (id > 0). A padding token sees
    only itself: no query row is empty (an empty row makes SDPA return NaN, which values would spread)."""
    seg = np.asarray(segment_ids)
    L = seg.shape[1]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    mask = same & np.tril(np.ones((L, L), dtype=bool))
    mask |= (seg == 0)[:, :, None] & np.eye(L, dtype=bool)
    return mask[:, None]
