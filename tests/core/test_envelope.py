"""Unit tests of the host-KV envelope (paper Eq. 2) and the migration reserve (Eq. 4)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dualpace_sim.core import envelope_fits, extend_reserve, migration_reserve
from dualpace_sim.core.envelope import tail_reserve

from .factories import cpu_running, make_req, make_state


def test_migration_reserve_hand_values():
    """Eq. 4: the reserve is the finish-peak of the shortest eviction-tail suffix whose removal
    makes the remaining aggregate peak fit HBM."""
    assert migration_reserve([4, 5, 3], 12) == 0  # fits: nothing to reserve
    assert migration_reserve([4, 5, 3], 10) == 3  # excess 2: the tail 3
    assert migration_reserve([4, 5, 3], 7) == 8  # excess 5: 3 + 5
    assert migration_reserve([4, 5, 3, 3], 10) == 6  # excess 5: 3 + 3
    assert migration_reserve([], 10) == 0


def test_migration_reserve_stops_when_excess_exactly_covered():
    """Eq. 4: the scan stops as soon as the reserve covers the excess exactly (excess 3 -> 3)."""
    assert migration_reserve([4, 5, 3], 9) == 3


def test_migration_reserve_scans_from_the_tail():
    """Eq. 4: the scan starts at the eviction-priority tail, not at the head."""
    assert migration_reserve([9, 1, 1], 10) == 1
    assert migration_reserve([1, 1, 9], 10) == 9


@given(
    st.lists(st.integers(1, 20), max_size=12),
    st.integers(1, 20),
    st.integers(0, 120),
)
def test_extend_reserve_equals_recomputing(peaks, added, capacity):
    """Eq. 4: appending a request at the tail and extending the reserve gives the same value as
    recomputing the tail scan over the grown queue."""
    reserve = migration_reserve(peaks, capacity)
    assert extend_reserve(reserve, sum(peaks), added, capacity) == migration_reserve(
        [*peaks, added], capacity
    )


def test_envelope_fits_boundary():
    """Eq. 2: B_used + B_planned + B_growth + B_migration <= B_capacity, equality allowed."""
    assert envelope_fits(1, 2, 3, 4, 10)
    assert not envelope_fits(1, 2, 3, 5, 10)
    assert not envelope_fits(2, 2, 3, 4, 10)
    assert not envelope_fits(1, 3, 3, 4, 10)
    assert not envelope_fits(1, 2, 4, 4, 10)


def test_state_envelope_uses_published_reserve_and_growth():
    """Eq. 2 on the shared state: B_used, B_growth and the published B_migration all count."""
    s = make_state(host=12)
    cpu_running(s, make_req(4, 16, 1))  # 1 block, peak 5: growth 4
    s.b_migration = 5
    assert s.host_envelope_fits(planned=2)  # 1 + 2 + 4 + 5 = 12
    assert not s.host_envelope_fits(planned=3)
    assert s.host_envelope_fits(planned=3, migration=4)


@given(st.lists(st.integers(1, 20), max_size=12), st.integers(0, 120))
def test_tail_reserve_reads_only_the_tail_it_reserves(peaks, capacity):
    """Eq. 4 from a running Σ finish-peak and the queue read from its tail: the same reserve as
    scanning the whole queue, reading only as many peaks as it reserves (plus the one that
    shows the rest fits)."""
    read = []

    def from_tail():
        for peak in reversed(peaks):
            read.append(peak)
            yield peak

    reserve = tail_reserve(from_tail(), sum(peaks), capacity)
    assert reserve == migration_reserve(peaks, capacity)
    assert reserve in (sum(read), sum(read[:-1]))  # reserved all it read, or all but one
