"""prep_assets: raw LLM training data to training-ready token shards, orchestrated by Dagster."""

__version__ = "0.1.0"
