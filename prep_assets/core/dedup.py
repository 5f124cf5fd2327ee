"""Exact and near-duplicate removal for silver.

Exact: the key of a record is the sha256 of its full normalized content (canonical JSON). Equal hashes are
confirmed on the bytes: after a pass in which some hash was met twice (`ExactDedup.any_repeat`), `collisions` asks
DuckDB for any hash held by two different contents (this drop and the earlier drops' indexes); the pass is then
rerun keying those hashes by hash + content, so a collision never removes a distinct record. A pass in which every
hash was new holds no hash twice, so no collision, and its output is not read back.

Dataset scope: each drop's content (hash, first record, content) is kept under
`dedup_index/<silver config>/<partition>/hashes.parquet`; a drop's silver removes every record an earlier
drop (registration order) holds: the earliest drop's first line is the copy kept, whichever partitions were
materialized first.

Near: MinHash signatures (datasketch, fixed seed) of word or character n-grams, banded with MinHashLSH at
the spec's Jaccard threshold; records are taken in drop order and one whose estimated Jaccard with an
already kept record reaches the threshold is removed, naming the earliest such kept record.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prep_assets.core.clean import WORD

if TYPE_CHECKING:  # datasketch (with scipy) is imported by near dedup only: 0.4 s a process that needs none
    from datasketch import MinHash
from prep_assets.core.drops import Drop, DropSet, drop_order, earlier_drops
from prep_assets.core.lake import DatasetPaths, read_json, staged_dir
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import NearDedupSpec
from prep_assets.core.sql import connect as sql_connect

INDEX_FILE = "hashes.parquet"
DEDUP_INDEX_DIR = "dedup_index"  # lake/<dataset>/dedup_index/<silver configuration>/<partition>/
INDEX_VERSION = "v2"  # bump when what silver hashes, or the index layout, changes in code
INDEX_SCHEMA = pa.schema([("content_sha256", pa.string()), ("record_id", pa.string()), ("content", pa.string())])


# ---------------------------------------------------------------- exact


class HashCollision(Exception):
    """Two different contents share a sha256: rerun keying these hashes by their bytes."""

    def __init__(self, digests: frozenset[str]) -> None:
        super().__init__(f"{len(digests)} content sha256 value(s) held by different contents")
        self.digests = digests


class ExactDedup:
    """The first record of each content key: the content sha256, or hash + content for a colliding hash."""

    def __init__(self, earlier: Sequence[Path], colliding: frozenset[str]) -> None:
        self.colliding = colliding
        self.prior = merge_indexes(earlier)
        self.prior_exact = _by_content(earlier, colliding)
        self.first_seen: dict[str, str] = {}  # key -> the drop's first record with it
        # whether any hash was met again (in this drop or an earlier one): a pass where none was cannot hold a
        # collision, so `collisions` need not read the pass' output back
        self.any_repeat = False

    def repeats(self, digest: str, canonical: str, record_id: str) -> tuple[str | None, bool]:
        """(the earlier record with the same content or None, whether it is in an earlier drop)."""
        if digest in self.colliding:
            key = f"{digest}\0{canonical}"
            earlier = self.prior_exact.get(key)
        else:
            key, earlier = digest, self.prior.get(digest)
        first = self.first_seen.setdefault(key, record_id)
        if earlier is not None or first != record_id:
            self.any_repeat = True
        if earlier is not None:
            return earlier, True
        return (first if first != record_id else None), False


# a drop's silver rows with a content hash: the paths are bound as $records / $rejects
_ROWS = (
    "(SELECT record_id, content_sha256, content FROM read_parquet($records) UNION ALL "
    "SELECT record_id, content_sha256, content FROM read_parquet($rejects) WHERE content_sha256 IS NOT NULL)"
)


# the same rows' hashes only: what finds the repeated hashes without reading any content
_HASHES = (
    "(SELECT content_sha256 FROM read_parquet($records) UNION ALL "
    "SELECT content_sha256 FROM read_parquet($rejects) WHERE content_sha256 IS NOT NULL)"
)


def collisions(records: Path, rejects: Path, earlier: Sequence[Path]) -> frozenset[str]:
    """Hashes of this drop's rows that some other row (here or in an earlier drop's index) holds with other bytes.

    Contents are read only for the hashes that occur more than once, so memory follows the repeats, not the drop."""
    params: dict[str, object] = {"records": str(records), "rejects": str(rejects)}
    hashes = f"SELECT content_sha256 FROM {_HASHES}"
    rows = f"SELECT content_sha256, content FROM {_ROWS}"
    if earlier:  # an earlier drop's hash counts where this drop has it too
        params["earlier"] = [str(p) for p in earlier]
        hashes = (
            f"SELECT content_sha256 FROM ({hashes} UNION ALL SELECT content_sha256 FROM read_parquet($earlier)) "
            f"WHERE content_sha256 IN (SELECT content_sha256 FROM {_HASHES})"
        )
        rows += " UNION ALL SELECT content_sha256, content FROM read_parquet($earlier)"
    sql = f"""
        WITH multi AS (SELECT content_sha256 FROM ({hashes}) GROUP BY content_sha256 HAVING count(*) > 1)
        SELECT content_sha256 FROM ({rows}) WHERE content_sha256 IN (SELECT content_sha256 FROM multi)
        GROUP BY content_sha256 HAVING count(DISTINCT content) > 1
    """
    with sql_connect() as con:
        return frozenset(r[0] for r in con.execute(sql, params).fetchall())


def write_index(out_dir: Path, first_ids: Iterable[str], records: Path, rejects: Path) -> None:
    """Publish a drop's index: each content's first record and bytes, sorted (reruns write the same file)."""
    firsts = pa.table({"record_id": pa.array(list(first_ids), pa.string())})
    sql = (
        f"SELECT content_sha256, record_id, content FROM {_ROWS} "
        "WHERE record_id IN (SELECT record_id FROM firsts) ORDER BY content_sha256, content"
    )
    with sql_connect() as con:
        con.register("firsts", firsts)
        reader = con.sql(sql, params={"records": str(records), "rejects": str(rejects)}).to_arrow_reader()
        _publish_index(out_dir, reader)


def write_empty_index(out_dir: Path) -> None:
    _publish_index(out_dir, [])


def _publish_index(out_dir: Path, batches: Iterable[pa.RecordBatch]) -> None:
    """Write and publish atomically; another process publishing the same (deterministic) index first is fine."""
    try:
        with staged_dir(out_dir) as stage, pq.ParquetWriter(stage / INDEX_FILE, INDEX_SCHEMA, compression="zstd") as w:
            for batch in batches:
                w.write_batch(batch.cast(INDEX_SCHEMA))
    except OSError:
        if not (out_dir / INDEX_FILE).is_file():
            raise


def _configuration(spec: DatasetSpec) -> str:
    """The folder of a silver configuration's indexes: the index layout's and silver's versions."""
    return f"{INDEX_VERSION}-{spec.layer_version('silver')}"


def index_dir(spec: DatasetSpec, paths: DatasetPaths, partition: str) -> Path:
    """Where a drop's content index is kept, per silver configuration (a changed spec gets a new index)."""
    return paths.root / DEDUP_INDEX_DIR / _configuration(spec) / partition


def remove_other_indexes(spec: DatasetSpec, paths: DatasetPaths) -> list[tuple[str, int]]:
    """Remove the dataset's dedup indexes of every other silver configuration than the spec's (an earlier code
    version or spec: silver rebuilt since, nothing reads them); (folder, bytes) of each one removed. An index
    holds a copy of each kept content, so left alone they would add a silver's size per drop at every change."""
    root = paths.root / DEDUP_INDEX_DIR
    if not root.is_dir():
        return []
    current, removed = _configuration(spec), []
    for folder in sorted(root.iterdir()):
        if folder.name == current or folder.name.startswith(".") or not folder.is_dir() or folder.is_symlink():
            continue
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(folder, ignore_errors=True)
        removed.append((folder.name, size))
    return removed


def earlier_indexes(spec: DatasetSpec, paths: DatasetPaths, partition: str) -> list[tuple[Drop, Path]]:
    """The index files of the drops registered before `partition`, earliest first (present or not)."""
    return [(d, index_dir(spec, paths, d.partition) / INDEX_FILE) for d in earlier_drops(paths, partition)]


def earlier_set_changed(spec: DatasetSpec, paths: DatasetPaths, partition: str, drops: DropSet | None = None) -> bool:
    """Dataset scope: the drop's silver was built against other earlier drops than those that count now (one was
    superseded since, i.e. its file replaced), so it must be rebuilt; False where there is no silver yet."""
    stats = paths.partition_dir("silver", partition) / "stats.json"
    if spec.clean.dedup_scope != "dataset" or not stats.is_file():
        return False
    drops = drops or DropSet.read(paths)
    return read_json(stats).get("earlier_drops") != [d.partition for d in drops.earlier(partition, paths.raw_dir)]


def stale_silver(spec: DatasetSpec, paths: DatasetPaths) -> dict[str, list[str]]:
    """Drops (not superseded) whose silver must be rebuilt because the earlier drops changed, in drop order,
    each with the earlier drops it must now be built against."""
    if spec.clean.dedup_scope != "dataset":
        return {}
    drops = DropSet.read(paths)
    live = sorted((d for d in drops.drops.values() if d.partition not in drops.superseded), key=drop_order)
    return {
        d.partition: [e.partition for e in drops.earlier(d.partition)]
        for d in live
        if earlier_set_changed(spec, paths, d.partition, drops)
    }


def repeats_of_earlier(earlier: Sequence[Path], counted: Mapping[Path, int]) -> dict[Path, int]:
    """For each silver records file of `counted`: how many of its rows hold a content sha256 that one of the first
    `counted[file]` files of `earlier` (silver records files, earliest first) holds too. One DuckDB pass over that
    column of every file, however many drops (bounded memory, spilling beyond it)."""
    out = dict.fromkeys(counted, 0)
    if not earlier or not any(counted.values()):
        return out
    sql = """
        WITH e AS (SELECT r.rank, p.content_sha256 FROM read_parquet($earlier, filename = true) p
                   JOIN ranks r ON p.filename = r.file),
        f AS (SELECT content_sha256, min(rank) AS first FROM e GROUP BY content_sha256),
        c AS (SELECT q.file, q.before, p.content_sha256 FROM read_parquet($counted, filename = true) p
              JOIN befores q ON p.filename = q.file)
        SELECT c.file, count(*) FILTER (WHERE f.first < c.before) AS repeats
        FROM c LEFT JOIN f USING (content_sha256) GROUP BY c.file
    """
    ranks = pa.table({"file": [str(f) for f in earlier], "rank": pa.array(range(len(earlier)), pa.int64())})
    befores = pa.table({"file": [str(f) for f in counted], "before": pa.array(list(counted.values()), pa.int64())})
    with sql_connect() as con:
        con.register("ranks", ranks)
        con.register("befores", befores)
        rows = con.execute(
            sql, {"earlier": [str(f) for f in earlier], "counted": [str(f) for f in counted]}
        ).fetchall()
    by_name = {str(f): f for f in counted}
    out.update({by_name[file]: int(n) for file, n in rows})
    return out


def merge_indexes(files: Sequence[Path]) -> dict[str, str]:
    """content sha256 -> the record kept for it: the first file (earliest drop) holding the hash wins."""
    prior: dict[str, str] = {}
    for path in files:
        table = pq.read_table(path, columns=["content_sha256", "record_id"])
        for digest, record_id in zip(table.column(0).to_pylist(), table.column(1).to_pylist()):
            prior.setdefault(digest, record_id)
    return prior


def _by_content(files: Sequence[Path], digests: frozenset[str]) -> dict[str, str]:
    """hash + NUL + content -> the earliest record holding exactly that content, for colliding hashes only."""
    out: dict[str, str] = {}
    if not digests:
        return out
    wanted = pa.array(sorted(digests), pa.string())
    for path in files:
        table = pq.read_table(path)
        table = table.filter(pc.is_in(table.column("content_sha256"), value_set=wanted))
        for digest, record_id, content in zip(*(table.column(c).to_pylist() for c in INDEX_SCHEMA.names)):
            out.setdefault(f"{digest}\0{content}", record_id)
    return out


# ---------------------------------------------------------------- near


def shingles(text: str, unit: str, n: int) -> list[bytes]:
    """The distinct word (lower-cased letters, marks and digits) or character n-grams of a text; a text shorter
    than n is one shingle."""
    words = WORD.findall(text.lower()) if unit == "word" else []
    if words:
        grams = {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)} or {" ".join(words)}
    else:  # characters (also for a text without words: symbols are compared, not all taken as equal)
        grams = {text[i : i + n] for i in range(len(text) - n + 1)} or {text}
    return [g.encode("utf-8") for g in sorted(grams)]


class NearDuplicates:
    """Records in order; each is checked against the kept ones through LSH and kept or matched to the earliest."""

    def __init__(self, spec: NearDedupSpec) -> None:
        from datasketch import MinHash, MinHashLSH

        self.spec = spec
        self.lsh = MinHashLSH(threshold=spec.threshold, num_perm=spec.num_perm, prepickle=False)
        self.signatures = np.zeros((1024, spec.num_perm), dtype=np.uint32)  # kept records' rows, by LSH key
        self.ids: list[str] = []
        self._proto = MinHash(num_perm=spec.num_perm, seed=spec.seed)  # permutations drawn once

    def signature(self, text: str) -> MinHash:
        m = self._proto.copy()
        m.update_batch(shingles(text, self.spec.unit, self.spec.ngram))
        return m

    def match(self, record_id: str, text: str) -> tuple[str, float] | None:
        """(the earliest kept record at >= threshold estimated Jaccard, that estimate), or None after keeping it."""
        m = self.signature(text)
        for slot in sorted(self.lsh.query(m)):
            similarity = float(np.mean(self.signatures[slot] == m.hashvalues))
            if similarity >= self.spec.threshold:
                return self.ids[slot], similarity
        slot = len(self.ids)
        self.lsh.insert(slot, m, check_duplication=False)
        if slot == len(self.signatures):
            self.signatures = np.concatenate([self.signatures, np.zeros_like(self.signatures)])
        self.signatures[slot] = m.hashvalues
        self.ids.append(record_id)
        return None
