"""Asset keys, names and code versions of a dataset's graph."""

from __future__ import annotations

from dagster import AssetKey

from prep_assets.core.gates import (  # the partitioned layers' names live with the gates, re-exported here
    CLEAN_RECORDS as CLEAN_RECORDS,
)
from prep_assets.core.gates import (
    PACKED_SHARDS as PACKED_SHARDS,
)
from prep_assets.core.gates import (
    RAW_RECORDS as RAW_RECORDS,
)
from prep_assets.core.gates import (
    TOKENIZED_EXAMPLES as TOKENIZED_EXAMPLES,
)
from prep_assets.core.spec import DatasetSpec
from prep_assets.core.spec_sections import Layer

TOKENIZER = "tokenizer"
DATASET_MANIFEST = "dataset_manifest"
PARTITIONED = (RAW_RECORDS, CLEAN_RECORDS, TOKENIZED_EXAMPLES, PACKED_SHARDS)


def asset_key(spec: DatasetSpec, name: str) -> AssetKey:
    return AssetKey([spec.name, name])


def code_version(spec: DatasetSpec, layer: Layer | str) -> str:
    return spec.layer_version(layer)


def drop_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_drops"


def tokenizer_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_tokenizer"


def manifest_job_name(spec: DatasetSpec) -> str:
    return f"{spec.name}_manifest"
