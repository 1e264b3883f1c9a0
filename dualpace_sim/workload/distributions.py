"""Request lengths drawn from a named distribution fitted to the statistics a workload is
described by.

Papers and users describe workloads by length statistics (a mean, a median, a P99) more often
than by a trace, so ``workload.source: synthetic`` takes one :class:`LengthDistribution` for the
prompts and one for the outputs. Each is fitted when the scenario is validated, so statistics that
no distribution of that family has (a lognormal whose mean is below its median) fail then, with
the field named. Four families, after the length generators of Vidur (Agrawal et al., MLSys 2024):

* ``fixed``: every length the same; give one of mean, median, p99 (they coincide);
* ``uniform``: uniform between a low and a high length; give two of min, max, the centre (mean or
  median: they coincide) and p99;
* ``lognormal``: ``exp(mu + sigma Z)``; give two of mean, median, p99 and sigma;
* ``zipf``: the integers min..max with P(min + k) proportional to (k + 1)^-theta, the shortest
  commonest and a power-law tail cut at max; give max (and min, default 1) and one of theta,
  mean, median, p99.

Lengths are drawn by inverse transform sampling from one uniform per request, so a seed fixes
them, and real-valued draws are rounded to the nearest token count, at least 1.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import special

P99_Z = float(special.ndtri(0.99))  # the standard normal's 99th percentile, 2.326
MAX_LENGTH = 1_000_000  # zipf tabulates its support; longer prompts are no real workload
# A lognormal's far tail can exceed any integer; a draw is capped here so that it stays a count,
# which the scenario's fit checks then refuse with the clipping keys to set.
MAX_DRAW = float(2**40)
STATISTICS = ("mean", "median", "p99")
KEYS = {"fixed": STATISTICS, "uniform": ("min", "max", *STATISTICS),
        "lognormal": (*STATISTICS, "sigma"), "zipf": ("min", "max", "theta", *STATISTICS)}


class LengthDistribution(BaseModel):
    """A length distribution and the statistics it is fitted to, checked when the scenario is
    read. `fixed`: every length the same; one of mean, median, p99. `uniform`: uniform between
    a low and a high length; two of min, max, mean or median (they coincide) and p99.
    `lognormal`: exp(mu + sigma Z); two of mean, median, p99 and sigma (given mean and p99, the
    lighter-tailed of the two lognormals that have them). `zipf`: the lengths min..max with
    P(min + k) proportional to (k + 1)^-theta, so the shortest are the commonest and the tail is
    a power law cut at max; max, and theta or one of mean, median, p99 (theta is then fitted).
    P99 is the 99th percentile. Lengths are rounded to whole tokens, at least 1. Example:
    `{distribution: lognormal, mean: 1599, p99: 8000}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # `true` is no count

    distribution: Literal["fixed", "uniform", "lognormal", "zipf"] = Field(description=(
        "the family: `fixed` (give one of mean, median, p99), `uniform` (two of min, max, "
        "mean or median, p99), `lognormal` (two of mean, median, p99, sigma) or `zipf` (max, "
        "optionally min, and one of theta, mean, median, p99)"))
    mean: float | None = Field(None, gt=0, allow_inf_nan=False, description="mean length, tokens")
    median: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "median length, tokens"))
    p99: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "99th-percentile length, tokens"))
    min: int | None = Field(None, ge=1, le=MAX_LENGTH, description=(
        "uniform: the shortest length; zipf: the shortest and commonest length (default 1)"))
    max: int | None = Field(None, ge=1, le=MAX_LENGTH, description=(
        "uniform: the longest length; zipf (required): the longest length, where its tail is cut"))
    sigma: float | None = Field(None, gt=0, le=10, allow_inf_nan=False, description=(
        "lognormal: the standard deviation of the log length"))
    theta: float | None = Field(None, ge=0, le=50, allow_inf_nan=False, description=(
        "zipf: the exponent; 0 is uniform over min..max, larger puts more requests at min"))

    @model_validator(mode="after")
    def _fits(self) -> LengthDistribution:
        fit(self)  # raises a one-line ValueError for keys or statistics it cannot meet
        return self

    def given(self) -> dict[str, float]:
        """The parameters set, by name (distribution excluded)."""
        return {k: v for k, v in self.model_dump(exclude={"distribution"}).items()
                if v is not None}


@dataclass(frozen=True)
class Fixed:
    value: float

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return np.full(u.shape, self.value)


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.low + u * (self.high - self.low)


@dataclass(frozen=True)
class LogNormal:
    mu: float
    sigma: float

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return np.exp(self.mu + self.sigma * special.ndtri(u))


@dataclass(frozen=True)
class Zipf:
    """A bounded Zipf law over the integers low..high, tabulated: its CDF at each length."""

    low: int
    high: int
    theta: float

    @functools.cached_property
    def pmf(self) -> np.ndarray:
        weights = np.arange(1, self.high - self.low + 2, dtype=float) ** -self.theta
        return weights / weights.sum()

    @property
    def mean(self) -> float:
        return float(self.low + self.pmf @ np.arange(len(self.pmf)))

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """The smallest length whose CDF reaches u (numpy's inverted_cdf quantile)."""
        cdf = np.cumsum(self.pmf)
        index = np.minimum(np.searchsorted(cdf, u, side="left"), len(cdf) - 1)
        return (self.low + index).astype(float)

    def statistic(self, name: str) -> float:
        if name == "mean":
            return self.mean
        return float(self.ppf(np.array([0.5 if name == "median" else 0.99]))[0])


Fitted = Fixed | Uniform | LogNormal | Zipf


def fit(spec: LengthDistribution) -> Fitted:
    """The distribution of ``spec``'s family that has ``spec``'s statistics; a ValueError of one
    line naming the keys to change when there is none, or when keys are missing or extra."""
    given = spec.given()
    name = spec.distribution
    extra = [k for k in given if k not in KEYS[name]]
    if extra:
        raise ValueError(f"{extra[0]} does not apply to distribution: {name}, which takes "
                         f"{', '.join(KEYS[name])}")
    return _FITTERS[name](given)


def draw_lengths(spec: LengthDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` token counts drawn from ``spec``'s fitted distribution: one uniform each through its
    quantile function, rounded to the nearest integer, at least 1 (and at most 2^40)."""
    values = np.minimum(fit(spec).ppf(rng.random(n)), MAX_DRAW)
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _need(given: dict[str, float], count: int, name: str, what: str) -> None:
    if len(given) != count:
        got = ", ".join(given) or "none"
        raise ValueError(f"distribution: {name} needs {what} (got {got})")


def _fit_fixed(given: dict[str, float]) -> Fixed:
    _need(given, 1, "fixed", "exactly one of mean, median, p99: the one length")
    return Fixed(next(iter(given.values())))


def _fit_uniform(given: dict[str, float]) -> Uniform:
    """Each key is one linear equation in (low, high); two independent ones fix both."""
    _need(given, 2, "uniform", "two of min, max, mean (or median) and p99")
    if "mean" in given and "median" in given:
        raise ValueError("a uniform's mean and median are the same; give one of them with "
                         "min, max or p99")
    rows = {"min": (1.0, 0.0), "max": (0.0, 1.0), "mean": (0.5, 0.5), "median": (0.5, 0.5),
            "p99": (0.01, 0.99)}
    low, high = np.linalg.solve([rows[k] for k in given], list(given.values()))
    if not 0 < low < high:
        stats = ", ".join(f"{k} {v:g}" for k, v in given.items())
        raise ValueError(f"distribution: uniform with {stats} spans {low:.4g}..{high:.4g}, "
                         "not a range of positive lengths; check those values")
    return Uniform(float(low), float(high))


def _fit_lognormal(given: dict[str, float]) -> LogNormal:
    _need(given, 2, "lognormal", "two of mean, median, p99 and sigma")
    log = {k: math.log(v) for k, v in given.items() if k != "sigma"}
    if "sigma" in given:
        sigma = given["sigma"]
        (stat, value), = log.items()
        shift = {"mean": sigma * sigma / 2, "median": 0.0, "p99": P99_Z * sigma}[stat]
        return LogNormal(value - shift, sigma)
    if "median" in log:
        other = "mean" if "mean" in log else "p99"
        if given[other] <= given["median"]:
            raise ValueError(f"a lognormal's {other} is above its median, but {other} "
                             f"{given[other]:g} <= median {given['median']:g}; raise {other} or "
                             "use another distribution")
        gap = log[other] - log["median"]
        sigma = math.sqrt(2 * gap) if other == "mean" else gap / P99_Z
        return LogNormal(log["median"], sigma)
    # mean and p99: mu + sigma^2/2 = ln mean and mu + z sigma = ln p99; the smaller root, the
    # lighter-tailed of the two lognormals with these statistics
    gap = log["p99"] - log["mean"]
    if not 0 < gap <= P99_Z ** 2 / 2:
        raise ValueError(f"no lognormal has mean {given['mean']:g} and p99 {given['p99']:g}: "
                         f"its p99 lies between 1x and {math.exp(P99_Z ** 2 / 2):.2f}x its "
                         "mean; give median instead of one of them, or use zipf")
    sigma = P99_Z - math.sqrt(P99_Z ** 2 - 2 * gap)
    return LogNormal(log["mean"] - sigma * sigma / 2, sigma)


def _fit_zipf(given: dict[str, float]) -> Zipf:
    if "max" not in given:
        raise ValueError("distribution: zipf needs max (its longest length)")
    low, high = int(given.pop("min", 1)), int(given.pop("max"))
    if high <= low:
        raise ValueError(f"distribution: zipf needs max above min (got min {low}, max {high})")
    _need(given, 1, "zipf", "one of theta, mean, median, p99 besides min and max")
    (stat, target), = given.items()
    if stat == "theta":
        return Zipf(low, high, target)
    return _zipf_for(low, high, stat, target)


@functools.lru_cache(maxsize=64)
def _zipf_for(low: int, high: int, stat: str, target: float) -> Zipf:
    """Bisect theta: every statistic falls as theta grows, from its value for a uniform over
    low..high (theta 0) towards low. Cached: a sweep validates its scenario at every point."""
    top, bottom = Zipf(low, high, 0.0), Zipf(low, high, 50.0)
    reach = (bottom.statistic(stat), top.statistic(stat))
    if not reach[0] <= target <= reach[1]:
        raise ValueError(f"a zipf over {low}..{high} has a {stat} between {reach[0]:.6g} and "
                         f"{reach[1]:.6g}, not {target:g}; change max (or min) or use "
                         "another distribution")
    lo, hi = 0.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if Zipf(low, high, mid).statistic(stat) > target:
            lo = mid
        else:
            hi = mid
    return Zipf(low, high, hi)


_FITTERS = {"fixed": _fit_fixed, "uniform": _fit_uniform, "lognormal": _fit_lognormal,
            "zipf": _fit_zipf}
