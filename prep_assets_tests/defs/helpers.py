"""Run a dataset's assets through Dagster's `materialize` under a temporary data dir and instance."""

from pathlib import Path

from dagster import AssetKey, AssetSelection, DagsterInstance, ExecuteInProcessResult, materialize

from prep_assets.core.drops import register_drops
from prep_assets.core.lake import dataset_paths
from prep_assets.core.spec import load_spec
from prep_assets.definitions import dataset_assets
from prep_assets.defs.keys import DATASET_MANIFEST, PARTITIONED, TOKENIZER
from prep_assets.defs.resources import LakeResource


def dataset_defs(data_dir: Path, name: str) -> list:
    """The dataset's assets and asset checks, as `materialize` takes them."""
    return dataset_assets(load_spec(data_dir / "datasets" / f"{name}.yaml"))


def materialize_drops(
    data_dir: Path,
    name: str,
    instance: DagsterInstance,
    selection: list[str] | None = None,
) -> dict[str, ExecuteInProcessResult]:
    """Register drops, pin the tokenizer, then materialize each partition's layers (with their checks)."""
    paths = dataset_paths(data_dir, name)
    register_drops(paths)
    keys = sorted(p.stem for p in paths.drops_dir.glob("*.json"))
    instance.add_dynamic_partitions(f"{name}_drops", keys)
    assets = dataset_defs(data_dir, name)
    resources = {"lake": LakeResource(data_dir=str(data_dir))}
    tok = materialize(assets, selection=[AssetKey([name, TOKENIZER])], instance=instance, resources=resources)
    assert tok.success
    chosen = AssetSelection.assets(*(AssetKey([name, n]) for n in (selection or PARTITIONED)))
    return {
        key: materialize(
            assets, selection=chosen, partition_key=key, instance=instance, resources=resources, raise_on_error=False
        )
        for key in keys
    }


def metadata(result: ExecuteInProcessResult, name: str, asset: str) -> dict:
    mats = [m for m in result.asset_materializations_for_node(f"{name}__{asset}")]
    assert len(mats) == 1, f"{asset} not materialized once"
    return {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}


def materialize_manifest(data_dir: Path, name: str, instance: DagsterInstance) -> ExecuteInProcessResult:
    """The (unpartitioned) dataset manifest over every partition materialized so far, with its check."""
    return materialize(
        dataset_defs(data_dir, name),
        selection=[AssetKey([name, DATASET_MANIFEST])],
        instance=instance,
        resources={"lake": LakeResource(data_dir=str(data_dir))},
    )


def split_sample_instruct(data: Path, ds: str = "sample_instruct") -> None:
    """sample_instruct's one drop cut into a.jsonl (its first 40 records) and b.jsonl (the next 40)."""
    raw = data / "raw" / ds
    lines = (raw / "arithmetic_2026-11-01.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (raw / "arithmetic_2026-11-01.jsonl").unlink()
    (raw / "a.jsonl").write_text("".join(lines[:40]), encoding="utf-8")
    (raw / "b.jsonl").write_text("".join(lines[40:80]), encoding="utf-8")
