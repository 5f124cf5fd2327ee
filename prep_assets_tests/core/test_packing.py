"""Packing on tiny integer lists: exact rows for every strategy x overflow policy, and the edge cases.

Capacity 8 throughout. Examples A (5 tokens), B (3), C (11, longer than a row) and D (2); token ids
name the example (A = 11..15, B = 21..23, C = 31..41, D = 51, 52). The gold step (`apply_overflow` with the
spec's effective policy) runs first, as in the pipeline; pad id 0; no row shuffle.
"""

import math

import numpy as np
import pytest

from prep_assets.core.arrays import offsets_from_lengths
from prep_assets.core.errors import SpecError
from prep_assets.core.masking import apply_overflow
from prep_assets.core.packing import RowPlan, plan_bfd, plan_ffd, plan_rows, plan_single, unit_offsets, window_pieces
from prep_assets.core.rows import materialize_rows
from prep_assets_tests.conftest import make_spec

CAP = 8
A, B, C, D = list(range(11, 16)), [21, 22, 23], list(range(31, 42)), [51, 52]


def _pad(ids: list[int]) -> list[int]:
    return ids + [0] * (CAP - len(ids))


def pack(examples, strategy, overflow="drop", overlap=0, max_per=None, masks=None, types=None):
    """Gold overflow then plan + materialize; returns (rows as lists, PackedRows, plan, gold batch)."""
    spec = make_spec(
        sequence={"max_seq_len": CAP, "overflow": overflow, "overlap": overlap},
        packing={"strategy": strategy, "max_sequences_per_example": max_per},
    )
    lengths = np.array([len(e) for e in examples], dtype=np.int64)
    ids = np.array([t for e in examples for t in e], dtype=np.int32)
    mask = np.array([m for e in (masks or [[0] + [1] * (len(e) - 1) for e in examples]) for m in e], dtype=np.uint8)
    typ = np.array([t for e in (types or [[1] * len(e) for e in examples]) for t in e], dtype=np.uint8)
    gold = apply_overflow(ids, mask, typ, lengths, policy=spec.gold_overflow, max_len=CAP)
    plan = plan_rows(
        np.diff(gold.offsets),
        capacity=CAP,
        strategy=strategy,
        overflow=overflow,
        overlap=overlap,
        loss_mask=gold.loss_mask,
        max_per_bin=max_per,
    )
    rows = materialize_rows(
        plan,
        token_ids=gold.token_ids,
        loss_mask=gold.loss_mask,
        token_type_ids=gold.token_type_ids,
        offsets=gold.offsets,
        row_len=CAP,
        pad_id=0,
    )
    return rows.input_ids.reshape(-1, CAP).tolist(), rows, plan, gold


EXPECTED = {
    ("bfd", "drop"): [A + B, _pad(D)],
    ("ffd", "drop"): [A + B, _pad(D)],
    ("single", "drop"): [_pad(A), _pad(B), _pad(D)],
    ("bfd", "truncate_right"): [C[:8], A + B, _pad(D)],
    ("ffd", "truncate_right"): [C[:8], A + B, _pad(D)],
    ("single", "truncate_right"): [_pad(A), _pad(B), C[:8], _pad(D)],
    ("bfd", "truncate_left"): [C[3:], A + B, _pad(D)],
    ("ffd", "truncate_left"): [C[3:], A + B, _pad(D)],
    ("single", "truncate_left"): [_pad(A), _pad(B), C[3:], _pad(D)],
    # overlap 2: C becomes windows C[0:8] and C[6:11]; the second packs with D
    ("bfd", "window"): [C[:8], A + B, _pad(C[6:] + D)],
    ("ffd", "window"): [C[:8], A + B, _pad(C[6:] + D)],
    ("single", "window"): [_pad(A), _pad(B), C[:8], _pad(C[6:]), _pad(D)],
}
FULL_ROWS = [A + B, C[:8], _pad(C[8:] + D)]  # full ignores the overflow policy: C continues in the next row


@pytest.mark.parametrize(("strategy", "overflow"), sorted(EXPECTED))
def test_every_strategy_and_overflow_policy_gives_exact_rows(strategy, overflow):
    rows, packed, _, gold = pack([A, B, C, D], strategy, overflow, overlap=2 if overflow == "window" else 0)
    assert rows == EXPECTED[(strategy, overflow)]
    if overflow == "drop":
        assert gold.rejects[0][:2] == (2, "too_long") and gold.tokens_dropped == 11
    elif overflow.startswith("truncate"):
        assert gold.tokens_dropped == 3 and gold.cut.tolist() == [0, 0, 3, 0]
    else:
        assert gold.tokens_dropped == 0  # windows are cut at packing, gold keeps C whole
    assert int(packed.loss_mask.sum()) == sum(int(r) for r in packed.num_loss_tokens)


@pytest.mark.parametrize("overflow", ["drop", "truncate_right", "truncate_left", "window"])
def test_full_concatenates_across_rows_whatever_the_overflow_policy(overflow):
    rows, packed, plan, gold = pack([A, B, C, D], "full", overflow)
    assert rows == FULL_ROWS and gold.tokens_dropped == 0 and gold.rejects == []
    seg = packed.segment_ids.reshape(-1, CAP).tolist()
    pos = packed.position_ids.reshape(-1, CAP).tolist()
    mask = packed.loss_mask.reshape(-1, CAP).tolist()
    assert seg == [[1] * 5 + [2] * 3, [1] * 8, [1, 1, 1, 2, 2, 0, 0, 0]]
    assert pos == [[0, 1, 2, 3, 4, 0, 1, 2], list(range(8)), [0, 1, 2, 0, 1, 0, 0, 0]]
    # each segment start is masked, including where C continues (its offsets 0 and 8 in rows 2 and 3)
    assert mask == [[0, 1, 1, 1, 1, 0, 1, 1], [0] + [1] * 7, [0, 1, 1, 0, 1, 0, 0, 0]]
    assert plan.start.tolist() == [0, 0, 0, 8, 0] and plan.example.tolist() == [0, 1, 2, 2, 3]


def test_window_layout_masks_the_overlap_and_keeps_eos_only_in_the_last_window():
    types = [[1] * 4 + [3], [1, 1, 3], [1] * 10 + [3], [1, 3]]
    _, packed, plan, _ = pack([A, B, C, D], "single", "window", overlap=2, types=types)
    rows = {tuple(r) for r in packed.input_ids.reshape(-1, CAP).tolist()}
    assert tuple(_pad(C[6:])) in rows
    k = plan.example.tolist().index(2)  # C's first window, then its second
    assert plan.start.tolist()[k : k + 2] == [0, 6] and plan.masked.tolist()[k : k + 2] == [0, 2]
    second = packed.loss_mask.reshape(-1, CAP)[k + 1].tolist()
    assert second == [0, 0, 1, 1, 1, 0, 0, 0]  # 37, 38 repeat the first window and are masked; 39..41 train
    t = packed.token_type_ids.reshape(-1, CAP)
    assert 3 not in t[k].tolist() and t[k + 1].tolist()[4] == 3  # EOS only at the end of the last window
    assert plan.overlap_tokens == 2 and plan.dropped_tokens == 0


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "single", "full"])
def test_every_strategy_empty_example_is_an_error(strategy):
    with pytest.raises(ValueError, match="lengths must be within 1"):
        plan_rows(np.array([3, 0, 2]), capacity=CAP, strategy=strategy)


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "single"])
def test_exactly_max_seq_len_is_one_full_row_with_no_window(strategy):
    rows, _, plan, gold = pack([C[:8]], strategy, "window", overlap=2)
    assert rows == [C[:8]] and plan.overlap_tokens == 0 and gold.tokens_dropped == 0


def test_max_seq_len_plus_one_under_each_policy():
    nine = C[:9]
    assert pack([nine], "bfd", "drop")[3].rejects[0][1] == "too_long"
    assert pack([nine], "bfd", "truncate_right")[0] == [C[:8]]
    assert pack([nine], "bfd", "truncate_left")[0] == [C[1:9]]
    rows, packed, _, _ = pack([nine], "bfd", "window", overlap=2)
    assert rows == [C[:8], _pad(C[6:9])]  # the second window: 2 overlap tokens and the one new token
    assert packed.loss_mask.reshape(-1, CAP)[1].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]


def test_window_overlap_half_of_max_seq_len():
    twelve = list(range(100, 112))
    rows, _, plan, _ = pack([twelve], "single", "window", overlap=4)
    assert rows == [twelve[:8], twelve[4:]] and plan.overlap_tokens == 4


def test_window_overlap_above_half_is_a_spec_error():
    with pytest.raises(SpecError, match="at most max_seq_len / 2"):
        make_spec(sequence={"max_seq_len": 8, "overflow": "window", "overlap": 5})
    with pytest.raises(SpecError, match="only to overflow: window"):
        make_spec(sequence={"max_seq_len": 8, "overflow": "drop", "overlap": 2})


def test_window_with_no_loss_token_left_is_dropped_and_counted():
    ex = list(range(100, 114))  # 14 tokens; only the first 6 train: the second window [6, 14) has none
    mask = [[0] + [1] * 5 + [0] * 8]
    rows, _, plan, _ = pack([ex], "single", "window", overlap=2, masks=mask)
    assert rows == [ex[:8]] and plan.dropped_pieces == 1 and plan.dropped_tokens == 6 and plan.overlap_tokens == 0


def test_full_refuses_an_overlap():
    with pytest.raises(SpecError, match="full cuts examples across rows"):
        make_spec(sequence={"max_seq_len": 8, "overflow": "window", "overlap": 2}, packing={"strategy": "full"})


def test_window_dropped_counts_only_tokens_in_no_kept_window():
    ex = list(range(100, 116))  # 16 tokens, loss only on 10..15; windows [0,8) [4,12) [8,16) at overlap 4
    rows, _, plan, _ = pack([ex], "single", "window", overlap=4, masks=[[0] * 10 + [1] * 6])
    assert rows == [ex[4:12], ex[8:16]] and plan.dropped_pieces == 1
    assert plan.dropped_tokens == 4 and plan.overlap_tokens == 4  # 0..3 are in no window; 8..11 are in two


def test_truncation_leaving_nothing_trainable_counts_the_record_as_lost_to_overflow():
    ex = list(range(100, 112))  # trained only at the front: truncate_left keeps the last 8, all masked
    _, _, plan, gold = pack([ex, B], "bfd", "truncate_left", masks=[[0, 1, 1] + [0] * 9, [0, 1, 1]])
    assert [r[1] for r in gold.rejects] == ["no_trained_tokens"]
    assert gold.lost == [(0, 12)] and gold.tokens_dropped == 12 and gold.kept.tolist() == [1]


def test_window_overlap_zero_masks_each_window_start():
    pieces, dropped, windows, added = window_pieces(np.array([17]), 8, 0, np.ones(17, dtype=np.uint8))
    assert pieces.start.tolist() == [0, 8] and pieces.length.tolist() == [8, 8] and pieces.masked.tolist() == [0, 1]
    assert (dropped, windows, added) == (1, 1, 0)  # the third window [16, 17) is one masked token: not emitted


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
def test_one_token_over_a_row_opens_a_second_row(strategy):
    assert pack([A, [61, 62, 63, 64]], strategy)[0] == [_pad(A), _pad([61, 62, 63, 64])]
    assert pack([A, [61, 62, 63]], strategy)[0] == [A + [61, 62, 63]]


def test_full_one_token_over_continues_in_a_padded_row():
    rows, _, plan, _ = pack([A, [61, 62, 63, 64]], "full")
    assert rows == [A + [61, 62, 63], _pad([64])] and plan.masked.tolist() == [0, 0, 1]


def test_full_max_sequences_per_example_closes_rows():
    rows, _, plan, _ = pack([B, B, B], "full", max_per=2)
    assert rows == [_pad(B + B), _pad(B)] and plan.row_offsets.tolist() == [0, 2, 3]


def test_bfd_worked_example_from_docstring():
    assert plan_bfd(np.array([5, 3, 4, 2, 6]), 8) == [[4, 3], [0, 1], [2]]


def test_bfd_reaches_the_bound_where_first_and_best_fit_by_item_do_not():
    lengths = np.array([4, 4, 3, 3, 3, 3])  # 20 tokens in rows of 10: [4, 3, 3] twice
    assert sorted(map(sorted, plan_bfd(lengths, 10))) == [[0, 2, 3], [1, 4, 5]]
    assert len(plan_ffd(lengths, 10)) == 3


def test_bfd_exactly_capacity_gets_its_own_row():
    assert plan_bfd(np.array([8, 1, 7]), 8) == [[0], [2, 1]]


def test_bfd_capacity_plus_one_is_an_error():
    with pytest.raises(ValueError, match="within 1..8"):
        plan_bfd(np.array([9]), 8)


@pytest.mark.parametrize("planner", [plan_bfd, plan_ffd])
def test_max_sequences_per_example_closes_rows(planner):
    assert planner(np.array([1, 1, 1, 1, 1]), 8, max_per_bin=2) == [[0, 1], [2, 3], [4]]


def test_ffd_puts_each_example_in_the_first_row_with_room():
    # rows after 7, 5, 5: free 1, 3, 3; a 3 goes to the first with room (row 2), a 1 to row 1
    assert plan_ffd(np.array([7, 5, 5, 3, 1]), 8) == [[0, 4], [1, 3], [2]]


def test_single_one_example_per_row_in_order():
    assert plan_single(np.array([3, 1, 2]), 8) == [[0], [1], [2]]


@pytest.mark.parametrize("planner", [plan_bfd, plan_ffd])
def test_planners_place_everything_within_capacity_near_the_bound(planner):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 1025, size=5000)
    bins = planner(lengths, 1024)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert max(lengths[b].sum() for b in bins) <= 1024
    assert len(bins) <= math.ceil(1.01 * lengths.sum() / 1024)


def test_pairs_stay_in_one_row_as_units():
    lengths = np.array([3, 4, 2, 2, 6])  # pair (0, 1), pair (2, 3), single 4
    units = unit_offsets(["p", "p", "q", "q", None])
    plan = plan_rows(lengths, capacity=8, strategy="bfd", units=units)
    rows = [plan.example[a:b].tolist() for a, b in zip(plan.row_offsets[:-1], plan.row_offsets[1:])]
    assert sorted(rows) == [[0, 1], [4, 2, 3]] or sorted(rows) == [[0, 1], [2, 3], [4]]
    assert all(({0, 1} <= set(r)) or not ({0, 1} & set(r)) for r in rows)
    with pytest.raises(ValueError, match="units"):
        plan_rows(lengths, capacity=8, strategy="full", units=units)


def test_shuffle_is_seeded_and_only_reorders_rows():
    lengths = np.arange(1, 50)
    a = plan_rows(lengths, capacity=64, strategy="bfd", shuffle_seed=(1, 0))
    b = plan_rows(lengths, capacity=64, strategy="bfd", shuffle_seed=(1, 0))
    c = plan_rows(lengths, capacity=64, strategy="bfd", shuffle_seed=(2, 0))
    assert a.example.tolist() == b.example.tolist() and a.row_offsets.tolist() == b.row_offsets.tolist()
    assert a.example.tolist() != c.example.tolist() and sorted(a.example.tolist()) == sorted(c.example.tolist())


def test_materialize_rows_exact_layout():
    lengths = np.array([3, 2, 4])
    offsets = offsets_from_lengths(lengths)
    ids = np.array([10, 11, 12, 20, 21, 30, 31, 32, 33], dtype=np.int32)
    mask = np.array([0, 1, 1, 0, 1, 0, 1, 1, 1], dtype=np.uint8)
    types = np.array([1, 1, 3, 1, 3, 0, 1, 1, 3], dtype=np.uint8)
    zero = np.zeros(3, dtype=np.int64)
    plan = RowPlan(np.array([2, 1, 0]), zero, lengths[[2, 1, 0]], zero, np.array([0, 2, 3]))
    rows = materialize_rows(
        plan, token_ids=ids, loss_mask=mask, token_type_ids=types, offsets=offsets, row_len=7, pad_id=99
    )
    assert rows.input_ids.reshape(2, 7).tolist() == [[30, 31, 32, 33, 20, 21, 99], [10, 11, 12, 99, 99, 99, 99]]
    assert rows.loss_mask.reshape(2, 7).tolist() == [[0, 1, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0, 0]]
    assert rows.position_ids.reshape(2, 7).tolist() == [[0, 1, 2, 3, 0, 1, 0], [0, 1, 2, 0, 0, 0, 0]]
    assert rows.segment_ids.reshape(2, 7).tolist() == [[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0]]
    assert rows.token_type_ids.reshape(2, 7).tolist() == [[0, 1, 1, 3, 1, 3, 2], [1, 1, 3, 2, 2, 2, 2]]
    assert rows.seg_lengths.tolist() == [4, 2, 3] and rows.seg_offsets.tolist() == [0, 2, 3]
    assert rows.example_order.tolist() == [2, 1, 0] and rows.num_loss_tokens.tolist() == [4, 2]
    assert rows.seg_starts.tolist() == [0, 0, 0]


@pytest.mark.parametrize("overlap", [0, 3, 16])
def test_window_pieces_given_example_loss_equal_summing_every_window(overlap):
    """Known loss counts spare reading the mask of one-window examples; the windows kept are the same, including
    examples with no loss token at all and long examples whose later windows have none."""
    from prep_assets.core.arrays import segment_sums

    rng = np.random.default_rng(overlap)
    for _ in range(200):
        lengths = rng.integers(1, 100, size=int(rng.integers(0, 30)))
        mask = (rng.random(int(lengths.sum())) < rng.choice([0.0, 0.02, 0.5])).astype(np.uint8)
        loss = segment_sums(mask, offsets_from_lengths(lengths))
        a = window_pieces(lengths, 32, overlap, mask)
        b = window_pieces(lengths, 32, overlap, mask, example_loss=loss)
        assert a[1:] == b[1:]
        assert all((x == y).all() for x, y in zip(vars(a[0]).values(), vars(b[0]).values(), strict=True))


def test_window_pieces_refuses_loss_counts_for_other_examples():
    with pytest.raises(ValueError, match="2 counts for 3 examples"):
        window_pieces(np.array([3, 40, 2]), 32, 0, np.ones(45, dtype=np.uint8), example_loss=np.array([1, 1]))


def test_bfd_fills_each_row_after_its_longest_item_with_the_best_subset_left():
    """Bin by bin: the first item is the longest left, the others the subset of what is left with the largest sum
    that fits (brute force over the remaining lengths, small random cases; sizes used up along the way)."""
    from collections import Counter
    from itertools import product

    rng = np.random.default_rng(7)
    for _ in range(300):
        cap = int(rng.integers(4, 40))
        lengths = rng.integers(1, cap + 1, size=int(rng.integers(1, 11)))
        left = Counter(lengths.tolist())
        for row in plan_bfd(lengths, cap):
            first, rest = int(lengths[row[0]]), [int(lengths[i]) for i in row[1:]]
            assert first == max(left)
            left[first] -= 1
            sizes = [k for k in left if left[k]]
            best = max(
                sum(k * n for k, n in zip(sizes, counts, strict=True))
                for counts in product(*(range(left[k] + 1) for k in sizes))
                if sum(k * n for k, n in zip(sizes, counts, strict=True)) <= cap - first
            )
            assert sum(rest) == best, (lengths.tolist(), cap, row)
            left.subtract(rest)
            left = +left


def test_segment_sums_with_empty_segments_anywhere():
    from prep_assets.core.arrays import segment_sums

    values = np.array([1, 0, 1, 1, 5], dtype=np.uint8)
    assert segment_sums(values, np.array([0, 0, 2, 2, 5, 5])).tolist() == [0, 1, 0, 7, 0]
    assert segment_sums(values, np.array([0])).tolist() == []
    assert segment_sums(np.zeros(0, dtype=np.uint8), np.array([0, 0])).tolist() == [0]
    assert segment_sums(np.full(300, 255, dtype=np.uint8), np.array([0, 300])).tolist() == [76500]  # no uint8 wrap


def test_range_sums_in_small_spans_equal_one_cumulative_sum():
    from prep_assets.core.packing import range_sums

    rng = np.random.default_rng(0)
    values = rng.integers(0, 2, 100_000)
    lo = np.sort(rng.integers(0, 99_000, 5_000))
    hi = np.maximum.accumulate(np.minimum(lo + rng.integers(0, 1_000, 5_000), 100_000))
    cum = np.concatenate([[0], np.cumsum(values)])
    for span in (1, 137, 1 << 22):  # a span smaller than one range still takes that range whole
        for skip in (0, 50, 1 << 16):
            assert (range_sums(values, lo, hi, span=span, skip=skip) == cum[hi] - cum[lo]).all()


def test_range_sums_read_the_ranges_not_the_gaps_between_them():
    """A few long examples' windows far apart (a split's windowed examples): the values between them are not read."""
    from prep_assets.core.packing import range_sums

    class Counted:
        def __init__(self, values: np.ndarray) -> None:
            self.values, self.read = values, 0

        def __getitem__(self, key: slice) -> np.ndarray:
            self.read += key.stop - key.start
            return self.values[key]

    values = np.random.default_rng(1).integers(0, 2, 10_000_000)
    lo = np.array([5, 1_000, 3_000_000, 3_004_000, 9_999_000])
    hi = np.array([1_000, 1_500, 3_004_000, 3_006_000, 10_000_000])
    cum = np.concatenate([[0], np.cumsum(values)])
    counted = Counted(values)
    assert (range_sums(counted, lo, hi) == cum[hi] - cum[lo]).all()
    assert counted.read == 1_495 + 6_000 + 1_000


def _row_groups(plan: RowPlan, groups: np.ndarray) -> list[list[int]]:
    return [
        sorted({int(groups[e]) for e in plan.example[a:b]})
        for a, b in zip(plan.row_offsets[:-1], plan.row_offsets[1:])
    ]


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "single", "full"])
def test_groups_pack_each_group_apart_in_ascending_order_and_contiguous(strategy: str):
    lengths = np.array([3, 3, 2, 2, 4, 1, 5, 2])
    groups = np.array([2, 0, 2, 0, 1, 2, 0, 1])
    plan = plan_rows(lengths, capacity=5, strategy=strategy, groups=groups, shuffle_seed=(7, 0))
    per_row = _row_groups(plan, groups)
    assert all(len(g) == 1 for g in per_row)  # a row holds one group
    firsts = [g[0] for g in per_row]
    assert firsts == sorted(firsts)  # groups in ascending order, each one run of rows
    kept = np.bincount(plan.example, weights=plan.length, minlength=len(lengths))
    assert kept.tolist() == lengths.tolist()  # every token of every example, once


def test_one_group_plans_the_same_rows_as_no_groups():
    lengths = np.array([5, 3, 4, 2, 6, 1, 7])
    for strategy in ("bfd", "full"):
        plain = plan_rows(lengths, capacity=8, strategy=strategy, shuffle_seed=3)
        grouped = plan_rows(lengths, capacity=8, strategy=strategy, shuffle_seed=3, groups=np.zeros(7, np.int64))
        assert (
            plain.example.tolist() == grouped.example.tolist()
            and plain.row_offsets.tolist() == grouped.row_offsets.tolist()
        )


def test_groups_keep_a_preference_pair_together_and_refuse_a_pair_across_groups():
    lengths, units = np.array([2, 2, 3, 3]), np.array([0, 2, 4])
    plan = plan_rows(lengths, capacity=6, strategy="ffd", units=units, groups=np.array([1, 1, 0, 0]))
    assert [plan.example[a:b].tolist() for a, b in zip(plan.row_offsets[:-1], plan.row_offsets[1:])] == [
        [2, 3],
        [0, 1],
    ]
    with pytest.raises(ValueError, match="spans two groups"):
        plan_rows(lengths, capacity=6, strategy="ffd", units=units, groups=np.array([1, 0, 0, 0]))
