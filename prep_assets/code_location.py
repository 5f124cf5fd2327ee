"""The code location Dagster loads (`workspace.yaml`): every dataset of the data dir (`PREP_ASSETS_DATA_DIR`,
else `./data`), built when Dagster imports this module."""

from prep_assets.definitions import build_definitions

defs = build_definitions()
