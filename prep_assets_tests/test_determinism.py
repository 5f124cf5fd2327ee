"""Same inputs, same bytes: full runs through Dagster with the drops materialized in another order, under
PYTHONHASHSEED 0 / 1 / random and with different batch sizes give byte-identical silver, gold, shards (with the
memmap and Megatron exports), dedup indexes and manifests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prep_assets_tests.conftest import PROJECT, copy_sample_data, tree_digests

pytestmark = pytest.mark.slow
# sample_text: two drops deduplicated across drops (order-sensitive if anything is), packed `full`, npy and
# Megatron exports; sample_chat: chat template rendering, tool calls, planted rejects; sample_pref: pairs
DATASETS = ("sample_text", "sample_chat", "sample_pref")

_CHILD = """
import sys
from pathlib import Path
from dagster import AssetKey, AssetSelection, DagsterInstance, materialize
from prep_assets.core.drops import register_drops
from prep_assets.core.lake import dataset_paths
from prep_assets.defs.keys import DATASET_MANIFEST, PARTITIONED, TOKENIZER
from prep_assets.defs.resources import LakeResource
from prep_assets_tests.defs.helpers import dataset_defs

data, order, batch = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with DagsterInstance.ephemeral() as instance:
    for ds in sys.argv[4:]:
        paths = dataset_paths(data, ds)
        register_drops(paths)
        keys = sorted(p.stem for p in paths.drops_dir.glob("*.json"))
        keys = keys[::-1] if order == "reversed" else keys
        instance.add_dynamic_partitions(f"{ds}_drops", keys)
        assets, lake = dataset_defs(data, ds), {"lake": LakeResource(data_dir=str(data), batch_size=batch)}
        assert materialize(assets, selection=[AssetKey([ds, TOKENIZER])], instance=instance, resources=lake).success
        layers = AssetSelection.assets(*(AssetKey([ds, n]) for n in PARTITIONED))
        for key in keys:
            assert materialize(assets, selection=layers, partition_key=key, instance=instance, resources=lake).success
        assert materialize(assets, selection=[AssetKey([ds, DATASET_MANIFEST])], instance=instance,
                           resources=lake).success
"""

RUNS = {  # name: (PYTHONHASHSEED, drop order, records per batch)
    "seed0": ("0", "sorted", 4096),
    "seed1": ("1", "reversed", 7),
    "seed_random": ("random", "reversed", 1000),
}


def test_drop_order_hash_seed_and_batch_size_change_no_output_byte(tmp_path: Path):
    procs = {}
    for name, (seed, order, batch) in RUNS.items():
        data = copy_sample_data(tmp_path / name)
        env = {**os.environ, "PYTHONHASHSEED": seed}
        procs[name] = (
            data,
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(data), order, str(batch), *DATASETS],
                cwd=PROJECT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        )
    digests = {}
    for name, (data, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        digests[name] = tree_digests(data / "lake", skip_hidden_names=True)
    first = digests["seed0"]
    layers = {k.split("/")[1] for k in first}
    assert {"silver", "gold", "shards", "dedup_index", "manifest.json"} <= layers
    assert any(k.endswith(".bin") for k in first) and any(k.endswith(".idx") for k in first)
    for name, other in digests.items():
        differing = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
        assert not differing, f"{name}: {differing[:10]}"
    print(f"determinism: {len(RUNS)} runs x {len(first)} files, sha256 identical")
