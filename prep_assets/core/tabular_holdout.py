"""Safe Synthesizer's holdout split (`tabular.holdout`; docs/spec.md, "Safe Synthesizer recipe"): which records of a
drop leave training for the test split, drawn as SS draws them, so that the same seed holds out the same records.

The size: `holdout` below 1 is a fraction of the drop's records, from 1 a number of records; it is cut to
`max_holdout` and then to a whole number. A drop under 200 records, or a size under 10, is refused.
- Without groups: the records are permuted by numpy's `RandomState(seed)`; the first `size` of the permutation are
  held out, the rest train in the permutation's order (SS's training table is in that order).
- With groups: the groups (their distinct values, sorted) are permuted instead, 20 times by one `RandomState(seed)`;
  each permutation holds out its first groups, and the first of the 20 whose held-out records come nearest the
  aim is kept; records stay in input order. The number of groups held out is SS's: the size itself (a number of
  records, taken as a number of groups) when it is at most the number of groups and neither 0 nor 1, else 5 % of
  the groups rounded up; the aim is the size, or 5 % of the records when the 5 % of groups is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep_assets.core.errors import DropError

MIN_RECORDS = 200  # SS's MIN_RECORDS_FOR_TEXT_AND_PRIVACY_METRICS
MIN_HOLDOUT = 10
GROUP_FALLBACK = 0.05  # SS's DEFAULT_HOLDOUT, as a fraction of the groups
GROUP_DRAWS = 20  # SS's GroupShuffleSplit n_splits


class HoldoutRefused(DropError):
    """A drop Safe Synthesizer's holdout refuses to split."""

    def __init__(self, message: str) -> None:
        super().__init__(f"holdout (Safe Synthesizer's split): {message}")


@dataclass(frozen=True)
class Holdout:
    """One drop's split: record indices that train (in SS's order) and that are held out (in SS's order)."""

    train: list[int]
    test: list[int]


def holdout_size(records: int, holdout: float, max_holdout: int) -> int | None:
    """How many records SS holds out of a drop; None when the holdout is off (either key 0)."""
    if not holdout or not max_holdout:
        return None
    if records < MIN_RECORDS:
        raise HoldoutRefused(f"the drop has {records} records; a holdout needs at least {MIN_RECORDS}")
    size = int(min(records * holdout if holdout < 1 else holdout, max_holdout))
    if size < MIN_HOLDOUT:
        raise HoldoutRefused(
            f"holdout {holdout:g} of {records} records (max_holdout {max_holdout}) is {size} records; at least "
            f"{MIN_HOLDOUT} must be held out (raise tabular.holdout, or set it to 0)"
        )
    return size


def split_records(records: int, size: int, seed: int) -> Holdout:
    """Records held out one by one: the first `size` of a seeded permutation."""
    if size >= records:
        raise HoldoutRefused(f"{size} records held out of {records} would leave none to train")
    perm = np.random.RandomState(seed).permutation(records)
    return Holdout(perm[size:].tolist(), perm[:size].tolist())


def split_groups(values: list[Any], size: int, seed: int) -> Holdout:
    """Whole groups held out (`values`: each record's group value), the best of 20 seeded draws."""
    try:
        classes, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
    except TypeError:
        raise HoldoutRefused("the group values mix types that do not sort together (numbers and text)") from None
    n_groups = len(classes)
    share: float | None = None
    if size > n_groups or size in (0, 1):
        share = GROUP_FALLBACK
    n_test = math.ceil(share * n_groups) if share is not None else size
    if n_test >= n_groups:
        raise HoldoutRefused(
            f"{n_test} of the drop's {n_groups} groups would be held out, leaving none to train (SS takes a holdout "
            f"of up to the number of groups as a number of groups)"
        )
    aim = size if share is None else round(len(values) * share)
    rng = np.random.RandomState(seed)
    best: np.ndarray | None = None
    for _ in range(GROUP_DRAWS):
        held = np.isin(inverse, rng.permutation(n_groups)[:n_test])
        if best is None or abs(int(best.sum()) - aim) > abs(int(held.sum()) - aim):
            best = held
    assert best is not None
    return Holdout(np.flatnonzero(~best).tolist(), np.flatnonzero(best).tolist())
