"""prep_assets: raw LLM training data to training-ready token shards, orchestrated by Dagster.

What importing the package does, all of it (nothing else changes global state on import):
- `ARROW_DEFAULT_MEMORY_POOL=system` unless set (here, before pyarrow loads: Arrow reads it once, and its default
  pool keeps memory the Parquet reader's threads freed);
- `TRANSFORMERS_NO_ADVISORY_WARNINGS` and `TRANSFORMERS_VERBOSITY=error` unless set (`core/tokenizer.py`, before
  transformers loads: offline loading would otherwise warn on every run);
- the output formats register themselves in `core.formats.FORMATS` when that module loads.
Building the Dagster definitions happens only in `prep_assets.code_location`, which Dagster imports.

- with `PREP_ASSETS_NO_TORCH=1`, `keep_torch_out()`: the process only prepares data. The `prep-assets` command sets
  it for itself and every process it starts (Dagster's step processes, `prep-assets ui`'s webserver and
  daemons); the code location Dagster loads and the benchmark's measured children keep torch out too.
"""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

__version__ = "0.1.0"
NO_TORCH_ENV = "PREP_ASSETS_NO_TORCH"


def keep_torch_out() -> None:
    """Mark torch absent in this process unless something imported it already. transformers imports torch whenever
    it is installed (the `[torch]` extra), ~180 MB and ~1 s per process; preparing data never needs it. Only for
    processes that never train: torch cannot be imported there afterwards."""
    import sys

    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]


if os.environ.get(NO_TORCH_ENV) == "1":
    keep_torch_out()
