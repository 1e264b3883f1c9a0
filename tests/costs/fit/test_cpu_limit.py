"""The CPU decode batch limit: the throughput pick over normalized curves and the latency cap."""

import numpy as np
import pytest

from dualpace_sim.costs import CostModel
from dualpace_sim.costs.fit import FitError, fit_controls
from dualpace_sim.costs.fit.cpu_limit import (
    cpu_iteration_time,
    cpu_latency_limit,
    cpu_limit_from_curves,
)

CPU_BS = [2**i for i in range(11)]  # 1..1024


def test_cpu_limit_peaked_curve_picks_the_peak():
    # throughput rises to a peak at 256 then falls (cache/bandwidth contention), per context
    curves = [[b / (1 + (b / 256) ** 2) * s for b in CPU_BS] for s in (1.0, 0.7, 0.4)]
    pick = cpu_limit_from_curves(CPU_BS, curves, delta=0.01)
    assert pick.best == 256 and pick.limit == 256
    assert pick.best_per_context == [256, 256, 256]


def test_cpu_limit_saturating_curve_takes_the_smallest_within_delta():
    curves = [[b / (b + c) for b in CPU_BS] for c in (4.0, 8.0)]
    pick = cpu_limit_from_curves(CPU_BS, curves, delta=0.01)
    assert pick.best == 1024
    mean = np.asarray(pick.mean_normalized)
    i = CPU_BS.index(pick.limit)
    assert mean[i] >= 0.99 * mean.max() > mean[i - 1]


def test_cpu_latency_cap(rtx):
    cm = CostModel(rtx)
    cap = cpu_latency_limit(cm, 0.5, 1024, 0, 0, max_batch=1024)
    assert cpu_iteration_time(cm, cap, 1024, 0, 0) <= 0.5 < cpu_iteration_time(cm, cap + 1, 1024,
                                                                               0, 0)
    result = fit_controls(rtx, max_iteration_s=0.5, iteration_context=1024)
    assert result.cpu.latency_limit == cap
    assert result.cpu_batch_limit == min(cap, result.cpu.pick.limit)
    tight = fit_controls(rtx, max_iteration_s=0.2)
    assert tight.cpu_batch_limit == tight.cpu.latency_limit < tight.cpu.pick.limit
    with pytest.raises(FitError, match="below even one request"):
        fit_controls(rtx, max_iteration_s=1e-4)


def test_cpu_iteration_time_follows_the_route(rtx):
    cm = CostModel(rtx)
    b, ctx = 16, 512
    pre = cm.cpu_pre_layer(b) + cm.cpu_iteration_overhead + 32 * cm.cpu_layer_local(b, b * ctx)
    full = pre + 32 * cm.cpu_post_attn(b) + cm.cpu_post_layer(b)
    assert cpu_iteration_time(cm, b, ctx, 32, 16) == pytest.approx(full)
    assert cpu_iteration_time(cm, b, ctx, 0, 0) < full  # Fused-Assist on this roofline
