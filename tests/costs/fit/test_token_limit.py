"""The GPU batched-token limit: the isotonic fit and the plateau's knee."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpace_sim.costs.fit import FitError
from dualpace_sim.costs.fit.token_limit import (
    isotonic_increasing,
    pool_adjacent_violators,
    token_limit_from_curve,
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30))
def test_isotonic_fit_is_non_decreasing_least_squares(ys):
    fitted = isotonic_increasing(ys)
    assert np.all(np.diff(fitted) >= -1e-9 * (1 + np.abs(fitted[:-1])))
    assert fitted.sum() == pytest.approx(sum(ys), abs=1e-6 * (1 + sum(map(abs, ys))))
    assert np.allclose(pool_adjacent_violators(ys), fitted, rtol=1e-9, atol=1e-9)


def test_isotonic_keeps_a_monotone_curve_and_pools_violators():
    assert list(isotonic_increasing([1.0, 2.0, 2.0, 5.0])) == [1.0, 2.0, 2.0, 5.0]
    assert list(pool_adjacent_violators([1.0, 3.0, 2.0, 4.0])) == [1.0, 2.5, 2.5, 4.0]
    assert list(pool_adjacent_violators([3.0, 2.0, 1.0])) == [2.0, 2.0, 2.0]


TOKENS = [2**i for i in range(4, 17)]  # 16..65536


def _knee_curve(knee: int) -> list[float]:
    return [300e3 * min(n / knee, 1.0) for n in TOKENS]


@pytest.mark.parametrize("knee", [256, 1024, 4096])
def test_plateau_knee_exact(knee):
    fit = token_limit_from_curve(TOKENS, _knee_curve(knee), k=5, delta=0.01)
    assert fit.limit == knee
    assert fit.plateau == pytest.approx(300e3)


def test_plateau_knee_noisy_and_declining_tail():
    rng = np.random.default_rng(7)
    clean = np.array(_knee_curve(1024))
    clean[-3:] *= [0.98, 0.96, 0.93]  # attention-heavy shapes fall off, as in panel (d)
    noisy = clean * (1 + rng.normal(0, 0.003, clean.size))
    fit = token_limit_from_curve(TOKENS, noisy, k=5, delta=0.01)
    assert 512 <= fit.limit <= 2048
    assert np.all(np.diff(fit.fitted) >= 0)
    assert fit.plateau == pytest.approx(np.mean(fit.fitted[-5:]))


def test_plateau_needs_k_points():
    with pytest.raises(FitError, match="at least k=5"):
        token_limit_from_curve([1, 2, 4], [1.0, 2.0, 3.0], k=5)
