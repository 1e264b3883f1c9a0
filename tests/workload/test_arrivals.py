import math

import numpy as np
import pytest

from dualpace_sim.workload import WorkloadError, poisson_arrivals, trace_arrivals


@pytest.mark.parametrize("rate", [0.5, 3.0, 17.25])
def test_mean_gap_is_exactly_one_over_rate(rate):
    arrivals = poisson_arrivals(2000, rate, seed=11)
    assert arrivals.shape == (2000,)
    assert arrivals[0] == 0.0
    assert np.all(np.diff(arrivals) >= 0)
    assert np.diff(arrivals).mean() == pytest.approx(1 / rate, rel=1e-12)
    assert arrivals[-1] == pytest.approx(1999 / rate, rel=1e-12)


def test_seed_fixes_arrivals_and_rates_only_scale_them():
    a = poisson_arrivals(100, 2.0, seed=5)
    np.testing.assert_array_equal(a, poisson_arrivals(100, 2.0, seed=5))
    assert not np.array_equal(a, poisson_arrivals(100, 2.0, seed=6))
    np.testing.assert_allclose(poisson_arrivals(100, 4.0, seed=5), a / 2, rtol=1e-12)


def test_small_counts():
    assert poisson_arrivals(0, 1.0, 0).shape == (0,)
    np.testing.assert_array_equal(poisson_arrivals(1, 1.0, 0), [0.0])


@pytest.mark.parametrize("rate", [0, -1.0, math.nan, math.inf, None])
def test_bad_rates_are_rejected(rate):
    with pytest.raises(WorkloadError, match="workload.rate"):
        poisson_arrivals(10, rate, seed=0)


def test_trace_arrivals_scale_gaps():
    np.testing.assert_allclose(trace_arrivals(np.array([2.0, 3.0, 7.0]), 0.5), [0.0, 0.5, 2.5])
    np.testing.assert_allclose(trace_arrivals(np.array([0.0, 1.0])), [0.0, 1.0])
    with pytest.raises(WorkloadError, match="time_scale"):
        trace_arrivals(np.array([0.0, 1.0]), 0.0)
