"""Asset keys, names and code versions of a dataset's graph."""

from __future__ import annotations

from typing import Any

from dagster import AssetKey

from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import Layer

RAW_RECORDS = "raw_records"
CLEAN_RECORDS = "clean_records"
TOKENIZED_EXAMPLES = "tokenized_examples"
PACKED_SHARDS = "packed_shards"
TOKENIZER = "tokenizer"
DATASET_MANIFEST = "dataset_manifest"
PARTITIONED = (RAW_RECORDS, CLEAN_RECORDS, TOKENIZED_EXAMPLES, PACKED_SHARDS)
# the asset of each layer core speaks of (a gate's `layer`, a partition folder); the manifest's gates judge it
LAYER_ASSET: dict[str, str] = {
    "bronze": RAW_RECORDS,
    "silver": CLEAN_RECORDS,
    "gold": TOKENIZED_EXAMPLES,
    "shards": PACKED_SHARDS,
    "manifest": DATASET_MANIFEST,
}

# the Dagster kind (an icon in the UI) of each layer's asset; packed shards are gold-level data
LAYER_KIND: dict[str, str] = {"bronze": "bronze", "silver": "silver", "gold": "gold", "shards": "gold"}


def asset_key(spec: DatasetSpec, name: str) -> AssetKey:
    return AssetKey([spec.name, name])


def dataset_asset(
    spec: DatasetSpec, name: str, *, layer: str, kind: str, version: str, description: str
) -> dict[str, Any]:
    """What every asset of a dataset declares alike: its key, its dataset's group (the global graph shows each
    dataset's lineage under its name), its kinds (what it holds and its layer's), code version, description and
    layer tag."""
    return {
        "key": asset_key(spec, name),
        "group_name": spec.name,
        "kinds": {kind, LAYER_KIND[layer]},
        "code_version": code_version(spec, version),
        "description": description,
        "tags": {"layer": layer},
    }


def code_version(spec: DatasetSpec, layer: Layer | str) -> str:
    return spec.layer_version(layer)


def drop_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_drops"


def tokenizer_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_tokenizer"


def manifest_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_manifest"


TRAINING_MIX = "training_mix"


def mix_group(name: str) -> str:
    return f"mix_{name}"


def mix_asset_key(name: str) -> AssetKey:
    """A mix's asset: `mix_<name>/training_mix` (its own group; no dataset spec names an asset training_mix)."""
    return AssetKey([mix_group(name), TRAINING_MIX])


def mix_job_name(name: str) -> str:
    return f"mix_{name}_job"
