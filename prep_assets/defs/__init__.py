"""Dagster wiring: thin assets, checks and resources over `prep_assets.core`."""
