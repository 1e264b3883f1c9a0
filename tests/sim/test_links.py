"""PCIe link: full duplex, FIFO per direction, latency plus bandwidth."""

from __future__ import annotations

import numpy as np
import pytest

from dualpace_sim.sim.links import Link


def test_directions_are_independent_and_each_is_fifo():
    link = Link(h2d_bytes_per_s=10.0, d2h_bytes_per_s=20.0, latency_s=1.0)
    assert link.h2d.transfer(0.0, 100) == pytest.approx((0.0, 11.0))
    assert link.d2h.transfer(0.0, 100) == pytest.approx((0.0, 6.0))  # not behind the H2D one
    assert link.h2d.transfer(2.0, 10) == pytest.approx((11.0, 13.0))  # queued behind the first
    assert link.h2d.transfer(20.0, 10) == pytest.approx((20.0, 22.0))  # idle link: no queueing


def test_carried_assist_bytes_are_counted_but_never_delay_kv_copies():
    link = Link(10.0, 10.0, 1.0)
    link.d2h.transfer(0.0, 40)  # busy until 5
    link.d2h.carry(10, 1.0)
    assert link.d2h.free_at == pytest.approx(5.0)
    assert link.d2h.bytes_moved == 50


def test_a_series_of_transfers_booked_in_one_call_lands_as_one_by_one():
    """transfer_each books what a transfer per issue time books: the same queueing, the same
    last landing, the same bytes and busy time."""
    issues = [0.0, 0.5, 1.0, 9.0, 9.1]
    one, each = Link(10.0, 20.0, 0.5), Link(10.0, 20.0, 0.5)
    last = [one.d2h.transfer(t, 30)[1] for t in issues][-1]
    assert each.d2h.transfer_each(issues, 30) == last
    assert (each.d2h.free_at, each.d2h.bytes_moved, each.d2h.busy_s) == (
        one.d2h.free_at, one.d2h.bytes_moved, one.d2h.busy_s)
    # and the same busy time, in the same bins, for utilisation over time
    assert each.d2h.worked.busy.tolist() == pytest.approx(one.d2h.worked.busy.tolist())


def test_a_direction_logs_when_it_moved_data():
    link = Link(10.0, 10.0, 1.0)
    link.d2h.transfer(0.0, 40)  # 0-5
    link.d2h.transfer(1.0, 10)  # queued: 5-7
    link.d2h.carry(10, 8.0)  # at the bandwidth: 8-9
    covered = link.d2h.worked.covered(np.array([0.0, 5.0, 7.0, 8.0, 9.0, 20.0]))
    assert np.diff(covered) == pytest.approx([5.0, 2.0, 0.0, 1.0, 0.0], abs=1e-9)
