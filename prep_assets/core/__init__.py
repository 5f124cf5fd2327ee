"""The data logic of prep_assets. Nothing under this package imports Dagster."""
