"""The gates run together: the shard gates that read one pass over the shard rows report what each finds alone."""

from pathlib import Path

import pytest

from prep_assets.core import gates
from prep_assets.core import invariants as inv
from prep_assets.core.lake import dataset_paths
from prep_assets_tests.conftest import make_spec
from prep_assets_tests.core.test_invariants import GOOD, _gold, _row, _shard

PAD = [0] * 5


def _row8(**over: list) -> dict:
    """test_invariants' row, padded to 8 tokens (the smallest max_seq_len a spec takes)."""
    base = {
        "input_ids": [5, 6, 7],
        "loss_mask": [0, 1, 1],
        "position_ids": [0, 1, 2],
        "segment_ids": [1, 1, 1],
        "token_type_ids": [1, 1, 3],
    }
    base.update(over)
    return _row(**{k: v + ([2] * 5 if k == "token_type_ids" else PAD) for k, v in base.items()})


BY_ROWS = ["packed_shards_fixed_length", "packed_shards_positions_restart", "packed_shards_match_gold"]


@pytest.fixture
def lake(tmp_path: Path):
    """A partition whose shards break fixed_length (row 1), positions_restart (row 2) and match_gold (row 3)."""
    paths = dataset_paths(tmp_path, "ds")
    _shard(
        paths.partition_dir("shards", "k") / "train" / "part-00000.parquet",
        [_row8(), _row8(input_ids=[5, 6]), _row8(position_ids=[0, 1, 3]), _row8(input_ids=[5, 7, 6])],
    )
    _gold(paths.partition_dir("gold", "k"), [GOOD])
    spec = make_spec(sequence={"max_seq_len": 8})
    return spec, paths, [g for g in gates.gates_for(spec) if g.name in BY_ROWS]


def test_shard_gates_run_together_report_what_each_finds_alone(lake):
    spec, paths, chosen = lake
    together = gates.outcomes(spec, paths, "k", chosen)
    assert [g.name for g, _ in together] == BY_ROWS
    for g, outcome in together:
        assert outcome == g.probe(spec, paths, "k") and not outcome.passed  # type: ignore[union-attr]
    assert [[r["row"] for r in o.offending] for _, o in together][0] == [1]  # type: ignore[union-attr]


def test_a_failing_shared_pass_is_reported_by_each_gate_that_reads_it(lake, monkeypatch):
    spec, paths, chosen = lake
    other = next(g for g in gates.gates_for(spec) if g.name == "packed_shards_utilization")

    def broken(*_: object) -> None:
        raise RuntimeError("the shard pass broke")

    monkeypatch.setattr(inv, "shard_rows", broken)
    out = gates.outcomes(spec, paths, "k", [*chosen, other])
    assert [(g.name, str(o)) for g, o in out if isinstance(o, Exception)] == [
        (name, "the shard pass broke") for name in BY_ROWS
    ]
    assert isinstance(out[-1][1], inv.Outcome)  # a gate that reads the shards on its own still reports


def test_a_gate_that_raises_on_the_shared_rows_leaves_the_others_their_outcomes(lake, monkeypatch):
    spec, paths, chosen = lake

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("positions broke")

    monkeypatch.setattr(inv, "shards_positions_restart", broken)
    out = dict((g.name, o) for g, o in gates.outcomes(spec, paths, "k", chosen))
    assert str(out["packed_shards_positions_restart"]) == "positions broke"
    assert [r["row"] for r in out["packed_shards_fixed_length"].offending] == [1]  # type: ignore[union-attr]
    assert not out["packed_shards_match_gold"].passed  # type: ignore[union-attr]
