"""The lake resource: where raw drops, specs and every layer's outputs live (a local folder by default)."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource

from prep_assets.core.lake import DatasetPaths, dataset_paths

DATA_DIR_ENV = "PREP_ASSETS_DATA_DIR"
BATCH_ENV = "PREP_ASSETS_BATCH_SIZE"
DEFAULT_BATCH_SIZE = 4096


def default_batch_size() -> int:
    """Records per batch a layer streams (`$PREP_ASSETS_BATCH_SIZE`, default 4096); outputs never depend on it."""
    return int(os.environ.get(BATCH_ENV) or DEFAULT_BATCH_SIZE)


def default_data_dir() -> Path:
    """`$PREP_ASSETS_DATA_DIR`, else `./data` under the working directory."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data").resolve()


class LakeResource(ConfigurableResource):
    """A data dir holding `datasets/` (specs), `raw/<dataset>/` (drops) and `lake/<dataset>/` (outputs)."""

    data_dir: str
    batch_size: int = DEFAULT_BATCH_SIZE

    @property
    def root(self) -> Path:
        return Path(self.data_dir)

    def paths(self, dataset: str) -> DatasetPaths:
        return dataset_paths(self.root, dataset)
