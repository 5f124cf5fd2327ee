"""prep_assets: raw LLM training data to training-ready token shards, orchestrated by Dagster.

What importing the package does, all of it (nothing else changes global state on import):
- `ARROW_DEFAULT_MEMORY_POOL=system` unless set (here, before pyarrow loads: Arrow reads it once, and its default
  pool keeps memory the Parquet reader's threads freed);
- `TRANSFORMERS_NO_ADVISORY_WARNINGS` and `TRANSFORMERS_VERBOSITY=error` unless set (`core/tokenizer.py`, before
  transformers loads: offline loading would otherwise warn on every run);
- the output formats register themselves in `core.formats.FORMATS` when that module loads.
Building the Dagster definitions happens only in `prep_assets.code_location`, which Dagster imports.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__version__ = "0.1.0"
