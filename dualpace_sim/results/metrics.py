"""Latency metrics, token timelines and sustainable request rate from per-request records.

Definitions follow the paper (DESIGN.md §5): normalized latency is the mean of e2e latency divided
by output length over completed requests; ITL is every client-observed gap between consecutive
tokens of a request; TPOT is (e2e − TTFT)/(n_out − 1) per completed request with n_out > 1.
Percentiles are numpy's linear ones. Token-level metrics (ITL, timelines, CPU progress) work on
the rounds and spans of :mod:`dualpace_sim.results.token_spans`, never on a time per token: a
200k-request run has 50M tokens. A run passes its spans as ``tokens``; without them they are
read off the frame's token columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from dualpace_sim.config.scenario import DEFAULT_PERCENTILES
from dualpace_sim.results.token_spans import TokenSpans, Weighted

TIMELINE_MAX_POINTS = 2000

# The latencies the serving-benchmark set covers, by their vLLM names: time to first token,
# time per output token (after the first), inter-token latency, end-to-end latency.
LATENCIES = ("ttft", "tpot", "itl", "e2el")

# Which target of a scenario's `targets:` a request must meet, on its own values, to count in
# the goodput: target name -> the per-request latency it bounds ("norm" is e2el / n_tokens).
GOODPUT_SLOS = {"p99_ttft_s": "ttft", "p99_tpot_s": "tpot", "normalized_latency_s": "norm"}


def _spans(df: pd.DataFrame, tokens: TokenSpans | None) -> TokenSpans:
    """A run's own spans of these records, or those read off the frame's token columns."""
    return TokenSpans.from_frame(df) if tokens is None else tokens


def _nan_stat(values: np.ndarray | Weighted, q: float | None = None) -> float:
    """Mean (q None) or q-th percentile; NaN when there is nothing to summarize."""
    if values.size == 0:
        return math.nan
    if isinstance(values, Weighted):
        return values.mean() if q is None else float(values.percentile([q])[0])
    return float(values.mean() if q is None else np.percentile(values, q))


def ttft_values(df: pd.DataFrame) -> np.ndarray:
    """Time to first token of every request that produced a token."""
    ttft = df["first_token_s"].to_numpy(dtype=float) - df["arrival_s"].to_numpy(dtype=float)
    return ttft[~np.isnan(ttft)]


def itl_values(df: pd.DataFrame, tokens: TokenSpans | None = None) -> np.ndarray:
    """Every gap between consecutive tokens of the same request, over all requests, spelled
    out (for plots; the summaries keep them as :class:`Weighted` round gaps)."""
    return _spans(df, tokens).itl().expand()


def request_arrays(
    df: pd.DataFrame,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request: arrival, first-token and last-token times, tokens produced, and whether it
    completed (produced all its max_tokens, at least one)."""
    n_tokens = df["n_tokens"].to_numpy(dtype=np.int64)
    done = (n_tokens == df["max_tokens"].to_numpy(dtype=np.int64)) & (n_tokens > 0)
    return (df["arrival_s"].to_numpy(dtype=float), df["first_token_s"].to_numpy(dtype=float),
            df["finish_s"].to_numpy(dtype=float), n_tokens, done)


def summarize(
    df: pd.DataFrame,
    duration_s: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slos: Mapping[str, float] | None = None,
    tokens: TokenSpans | None = None,
) -> dict[str, float | int]:
    """Headline metrics of one policy's records; NaN where a metric is undefined.

    Throughput is total output tokens over ``duration_s`` when given (e.g. a fixed measurement
    window), otherwise over last token time − first arrival (``makespan_s``). The
    serving-benchmark set (:func:`serving_metrics`) follows the headline keys; ``slos`` are the
    scenario's targets, for the goodput.
    """
    if df["policy"].nunique() > 1:
        raise ValueError("summarize takes the records of one policy; group by 'policy' first")
    arrival, _, finish, n_tokens, done = request_arrays(df)
    tokens = _spans(df, tokens)
    values = latency_values(df, tokens)  # once: the headline and the full set share them
    ttft = values["ttft"]
    total_tokens = int(n_tokens.sum())
    cpu_tokens = tokens.cpu_tokens()
    makespan = float(np.nanmax(finish) - arrival.min()) if total_tokens else math.nan
    window = makespan if duration_s is None else float(duration_s)
    headline = {
        "submitted": len(df),
        "completed": int(done.sum()),
        "normalized_latency_s": _nan_stat((finish[done] - arrival[done]) / n_tokens[done]),
        "mean_ttft_s": _nan_stat(ttft),
        "p50_ttft_s": _nan_stat(ttft, 50),
        "p99_ttft_s": _nan_stat(ttft, 99),
        "p99_itl_s": _nan_stat(values["itl"], 99),
        "p99_tpot_s": _nan_stat(values["tpot"], 99),
        "throughput_tok_s": total_tokens / window if window > 0 else math.nan,
        "cpu_token_fraction": cpu_tokens / total_tokens if total_tokens else math.nan,
        "makespan_s": makespan,
    }
    return {**headline, **throughput_metrics(df, window, slos),
            **latency_stats(values, percentiles)}


def percentile_word(p: float) -> str:
    """A percentile as vLLM's benchmark spells it in key names: 99 -> ``99``, 99.9 -> ``99.9``."""
    p = float(p)
    return str(int(p)) if p.is_integer() else str(p)


def latency_values(df: pd.DataFrame,
                   tokens: TokenSpans | None = None) -> dict[str, np.ndarray | Weighted]:
    """Each latency of :data:`LATENCIES`, in seconds, over the requests it is defined for:
    TTFT over every request that produced a token, ITL over every gap between consecutive
    tokens of a request (as :class:`Weighted` round gaps), TPOT and end-to-end latency over
    completed requests (TPOT only those with more than one token)."""
    arrival, first, finish, n_tokens, done = request_arrays(df)
    multi = done & (n_tokens > 1)
    return {
        "ttft": ttft_values(df),
        "tpot": (finish[multi] - first[multi]) / (n_tokens[multi] - 1),
        "itl": _spans(df, tokens).itl(),
        "e2el": finish[done] - arrival[done],
    }


def good_requests(df: pd.DataFrame, slos: Mapping[str, float]) -> int:
    """Completed requests meeting, on their own values, every target of ``slos`` that
    :data:`GOODPUT_SLOS` names: TTFT, TPOT (requests of one token have none, and pass it) and
    end-to-end latency per output token. A fleet-wide target (P99 ITL) has no per-request
    form and does not enter. With no such target every completed request is good."""
    arrival, first, finish, n_tokens, good = request_arrays(df)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_request = {
            "ttft": first - arrival,
            "tpot": np.where(n_tokens > 1, (finish - first) / np.maximum(n_tokens - 1, 1), 0.0),
            "norm": (finish - arrival) / n_tokens,
        }
        for target, latency in GOODPUT_SLOS.items():
            if target in slos:
                good &= per_request[latency] <= slos[target]
    return int(good.sum())


def serving_metrics(
    df: pd.DataFrame,
    window_s: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slos: Mapping[str, float] | None = None,
    tokens: TokenSpans | None = None,
) -> dict[str, float | int]:
    """The metric set of vLLM's serving benchmark, in seconds, over a window of ``window_s``:
    :func:`throughput_metrics` and :func:`latency_stats` of every latency."""
    return {**throughput_metrics(df, window_s, slos),
            **latency_stats(latency_values(df, tokens), percentiles)}


def throughput_metrics(
    df: pd.DataFrame, window_s: float, slos: Mapping[str, float] | None = None
) -> dict[str, float | int]:
    """Request, output-token and total-token throughput over ``window_s``, and the goodput:
    completed requests per second that meet the ``slos`` (:func:`good_requests`)."""
    *_, n_tokens, done = request_arrays(df)
    prefilled = df["prompt_tokens"].to_numpy(dtype=np.int64)[n_tokens > 0].sum()
    rate = (lambda count: count / window_s) if window_s > 0 else (lambda count: math.nan)
    good = good_requests(df, slos or {})
    return {
        "request_throughput_req_s": rate(int(done.sum())),
        "output_throughput_tok_s": rate(int(n_tokens.sum())),
        "total_token_throughput_tok_s": rate(int(n_tokens.sum() + prefilled)),
        "good_requests": good,
        "goodput_req_s": rate(good),
    }


def latency_stats(values: Mapping[str, np.ndarray | Weighted],
                  percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """Mean, median, std (population, as numpy and vLLM) and each of ``percentiles`` (numpy's
    linear ones) of each latency of ``values`` (:func:`latency_values`); NaN where empty."""
    out: dict[str, float] = {}
    qs = [50.0, *(float(p) for p in percentiles)]
    for name, v in values.items():
        if not v.size:
            picked = np.full(len(qs), math.nan)
        else:
            picked = v.percentile(qs) if isinstance(v, Weighted) else np.percentile(v, qs)
        out[f"mean_{name}_s"] = _nan_stat(v)
        out[f"median_{name}_s"] = float(picked[0])
        out[f"std_{name}_s"] = float(v.std()) if v.size else math.nan
        for p, value in zip(percentiles, picked[1:], strict=True):
            out[f"p{percentile_word(p)}_{name}_s"] = float(value)
    return out


def token_timeline(df: pd.DataFrame, max_points: int = TIMELINE_MAX_POINTS,
                   tokens: TokenSpans | None = None) -> pd.DataFrame:
    """Cumulative generated tokens and cumulative CPU-produced tokens at each distinct token time
    (the engines' rounds), from each round's token count.

    Longer timelines are sampled at ``max_points`` evenly spaced events (always keeping the last);
    the counts at kept times stay exact.
    """
    return _spans(df, tokens).timeline(max_points)


def sustainable_rate(
    rates: Sequence[float], values: Sequence[float], target: float
) -> float | str:
    """Highest offered rate at which ``values`` (a latency that grows with load) meets ``target``.

    Linear interpolation between the last measured rate that meets the target and the next one,
    never extrapolation: "below_sweep" when the lowest rate already misses it, "above_sweep" when
    every rate meets it. A NaN value (nothing completed) misses the target; next to a passing point
    it acts as an infinite latency, so the answer is the passing rate itself.
    """
    r = np.asarray(rates, dtype=float)
    v = np.asarray(values, dtype=float)
    if r.size == 0 or r.shape != v.shape:
        raise ValueError("sustainable_rate needs equally long, non-empty rates and values")
    if np.any(np.diff(r) <= 0):
        raise ValueError("sustainable_rate needs strictly increasing rates")
    with np.errstate(invalid="ignore"):
        misses = ~(v <= target)
    if misses[0]:
        return "below_sweep"
    if not misses.any():
        return "above_sweep"
    k = int(np.argmax(misses))
    if np.isnan(v[k]):
        return float(r[k - 1])
    return float(r[k - 1] + (target - v[k - 1]) / (v[k] - v[k - 1]) * (r[k] - r[k - 1]))


def cpu_token_times(df: pd.DataFrame, tokens: TokenSpans | None = None) -> np.ndarray:
    """The times at which the CPU engine emitted tokens (owner ``C``), sorted, once each."""
    return _spans(df, tokens).cpu_round_times()


_TO_CPU = ("prefill_to_cpu", "swap_out")


def cpu_residency(df: pd.DataFrame) -> list[tuple[float, float]]:
    """Merged intervals during which at least one request was CPU-resident: from its
    Prefill-to-CPU landing or swap-out to its swap-in, or else to its last token."""
    spans = []
    for kinds, times, last in zip(df["migration_kinds"], df["migration_times_s"],
                                  df["finish_s"], strict=True):
        start = None
        for kind, t in sorted(zip(kinds, times, strict=True), key=lambda kt: kt[1]):
            if kind in _TO_CPU and start is None:
                start = t
            elif kind == "swap_in" and start is not None:
                spans.append((start, t))
                start = None
        if start is not None and not math.isnan(last):
            spans.append((start, max(start, float(last))))
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def longest_cpu_stall_interval(df: pd.DataFrame,
                               tokens: TokenSpans | None = None) -> tuple[float, float] | None:
    """Start and end of the longest CPU stall (see :func:`longest_cpu_stall`); None when no
    request was ever CPU-resident. Ties go to the earliest stall."""
    if df["policy"].nunique() > 1:
        raise ValueError("longest_cpu_stall takes the records of one policy; group by 'policy'")
    residency = cpu_residency(df)
    if not residency:
        return None
    times = cpu_token_times(df, tokens)
    best: tuple[float, float] | None = None
    for a, b in residency:
        inside = times[np.searchsorted(times, a):np.searchsorted(times, b, side="right")]
        points = np.concatenate(([a], inside, [b]))
        gaps = np.diff(points)
        k = int(np.argmax(gaps))
        if best is None or gaps[k] > best[1] - best[0]:
            best = (float(points[k]), float(points[k + 1]))
    return best


def longest_cpu_stall(df: pd.DataFrame, tokens: TokenSpans | None = None) -> float:
    """Longest stall of CPU-resident decode progress, in seconds.

    The longest stretch during which some request was CPU-resident (its KV in host memory:
    after its Prefill-to-CPU copy landed or its swap-out, before its swap-in or last token) yet
    the CPU tier emitted no token at all. Periods with no CPU-resident request are idle, not
    stalled, and do not count. NaN when no request was ever CPU-resident (a GPU-only policy).
    This is the paper's Figure 1 (top right) plateau, measured.
    """
    interval = longest_cpu_stall_interval(df, tokens)
    return math.nan if interval is None else interval[1] - interval[0]
