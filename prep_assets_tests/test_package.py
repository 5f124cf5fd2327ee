"""What importing the package sets up for the process."""

import os
import subprocess
import sys

from prep_assets_tests.conftest import PROJECT

PROBE = "import prep_assets, pyarrow; print(pyarrow.default_memory_pool().backend_name)"  # Arrow's C++ default


def _pool(env_pool: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_pool:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_pool
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=PROJECT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_arrow_uses_the_system_allocator_unless_the_user_chose_one():
    # mimalloc (Arrow's default) kept 240 MB that the Parquet reader's threads had freed, per layer
    assert _pool(None) == "system"
    assert _pool("mimalloc") == "mimalloc"
