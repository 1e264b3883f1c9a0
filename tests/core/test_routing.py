"""Unit tests of post-attention routing π_{P,F} (paper Eq. 5) and Dense Assist reachability."""

from __future__ import annotations

import pytest

from dualpace_sim.core import (
    Route,
    SchedulerConfig,
    assist_reachable,
    check_thresholds,
    route_for,
)


@pytest.mark.parametrize(
    ("batch", "route"),
    [
        (1, Route.FULL_CPU),
        (2, Route.FULL_CPU),  # b = F
        (3, Route.SPLIT_FINAL),  # b = F + 1
        (4, Route.SPLIT_FINAL),  # b = P
        (5, Route.FUSED_ASSIST),  # b = P + 1
        (200, Route.FUSED_ASSIST),
    ],
)
def test_route_boundaries(batch, route):
    """Eq. 5: b <= F is Full-CPU, F < b <= P is Split-Final, b > P is Fused-Assist (P=4, F=2)."""
    assert route_for(batch, 4, 2) is route


def test_route_zero_thresholds_always_fused_assist():
    """Eq. 5: with (P, F) = (0, 0) every nonempty CPU batch is Fused-Assist."""
    assert route_for(1, 0, 0) is Route.FUSED_ASSIST


def test_route_f_zero_has_no_full_cpu_batches():
    """Eq. 5: with F = 0 < P the smallest batches are already Split-Final."""
    assert route_for(1, 3, 0) is Route.SPLIT_FINAL
    assert route_for(3, 3, 0) is Route.SPLIT_FINAL


@pytest.mark.parametrize(("p", "f"), [(0, 0), (1, 0), (5, 4), (32, 16)])
def test_legal_thresholds_accepted(p, f):
    """Legal (P, F): (0, 0) or 0 <= F < P."""
    check_thresholds(p, f)
    SchedulerConfig(gpu_kv_blocks=1, host_kv_blocks=1, route_p=p, route_f=f)


@pytest.mark.parametrize(("p", "f"), [(0, 1), (3, 3), (2, 5), (4, -1), (-1, -2)])
def test_illegal_thresholds_raise(p, f):
    """Any (P, F) other than (0, 0) or 0 <= F < P is rejected, also by SchedulerConfig."""
    with pytest.raises(ValueError):
        check_thresholds(p, f)
    with pytest.raises(ValueError):
        SchedulerConfig(gpu_kv_blocks=1, host_kv_blocks=1, route_p=p, route_f=f)


def test_assist_unreachable_when_largest_cpu_batch_at_most_f():
    """§4.3: with C <= F every reachable CPU batch is Full-CPU, so Dense Assist is unreachable;
    with C > F it is reachable."""
    assert not assist_reachable(16, 16)
    assert not assist_reachable(8, 16)
    assert assist_reachable(17, 16)
    assert assist_reachable(1, 0)


def test_largest_cpu_batch_is_tighter_of_batch_and_host_admission_limits():
    """C, the largest CPU batch, is min(cpu_batch_limit, host_max_requests)."""
    cfg = SchedulerConfig(gpu_kv_blocks=1, host_kv_blocks=1, cpu_batch_limit=64,
                          host_max_requests=12, route_p=32, route_f=16)
    assert cfg.largest_cpu_batch == 12
    assert not assist_reachable(cfg.largest_cpu_batch, cfg.route_f)
