"""Unit tests of the paged KV block pools."""

from __future__ import annotations

import pytest

from dualpace_sim.core import BlockPool


def test_allocate_hands_out_distinct_ids_and_accounts():
    """A pool hands out distinct ids in range and tracks used/free."""
    pool = BlockPool("HBM", 5)
    a = pool.allocate(2)
    b = pool.allocate(3)
    assert sorted(a + b) == [0, 1, 2, 3, 4]
    assert pool.used == 5 and pool.free == 0
    assert pool.allocate(0) == []
    pool.release(a)
    assert pool.used == 3 and pool.free == 2


def test_over_allocation_raises():
    """Over-allocation is a scheduler bug: the pool raises and hands out nothing."""
    pool = BlockPool("host", 3)
    pool.allocate(2)
    with pytest.raises(RuntimeError, match="over-allocated"):
        pool.allocate(2)
    assert pool.free == 1


def test_double_free_asserts():
    """Releasing the same blocks twice trips the double-free assertion."""
    pool = BlockPool("host", 4)
    blocks = pool.allocate(1)
    pool.release(blocks)
    with pytest.raises(AssertionError, match="double free"):
        pool.release(blocks)


def test_negative_capacity_rejected():
    """A pool's capacity must be >= 0."""
    with pytest.raises(ValueError):
        BlockPool("HBM", -1)
    assert BlockPool("HBM", 0).free == 0


def test_a_pool_of_any_capacity_costs_only_the_blocks_in_use():
    """10^15 blocks (a typo'd pool size) allocate at once; ids come from the low end, released
    ids are reused last-in first-out before fresh ones, as from a free list of every id."""
    pool = BlockPool("host", 10**15)
    assert pool.allocate(3) == [2, 1, 0]
    assert pool.allocate(2) == [4, 3]
    pool.release([1, 3])
    assert pool.allocate(1) == [3]
    assert pool.allocate(3) == [6, 5, 1]
    assert pool.used == 7 and pool.free == 10**15 - 7
