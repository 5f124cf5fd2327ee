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
