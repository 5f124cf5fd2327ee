"""prep_assets: raw LLM training data to training-ready token shards, orchestrated by Dagster.

What importing the package does, all of it (nothing else changes global state on import):
- `ARROW_DEFAULT_MEMORY_POOL=system` unless set (here, before pyarrow loads: Arrow reads it once, and its default
  pool keeps memory the Parquet reader's threads freed);
- `TRANSFORMERS_NO_ADVISORY_WARNINGS` and `TRANSFORMERS_VERBOSITY=error` unless set (`core/tokenizer.py`, before
  transformers loads: offline loading would otherwise warn on every run);
- on glibc, unless the user set the arena limit, at most two malloc arenas per core (`limit_malloc_arenas`);
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


# glibc's mallopt option for the number of arenas (malloc.h)
_M_ARENA_MAX = -8


def limit_malloc_arenas() -> int | None:
    """Cap glibc's malloc arenas at two per core unless `MALLOC_ARENA_MAX` (or `glibc.malloc.arena_max` in
    `GLIBC_TUNABLES`) says otherwise; returns the cap set (None: not glibc, or the user's setting rules).

    glibc gives each new thread its own arena, up to 8 per core. Arrow (on the system allocator), the tokenizer's
    and DuckDB's threads and the Parquet writer's thread each leave what they freed in their own arena, so one
    process running every layer grew by what every thread once held: on the 100 MB benchmark, 981 MiB peak with
    the default, 762 MiB with two per core. One per core saved 20 MiB more but made HF's `encode_batch_fast` 12%
    slower (its threads then wait on each other's arena) (docs/decisions.md). Arenas already made stay, and glibc
    fixes its limit once a process has more than 8 arenas: a host that imports prep_assets after starting many
    threads keeps glibc's limit unless `MALLOC_ARENA_MAX` is set in its environment."""
    import ctypes
    import sys

    user_set = "MALLOC_ARENA_MAX" in os.environ or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", "")
    if user_set or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl has no arenas to cap
        return None
    cap = 2 * (os.cpu_count() or 1)
    return cap if mallopt(_M_ARENA_MAX, cap) == 1 else None


limit_malloc_arenas()
