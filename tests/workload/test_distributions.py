"""Named length distributions: fitted to the statistics asked for, drawn deterministically, and
refused with one line when no member of the family has them."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dualpace_sim.workload import LengthDistribution, draw_lengths, fit

N = 200_000


def drawn(seed: int = 0, **spec) -> np.ndarray:
    return draw_lengths(LengthDistribution(**spec), N, np.random.default_rng(seed))


STAT = {"mean": np.mean, "median": np.median, "p99": lambda x: np.percentile(x, 99)}


@pytest.mark.parametrize("spec,tolerance", [
    ({"distribution": "fixed", "mean": 512}, 0.0),
    ({"distribution": "fixed", "p99": 77}, 0.0),
    ({"distribution": "uniform", "min": 16, "max": 2048}, 0.01),
    ({"distribution": "uniform", "mean": 300, "p99": 590}, 0.01),
    ({"distribution": "uniform", "median": 1000, "min": 100}, 0.01),
    ({"distribution": "lognormal", "mean": 1000, "p99": 6000}, 0.02),
    ({"distribution": "lognormal", "median": 500, "p99": 4000}, 0.02),
    ({"distribution": "lognormal", "mean": 1599, "median": 1020}, 0.02),
    ({"distribution": "lognormal", "mean": 114, "sigma": 1.0}, 0.02),
    ({"distribution": "zipf", "max": 4096, "mean": 500}, 0.02),
    ({"distribution": "zipf", "max": 4096, "median": 100}, 0.02),
    ({"distribution": "zipf", "min": 6, "max": 1899, "p99": 250}, 0.05),
], ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v))
def test_drawn_statistics_match_the_ones_asked_for(spec, tolerance):
    lengths = drawn(**spec)
    assert lengths.dtype == np.int64 and lengths.min() >= 1
    for name, fn in STAT.items():
        if name in spec:
            assert fn(lengths) == pytest.approx(spec[name], rel=tolerance, abs=1.0), name
    if "min" in spec:
        assert lengths.min() >= spec["min"]
    if "max" in spec:
        assert lengths.max() <= spec["max"]


def test_uniform_and_zipf_keep_to_their_bounds():
    uniform = drawn(distribution="uniform", min=16, max=2048)
    assert (uniform.min(), uniform.max()) == (16, 2048)
    zipf = drawn(distribution="zipf", min=6, max=1899, theta=1.2)
    assert zipf.min() == 6 and zipf.max() <= 1899
    assert np.mean(zipf == 6) > np.mean(zipf == 7) > np.mean(zipf == 100)  # commonest at min


def test_lognormal_mean_and_p99_picks_the_lighter_tail():
    # two lognormals have mean 1000 and p99 6000; the one kept has sigma below the z of P99
    model = fit(LengthDistribution(distribution="lognormal", mean=1000, p99=6000))
    assert model.sigma < 2.326
    assert math.exp(model.mu + model.sigma ** 2 / 2) == pytest.approx(1000)


def test_the_far_tail_of_a_wide_lognormal_stays_a_token_count():
    lengths = drawn(distribution="lognormal", median=1000, sigma=10.0)
    assert lengths.min() >= 1 and lengths.max() == 2**40


def test_a_seed_fixes_the_lengths_and_another_changes_them():
    spec = {"distribution": "lognormal", "median": 300, "sigma": 0.8}
    np.testing.assert_array_equal(drawn(3, **spec), drawn(3, **spec))
    assert not np.array_equal(drawn(3, **spec), drawn(4, **spec))


@pytest.mark.parametrize("spec,message", [
    ({"distribution": "fixed"}, "fixed needs exactly one of mean, median, p99"),
    ({"distribution": "fixed", "mean": 3, "p99": 4}, "fixed needs exactly one"),
    ({"distribution": "uniform", "mean": 3, "median": 3}, "mean and median are the same"),
    ({"distribution": "uniform", "min": 100, "p99": 50}, "not a range of positive lengths"),
    ({"distribution": "uniform", "mean": 3, "sigma": 1.0}, "sigma does not apply to "
                                                            "distribution: uniform"),
    ({"distribution": "lognormal", "mean": 100}, "lognormal needs two of"),
    ({"distribution": "lognormal", "mean": 100, "median": 200}, "mean is above its median"),
    ({"distribution": "lognormal", "median": 100, "p99": 90}, "p99 is above its median"),
    ({"distribution": "lognormal", "mean": 100, "p99": 5000}, "no lognormal has mean 100"),
    ({"distribution": "lognormal", "mean": 100, "max": 5000}, "max does not apply"),
    ({"distribution": "zipf", "mean": 100}, "zipf needs max"),
    ({"distribution": "zipf", "max": 100, "mean": 90}, r"has a mean between 1 and 50.5, not 90"),
    ({"distribution": "zipf", "min": 100, "max": 100, "theta": 1.0}, "max above min"),
    ({"distribution": "zipf", "max": 100, "theta": 1.0, "mean": 9}, "zipf needs one of"),
])
def test_statistics_no_member_has_are_refused_in_one_line(spec, message):
    with pytest.raises(ValidationError, match=message) as info:
        LengthDistribution(**spec)
    assert "\n" not in info.value.errors()[0]["msg"]


@settings(max_examples=40, deadline=None)
@given(median=st.floats(2, 20_000), ratio=st.floats(1.05, 30), seed=st.integers(0, 2**32))
def test_lognormal_median_and_p99_hold_for_any_valid_pair(median, ratio, seed):
    spec = LengthDistribution(distribution="lognormal", median=median, p99=median * ratio)
    model = fit(spec)
    assert math.exp(model.mu) == pytest.approx(median)
    assert float(model.ppf(np.array([0.99]))[0]) == pytest.approx(median * ratio)
    lengths = draw_lengths(spec, 2000, np.random.default_rng(seed))
    assert lengths.min() >= 1


@settings(max_examples=30, deadline=None)
@given(high=st.integers(10, 20_000), share=st.floats(0.02, 0.98))
def test_zipf_fitted_mean_is_exact_anywhere_in_its_reach(high, share):
    low = 1
    top = (low + high) / 2
    target = low + share * (top - low)
    model = fit(LengthDistribution(distribution="zipf", max=high, mean=target))
    assert model.mean == pytest.approx(target, rel=1e-6)
    assert 0 <= model.theta <= 50


@settings(max_examples=40, deadline=None)
@given(a=st.floats(1, 10_000), b=st.floats(1, 10_000))
def test_uniform_from_min_and_max_has_their_midpoint_for_mean(a, b):
    low, high = sorted((round(a), round(b)))
    if high == low:
        high += 1
    model = fit(LengthDistribution(distribution="uniform", min=low, max=high))
    assert (model.low, model.high) == (low, high)
    assert float(model.ppf(np.array([0.5]))[0]) == pytest.approx((low + high) / 2)
