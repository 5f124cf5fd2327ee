"""Fixtures the core tests share: a lake whose shards break three row-level gates; GPT-Simple's own modules."""

import subprocess
import sys
from pathlib import Path

import pytest

from prep_assets.core import gates
from prep_assets.core.lake import dataset_paths
from prep_assets_tests.conftest import make_spec
from prep_assets_tests.core.lakes import BY_ROWS, GOOD, shard_row8, write_gold, write_shard


@pytest.fixture
def lake(tmp_path: Path):
    """A partition whose shards break fixed_length (row 1), positions_restart (row 2) and match_gold (row 3): the
    spec, its paths and the gates that read the shared pass over the shard rows."""
    paths = dataset_paths(tmp_path, "ds")
    write_shard(
        paths.partition_dir("shards", "k") / "train" / "part-00000.parquet",
        [
            shard_row8(),
            shard_row8(input_ids=[5, 6]),
            shard_row8(position_ids=[0, 1, 3]),
            shard_row8(input_ids=[5, 7, 6]),
        ],
    )
    write_gold(paths.partition_dir("gold", "k"), [GOOD])
    spec = make_spec(sequence={"max_seq_len": 8})
    return spec, paths, [g for g in gates.gates_for(spec) if g.name in BY_ROWS]


GPTS_VERSION = "0.1.2"  # gpt-simple-lm, whose readers and validator the GPT-Simple tests run


@pytest.fixture(scope="session")
def gpt_simple_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `gpt_simple` package folder of gpt-simple-lm installed without its dependencies into a scratch folder
    (it pins numpy<2.0, so it is not in the dev extra); skips when it cannot be installed (no package index)."""
    target = tmp_path_factory.mktemp("gpt_simple_lm")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--target", str(target)]
    done = subprocess.run([*cmd, f"gpt-simple-lm=={GPTS_VERSION}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"gpt-simple-lm {GPTS_VERSION} could not be installed: {done.stderr.strip()[-300:]}")
    return target / "gpt_simple"
