"""The lake resource: where raw drops, specs and every layer's outputs live (a local folder by default)."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource

from prep_assets.core.lake import DatasetPaths, data_dir_from_uri, dataset_paths

DATA_DIR_ENV = "PREP_ASSETS_DATA_DIR"
BATCH_ENV = "PREP_ASSETS_BATCH_SIZE"
DEFAULT_BATCH_SIZE = 4096


def default_batch_size() -> int:
    """Records per batch a layer streams (`$PREP_ASSETS_BATCH_SIZE`, default 4096); outputs never depend on it."""
    return int(os.environ.get(BATCH_ENV) or DEFAULT_BATCH_SIZE)


def default_data_dir() -> Path:
    """`$PREP_ASSETS_DATA_DIR` (a path or file:// URI), else `./data` under the working directory."""
    return data_dir_from_uri(os.environ.get(DATA_DIR_ENV) or "data")


class LakeResource(ConfigurableResource):
    """A data dir holding `datasets/` (specs), `raw/<dataset>/` (drops) and `lake/<dataset>/` (outputs).

    `data_dir` is the lake's base URI: a local path or a `file://` URI. Every path a layer, check or sensor
    touches is derived from it (workers share nothing else but the Dagster instance), so on several machines
    it is a filesystem they all mount at the same path."""

    data_dir: str
    batch_size: int = DEFAULT_BATCH_SIZE

    @property
    def root(self) -> Path:
        return data_dir_from_uri(self.data_dir)

    def paths(self, dataset: str) -> DatasetPaths:
        return dataset_paths(self.root, dataset)
