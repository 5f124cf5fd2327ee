import math

import numpy as np
import pytest

from prep_assets.core.arrays import offsets_from_lengths
from prep_assets.core.packing import materialize_rows, plan_bfd, plan_packs, plan_single


def test_bfd_worked_example_from_docstring():
    assert plan_bfd(np.array([5, 3, 4, 2, 6]), 8) == [[4, 3], [0, 1], [2]]


def test_bfd_exactly_capacity_gets_its_own_row():
    assert plan_bfd(np.array([8, 1, 7]), 8) == [[0], [2, 1]]


def test_bfd_capacity_plus_one_is_an_error():
    with pytest.raises(ValueError, match="within 1..8"):
        plan_bfd(np.array([9]), 8)


def test_bfd_with_empty_input_and_empty_example():
    assert plan_bfd(np.array([], dtype=np.int64), 8) == []
    with pytest.raises(ValueError):
        plan_bfd(np.array([0, 3]), 8)


def test_bfd_max_sequences_per_example_closes_bins():
    assert plan_bfd(np.array([1, 1, 1, 1, 1]), 8, max_per_bin=2) == [[0, 1], [2, 3], [4]]


def test_bfd_prefers_tightest_bin_then_earliest():
    # free after first three: A=1 (7), B=3 (5), C=3 (5); a 3 goes to B (tightest, earliest of equals)
    assert plan_bfd(np.array([7, 5, 5, 3]), 8) == [[0], [1, 3], [2]]


def test_single_one_example_per_row_in_order():
    assert plan_single(np.array([3, 1, 2]), 8) == [[0], [1], [2]]


def test_bfd_invariants_on_random_lengths_near_lower_bound():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 1025, size=5000)
    bins = plan_bfd(lengths, 1024)
    used = sorted(i for b in bins for i in b)
    assert used == list(range(len(lengths)))
    assert max(lengths[b].sum() for b in bins) <= 1024
    assert len(bins) <= math.ceil(1.02 * lengths.sum() / 1024)


def test_shuffle_is_seeded():
    lengths = np.arange(1, 50)
    a = plan_packs(lengths, capacity=64, strategy="bfd", shuffle_seed=(1, 0))
    b = plan_packs(lengths, capacity=64, strategy="bfd", shuffle_seed=(1, 0))
    c = plan_packs(lengths, capacity=64, strategy="bfd", shuffle_seed=(2, 0))
    assert a == b and sorted(map(tuple, a)) == sorted(map(tuple, c)) and a != c


def test_materialize_rows_exact_layout():
    lengths = np.array([3, 2, 4])
    offsets = offsets_from_lengths(lengths)
    ids = np.array([10, 11, 12, 20, 21, 30, 31, 32, 33], dtype=np.int32)
    mask = np.array([0, 1, 1, 0, 1, 0, 1, 1, 1], dtype=np.uint8)
    types = np.array([1, 1, 3, 1, 3, 0, 1, 1, 3], dtype=np.uint8)
    rows = materialize_rows([[2, 1], [0]], token_ids=ids, loss_mask=mask, token_type_ids=types,
                            offsets=offsets, row_len=7, pad_id=99)
    assert rows.input_ids.reshape(2, 7).tolist() == [[30, 31, 32, 33, 20, 21, 99], [10, 11, 12, 99, 99, 99, 99]]
    assert rows.loss_mask.reshape(2, 7).tolist() == [[0, 1, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0, 0]]
    assert rows.position_ids.reshape(2, 7).tolist() == [[0, 1, 2, 3, 0, 1, 0], [0, 1, 2, 0, 0, 0, 0]]
    assert rows.segment_ids.reshape(2, 7).tolist() == [[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0]]
    assert rows.token_type_ids.reshape(2, 7).tolist() == [[0, 1, 1, 3, 1, 3, 2], [1, 1, 3, 2, 2, 2, 2]]
    assert rows.seg_lengths.tolist() == [4, 2, 3] and rows.seg_offsets.tolist() == [0, 2, 3]
    assert rows.example_order.tolist() == [2, 1, 0] and rows.num_loss_tokens.tolist() == [4, 2]


def test_materialize_rows_rejects_overfull_bin():
    offsets = offsets_from_lengths(np.array([4, 4]))
    z = np.zeros(8, dtype=np.int32)
    with pytest.raises(ValueError, match="more tokens"):
        materialize_rows([[0, 1]], token_ids=z, loss_mask=z.astype(np.uint8), token_type_ids=z.astype(np.uint8),
                         offsets=offsets, row_len=7, pad_id=0)
