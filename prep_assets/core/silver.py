"""Silver: records normalized, filtered and deduplicated, each with its split; every dropped one a reject."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core import dedup
from prep_assets.core.bronze import build_raw_records
from prep_assets.core.clean import (
    active_filters,
    assign_split,
    content_digest,
    nfc_stable,
    normalization_screen,
    normalize_content,
    quality_verdict,
    split_hash,
    splits_by_count,
    trained_roles,
)
from prep_assets.core.drops import Drop, DropSet, drop_order, resolve_drop
from prep_assets.core.errors import DropError
from prep_assets.core.invariants.common import require_input
from prep_assets.core.lake import (
    ACCOUNTING,
    RECORDS,
    REJECTS,
    STATS,
    DatasetPaths,
    canonical_json,
    loads_json,
    read_json,
    scratch_dir,
    staged_dir,
    write_json_atomic,
)
from prep_assets.core.parquet_io import DEFAULT_BATCH, ParquetSink, RowBuffer, gc_paused, iter_batches
from prep_assets.core.progress import Progress
from prep_assets.core.records import (
    BRONZE_SCHEMA,
    SILVER_REJECT_SCHEMA,
    SILVER_SCHEMA,
    SPLITS,
    content_texts,
    near_dup_text,
)
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.stats import LayerStats, figure
from prep_assets.core.tabular import group_label


def _split_key(spec: DatasetSpec, content: dict[str, Any], digest: str) -> str:
    """What a record's split is drawn from: its content, or its group's value (no group in two splits)."""
    group_by = spec.tabular.group_by if spec.tabular is not None else None
    if group_by is None:
        return digest
    return "group:" + group_label(content["values"][content["columns"].index(group_by)])


@dataclass(frozen=True, kw_only=True)
class SilverStats(LayerStats):
    """A drop's silver (`stats.json`): what cleaning and dedup kept and why the rest went."""

    records_in: int = figure("num_records_in")
    records: int = figure("dagster/row_count")
    rejects: int = figure("num_rejects")
    rejects_by_reason: dict[str, int] = figure("rejects_by_reason", table="counts")
    records_by_split: dict[str, int] = figure("records_by_split", table="counts", key="split")
    chars: int = figure("num_chars")
    dedup: str = figure("dedup")
    dedup_scope: str = figure("dedup_scope")
    duplicates_of_earlier_drops: int = figure("duplicates_of_earlier_drops")
    # dedup_scope drop: kept records whose content an earlier drop's silver holds too (kept twice)
    earlier_drops: list[str] = figure()
    hash_collisions: int = figure("hash_collisions")


def build_clean_records(
    spec: DatasetSpec,
    bronze_dir: Path,
    out_dir: Path,
    *,
    batch_size: int = DEFAULT_BATCH,
    earlier: Sequence[Path] = (),
    index_dir: Path | None = None,
    near: bool = True,
    splits: bool = True,
) -> SilverStats:
    """Silver: normalized, quality-filtered, deduplicated records with a deterministic split.

    `earlier` are the dedup indexes of drops registered before this one (dedup_scope: dataset): their
    contents are duplicates here too. With `index_dir`, this drop's index is published there. Equal hashes
    are confirmed on the bytes: when two contents share one, the drop is processed again keying that hash by
    its content, so a collision never removes a distinct record. `near=False` skips near dedup (for an index,
    which holds exact contents only). `splits=False` leaves every record in train (for an index, which holds no
    split, so an earlier drop too small for `split.validation_count` still yields its contents).
    """
    require_input(bronze_dir / RECORDS, BRONZE_SCHEMA, remedy="rematerialize bronze (raw_records)")
    colliding: frozenset[str] = frozenset()
    while True:
        try:
            with gc_paused():
                return _clean_pass(spec, bronze_dir, out_dir, batch_size, earlier, colliding, index_dir, near, splits)
        except dedup.HashCollision as found:
            colliding |= found.digests


def _clean_pass(
    spec: DatasetSpec,
    bronze_dir: Path,
    out_dir: Path,
    batch_size: int,
    earlier: Sequence[Path],
    colliding: frozenset[str],
    index_dir: Path | None,
    with_near: bool,
    with_splits: bool,
) -> SilverStats:
    clean = spec.clean
    norm = clean.normalization
    exact = dedup.ExactDedup(earlier, colliding) if clean.dedup != "none" else None
    near = dedup.NearDuplicates(clean.near) if clean.dedup == "near" and with_near else None
    trained = trained_roles(spec)
    filters = active_filters(clean)
    near_of: dict[str, str] = {}  # record removed as a near duplicate -> the kept record it is near
    reasons: Counter[str] = Counter()
    splits: Counter[str] = Counter()
    by_count = with_splits and spec.split.by_count
    hashes = array("Q")  # by_count: each kept record's split hash, in drop order (8 bytes a record)
    chars = records_in = of_earlier = 0
    with staged_dir(out_dir) as stage:
        comp = spec.output.compression
        with (
            ParquetSink(stage / RECORDS, SILVER_SCHEMA, compression=comp) as keep_sink,
            ParquetSink(stage / REJECTS, SILVER_REJECT_SCHEMA, compression=comp) as rej_sink,
        ):
            rejected = RowBuffer(rej_sink, batch_size)

            cols = ["record_id", "drop", "source_file", "source_line", "byte_offset", "domain", "content"]
            values: list[list[Any]] = []

            def reject(
                i: int, reason: str, detail: str, canonical: str, digest: str | None = None, of: str | None = None
            ) -> None:
                """Row `i` of the batch (its provenance columns) goes to the rejects table."""
                reasons[reason] += 1
                rejected.add(
                    {
                        **{c: values[j][i] for j, c in enumerate(cols[:-1])},
                        "reason": reason,
                        "detail": detail,
                        "duplicate_of": of,
                        "content": canonical,
                        "content_sha256": digest,
                    }
                )

            progress = Progress(
                f"silver {bronze_dir.name}: cleaning", pq.ParquetFile(bronze_dir / RECORDS).metadata.num_rows
            )
            for batch in iter_batches(bronze_dir / RECORDS, batch_size=batch_size, columns=cols):
                progress.advance(batch.num_rows)
                screened = normalization_screen(batch.column("content"))
                as_is, nfc_only = screened[0].tolist(), screened[1].tolist()
                values[:] = [batch.column(c).to_pylist() for c in cols]  # a list per column: 4x faster than rows
                # the kept rows: their provenance is taken from the batch (Arrow), the rest collected here
                kept: list[int] = []
                kept_content: list[str] = []
                kept_digest: list[str] = []
                kept_chars: list[int] = []
                kept_split: list[str] = []
                for i, (record_id, canonical, same, nfc) in enumerate(zip(values[0], values[-1], as_is, nfc_only)):
                    records_in += 1
                    content = loads_json(canonical)
                    if not same and not (nfc and nfc_stable(content, norm)):
                        content = normalize_content(content, norm)
                        canonical = canonical_json(content)
                    texts = content_texts(content)
                    verdict = quality_verdict(content, clean, texts, trained, filters)
                    if verdict is not None:
                        reject(i, verdict.reason, verdict.detail, canonical)
                        continue
                    if clean.max_items is not None and sum(splits.values()) >= clean.max_items:
                        # before dedup, so a record over the cap never becomes the kept copy others point to
                        cap = f"the drop has its {clean.max_items} kept records already (clean.max_items)"
                        reject(i, "max_items", cap, canonical)
                        continue
                    digest = content_digest(canonical)
                    if exact is not None:
                        first, in_earlier = exact.repeats(digest, canonical, record_id)
                        if first is not None and first in near_of:  # a copy of a record removed as near duplicate
                            reject(
                                i,
                                "near_duplicate",
                                f"same content as {first}, a near duplicate of {near_of[first]}",
                                canonical,
                                digest,
                                near_of[first],
                            )
                            continue
                        if first is not None:
                            of_earlier += in_earlier
                            reject(i, "duplicate", f"same content as {first}", canonical, digest, first)
                            continue
                    if near is not None:
                        match = near.match(record_id, near_dup_text(content))
                        if match is not None:
                            near_of[record_id] = match[0]
                            reject(
                                i,
                                "near_duplicate",
                                f"estimated Jaccard {match[1]:.3f} >= {clean.near.threshold} with {match[0]}",
                                canonical,
                                digest,
                                match[0],
                            )
                            continue
                    key = _split_key(spec, content, digest)
                    if by_count:
                        hashes.append(split_hash(key, spec.split.seed))
                    split = assign_split(key, spec.split) if with_splits else "train"
                    splits[split] += 1
                    n = sum(map(len, texts))
                    chars += n
                    kept.append(i)
                    kept_content.append(canonical)
                    kept_digest.append(digest)
                    kept_chars.append(n)
                    kept_split.append(split)
                if kept:
                    take = pa.array(kept, type=pa.int64())
                    keep_sink.write(
                        pa.Table.from_pydict(
                            {
                                **{c: batch.column(c).take(take) for c in cols[:-1]},
                                "content": kept_content,
                                "content_sha256": kept_digest,
                                "num_chars": kept_chars,
                                "split": kept_split,
                            },
                            schema=SILVER_SCHEMA,
                        )
                    )
            rejected.flush()
        if exact is not None and exact.any_repeat:  # no hash met twice: no collision to look for
            found = dedup.collisions(stage / RECORDS, stage / REJECTS, earlier) - colliding
            if found:
                raise dedup.HashCollision(found)  # the stage is discarded; the caller runs the pass again
        if by_count:
            try:
                splits = _hold_out_by_count(stage / RECORDS, hashes, spec, batch_size)
            except ValueError as e:
                raise DropError(f"silver {bronze_dir.name}: {e}") from None
        stats = SilverStats(
            records_in=records_in,
            records=keep_sink.rows,
            rejects=rej_sink.rows,
            rejects_by_reason=dict(sorted(reasons.items())),
            records_by_split={s: splits[s] for s in SPLITS},
            chars=chars,
            dedup=clean.dedup,
            dedup_scope=clean.dedup_scope,
            duplicates_of_earlier_drops=of_earlier,
            earlier_drops=[path.parent.name for path in earlier],
            hash_collisions=len(colliding),
        )
        write_json_atomic(stage / STATS, stats.as_json())
        if index_dir is not None and exact is not None:
            dedup.write_index(index_dir, exact.first_seen.values(), stage / RECORDS, stage / REJECTS)
    return stats


def _hold_out_by_count(records: Path, hashes: array, spec: DatasetSpec, batch_size: int) -> Counter[str]:
    """The records file rewritten with each record's split drawn by count (`splits_by_count`); its counts."""
    codes = splits_by_count(np.frombuffer(hashes, dtype=np.uint64), spec.split)
    drawn = records.with_name(f".drawn.{records.name}")
    records.rename(drawn)
    names = np.array(SPLITS, dtype=object)
    lo = 0
    with ParquetSink(records, SILVER_SCHEMA, compression=spec.output.compression) as sink:
        for batch in iter_batches(drawn, batch_size=batch_size):
            split = pa.array(names[codes[lo : lo + batch.num_rows]], pa.string())
            sink.write(batch.set_column(batch.schema.get_field_index("split"), "split", split))
            lo += batch.num_rows
    drawn.unlink()
    return Counter({s: int(n) for s, n in zip(SPLITS, np.bincount(codes, minlength=len(SPLITS)), strict=True)})


def earlier_indexes(
    spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH
) -> list[Path]:
    """The dedup indexes of the drops registered before `partition`, earliest first. A drop without one for
    this spec gets it from its raw file, so the answer never depends on which partitions were built before."""
    out = []
    for drop, path in dedup.earlier_indexes(spec, paths, partition):
        if not path.is_file():
            _index_drop(spec, paths, drop, path.parent, batch_size)
        out.append(path)
    return out


def _index_drop(spec: DatasetSpec, paths: DatasetPaths, drop: Drop, out_dir: Path, batch_size: int) -> None:
    """A drop's index from its raw file (bronze and silver built in a scratch dir, then discarded). A drop this
    spec cannot read (its bronze fails) holds nothing: the same outcome however often it is tried."""
    _, source = resolve_drop(paths, drop.partition)
    with scratch_dir(paths.root / "dedup_scratch") as tmp:
        bronze, silver = tmp / "bronze", tmp / "silver"
        try:
            build_raw_records(spec, drop, source, bronze, batch_size=batch_size)
        except DropError:
            dedup.write_empty_index(out_dir)
            return
        build_clean_records(spec, bronze, silver, batch_size=batch_size, index_dir=out_dir, near=False, splits=False)


def repeats_of_earlier_drops(
    spec: DatasetSpec, paths: DatasetPaths, partition: str, among: Collection[str] | None = None
) -> int | None:
    """With `clean.dedup_scope: drop`, how many of the drop's kept records an earlier drop's silver holds too (None
    under `dataset`, which removes them, or before the drop's silver exists). `among`: only those earlier drops
    (the manifest's, so its figure depends on the drops it holds, never on which others happen to be built).
    Never a silver stats field: silver's published bytes do not depend on build order."""
    repeats = repeats_in(spec, paths, [partition], among)
    return None if repeats is None else repeats.get(partition)


def repeats_in(
    spec: DatasetSpec, paths: DatasetPaths, partitions: Collection[str], among: Collection[str] | None = None
) -> dict[str, int] | None:
    """`repeats_of_earlier_drops` for every drop of `partitions` whose silver exists, in one pass over the drops'
    silver (the manifest's figures: one query per drop, each reading every earlier drop, grew with the square of
    the drops). The earlier drops of each: registered before it, not superseded, with silver, and of `among` where
    given (a drop of `among` that is not registered, one being retired, is none). None under `dedup_scope: dataset`."""
    if spec.clean.dedup_scope == "dataset":
        return None
    drops = DropSet.read(paths)
    among = drops.drops if among is None else among
    records = {p: paths.partition_dir("silver", p) / RECORDS for p in {*partitions, *among}}
    counted_drops = sorted(p for p in partitions if records[p].is_file())
    for p in counted_drops:
        if p not in drops.drops:
            drops.earlier(p, paths.raw_dir)  # raises: not a registered drop
    earlier = sorted(
        (drops.drops[p] for p in among if p in drops.drops and p not in drops.superseded and records[p].is_file()),
        key=drop_order,
    )
    orders = [drop_order(d) for d in earlier]
    counted = {records[p]: bisect_left(orders, drop_order(drops.drops[p])) for p in counted_drops}
    repeats = dedup.repeats_of_earlier([records[d.partition] for d in earlier], counted)
    return {p: repeats[records[p]] for p in counted_drops}


def build(spec: DatasetSpec, paths: DatasetPaths, partition: str, *, batch_size: int = DEFAULT_BATCH) -> SilverStats:
    """A drop's silver; with `clean.dedup_scope: dataset`, also without copies of earlier drops' records."""
    bronze, out = paths.partition_dir("bronze", partition), paths.partition_dir("silver", partition)
    if spec.clean.dedup_scope != "dataset":
        return build_clean_records(spec, bronze, out, batch_size=batch_size)
    built_with = read_json(bronze / ACCOUNTING).get("spec_version") if (bronze / ACCOUNTING).is_file() else None
    if built_with != spec.layer_version("bronze"):
        raise DropError(
            f"drop {partition}: its bronze was built with another spec (or is missing); materialize "
            "raw_records first, so its dedup index matches the spec"
        )
    return build_clean_records(
        spec,
        bronze,
        out,
        batch_size=batch_size,
        earlier=earlier_indexes(spec, paths, partition, batch_size=batch_size),
        index_dir=dedup.index_dir(spec, paths, partition),
    )
