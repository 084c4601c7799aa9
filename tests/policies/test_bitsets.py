"""Bitsets as Python ints: members are found whatever the shape of the set."""

from __future__ import annotations

import random

import pytest

from policies.bitsets import from_slots, members


@pytest.mark.parametrize(
    ("width", "count"),
    [(1, 1), (64, 3), (1000, 23), (1000, 900), (10_000, 40), (10_000, 5000), (200_000, 30)],
)
def test_members_lists_every_slot_in_order_for_sparse_and_dense_sets(width, count):
    slots = sorted(random.Random(width + count).sample(range(width), count))
    assert members(from_slots(slots)) == slots


def test_members_of_the_empty_set_is_empty():
    assert members(0) == []
