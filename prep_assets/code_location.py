"""The code location Dagster loads (`workspace.yaml`): every dataset of the data dir (`PREP_ASSETS_DATA_DIR`,
else `./data`), built when Dagster imports this module."""

from prep_assets import keep_torch_out

keep_torch_out()  # Dagster's processes for this location only prepare data

from prep_assets.definitions import build_definitions  # noqa: E402

defs = build_definitions()
