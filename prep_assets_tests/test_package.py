"""What importing the package sets up for the process."""

import os
import platform
import subprocess
import sys

import pytest

from prep_assets_tests.conftest import PROJECT


def glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


PROBE = "import prep_assets, pyarrow; print(pyarrow.default_memory_pool().backend_name)"  # Arrow's C++ default


def _probe(script: str, variable: str, value: str | None, *args: str) -> str:
    """What `script` (given `args`) prints in a fresh interpreter with the environment `variable` set to `value`
    (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in (variable, "GLIBC_TUNABLES")}
    if value:
        env[variable] = value
    out = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, cwd=PROJECT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _pool(env_pool: str | None) -> str:
    return _probe(PROBE, "ARROW_DEFAULT_MEMORY_POOL", env_pool)


def test_arrow_uses_the_system_allocator_unless_the_user_chose_one():
    # mimalloc (Arrow's default) kept 240 MB that the Parquet reader's threads had freed, per layer
    assert _pool(None) == "system"
    assert _pool("mimalloc") == "mimalloc"


def test_a_data_preparing_process_keeps_torch_out_and_a_plain_one_does_not():
    # transformers imports torch when installed (~180 MB a process); PREP_ASSETS_NO_TORCH=1 marks it absent
    probe = "import sys, prep_assets.core.tokenizer; print(sys.modules.get('torch') is None)"
    env = {k: v for k, v in os.environ.items() if k != "PREP_ASSETS_NO_TORCH"}
    run = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "PREP_ASSETS_NO_TORCH": "1"},
        cwd=PROJECT,
        capture_output=True,
        text=True,
    )
    assert run.stdout.strip() == "True", run.stderr
    entry = "import os, prep_assets.cli as c; c.main = lambda: 0; c.entry(); print(os.environ['PREP_ASSETS_NO_TORCH'])"
    assert subprocess.run([sys.executable, "-c", entry], env=env, capture_output=True, text=True).stdout.strip() == "1"


# how many malloc arenas threads that each allocate end up in (glibc's malloc_info lists one <heap> per arena)
ARENAS = """
import ctypes, os, sys, tempfile, threading
import prep_assets
def grab(hold, ready, go):
    held = [bytearray(65536) for _ in range(4)]  # below the mmap threshold: from the thread's arena
    ready.release(); go.acquire(); hold.append(held)
ready, go, hold = threading.Semaphore(0), threading.Semaphore(0), []
threads = [threading.Thread(target=grab, args=(hold, ready, go)) for _ in range(int(sys.argv[1]))]
for t in threads: t.start()
for _ in threads: ready.acquire()  # all alive at once, each holding its memory
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile() as f:
    fp = libc.fdopen(os.dup(f.fileno()), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp)); libc.fclose(ctypes.c_void_p(fp))
    f.seek(0); heaps = f.read().count(b"<heap nr=")
for _ in threads: go.release()
for t in threads: t.join()
print(heaps)
"""


def _arenas(threads: int, variable: str = "MALLOC_ARENA_MAX", value: str | None = None) -> int:
    return int(_probe(ARENAS, variable, value, str(threads)))


@pytest.mark.skipif(not glibc(), reason="malloc arenas are glibc's (this C library is not glibc)")
def test_threads_share_two_malloc_arenas_per_core_unless_the_user_set_the_limit():
    # each thread's arena kept what it freed: 981 MiB peak on the benchmark with glibc's 8 per core, 762 with 2
    cap = 2 * (os.cpu_count() or 1)
    threads = cap + 4  # more threads than the cap, fewer than glibc's own limit (8 per core)
    assert _arenas(threads) <= cap
    # the user's setting wins (and the probe does see one arena per thread where the limit allows it)
    assert _arenas(threads, "MALLOC_ARENA_MAX", str(cap + 3)) == cap + 3
    assert _arenas(threads, "GLIBC_TUNABLES", f"glibc.malloc.arena_max={cap + 2}") == cap + 2
