"""The dataset-wide exact-dedup index (`clean.dedup_scope: dataset`).

Each drop's content hashes (the sha256 of every record that passes silver's filters, with the drop's first
record holding it) are kept under `dedup_index/<silver config>/<partition>/hashes.parquet`. A drop's silver
drops every record whose hash an earlier drop (registration order) already holds: the earliest drop's first
line is the copy kept, whichever partitions were materialized first.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.drops import Drop, earlier_drops
from prep_assets.core.lake import DatasetPaths, staged_dir
from prep_assets.core.spec import LAYER_SECTIONS, DatasetSpec

INDEX_FILE = "hashes.parquet"
INDEX_VERSION = "v1"  # bump when what silver hashes changes in code
_SCHEMA = pa.schema([("content_sha256", pa.string()), ("record_id", pa.string())])


def index_dir(spec: DatasetSpec, paths: DatasetPaths, partition: str) -> Path:
    """Where a drop's content hashes are kept, per silver configuration (a changed spec gets a new index)."""
    return paths.root / "dedup_index" / f"{INDEX_VERSION}-{spec.fingerprint(*LAYER_SECTIONS['silver'])[:16]}" / partition


def write_index(out_dir: Path, first_seen: Mapping[str, str]) -> None:
    """Publish a drop's hashes (sorted, so reruns write the same file), each with its first record."""
    hashes = sorted(first_seen)
    with staged_dir(out_dir) as stage:
        pq.write_table(pa.table({"content_sha256": hashes, "record_id": [first_seen[h] for h in hashes]},
                                schema=_SCHEMA), stage / INDEX_FILE)


def earlier_indexes(spec: DatasetSpec, paths: DatasetPaths, partition: str) -> list[tuple[Drop, Path]]:
    """The index files of the drops registered before `partition`, earliest first (present or not)."""
    return [(d, index_dir(spec, paths, d.partition) / INDEX_FILE) for d in earlier_drops(paths, partition)]


def merge_indexes(files: list[Path]) -> dict[str, str]:
    """content sha256 -> the record kept for it: the first file (earliest drop) holding the hash wins."""
    prior: dict[str, str] = {}
    for path in files:
        table = pq.read_table(path)
        for digest, record_id in zip(table.column("content_sha256").to_pylist(), table.column("record_id").to_pylist()):
            prior.setdefault(digest, record_id)
    return prior
