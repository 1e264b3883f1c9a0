import math
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dualpace_sim.results.metrics import (
    cpu_token_times,
    itl_values,
    longest_cpu_stall,
    longest_cpu_stall_interval,
    summarize,
    sustainable_rate,
    token_timeline,
)
from dualpace_sim.results.records import records_frame


def req(req_id, arrival, max_tokens, times, owners):
    return SimpleNamespace(req_id=req_id, arrival_s=arrival, prompt_tokens=10,
                           max_tokens=max_tokens, token_times=times,
                           token_owners=bytearray("GC".index(c) for c in owners), migrations=[])


@pytest.fixture
def records() -> pd.DataFrame:
    """A: done, 3 tokens; D: never started; B: done, 2 tokens; C: 1 of 4 tokens."""
    return records_frame([
        req(0, 0.0, 3, [1.0, 2.0, 4.0], "GCC"),  # A
        req(1, 3.0, 2, [], ""),  # D
        req(2, 1.0, 2, [2.0, 3.5], "GG"),  # B
        req(3, 2.0, 4, [5.0], "C"),  # C
    ], "dualpace")


def test_summary_matches_hand_computation(records):
    s = summarize(records)
    assert (s["submitted"], s["completed"]) == (4, 2)
    assert s["normalized_latency_s"] == pytest.approx((4.0 / 3 + 2.5 / 2) / 2)
    # TTFT: A 1, B 1, C 3 -> p99 at position 1.98 of [1, 1, 3]
    assert s["mean_ttft_s"] == pytest.approx(5 / 3)
    assert s["p50_ttft_s"] == pytest.approx(1.0)
    assert s["p99_ttft_s"] == pytest.approx(1 + 0.98 * 2)
    # ITL: A 1, 2; B 1.5 (no gap across requests) -> p99 at 1.98 of [1, 1.5, 2]
    np.testing.assert_allclose(np.sort(itl_values(records)), [1.0, 1.5, 2.0])
    assert s["p99_itl_s"] == pytest.approx(1.5 + 0.98 * 0.5)
    # TPOT: A (4-1)/2 = 1.5, B (3.5-2)/1 = 1.5
    assert s["p99_tpot_s"] == pytest.approx(1.5)
    assert s["throughput_tok_s"] == pytest.approx(6 / 5)
    assert s["cpu_token_fraction"] == pytest.approx(3 / 6)
    assert s["makespan_s"] == pytest.approx(5.0)
    assert summarize(records, duration_s=10.0)["throughput_tok_s"] == pytest.approx(0.6)


def test_empty_and_tokenless_inputs_give_nan():
    for df in (records_frame([], "x"), records_frame([req(0, 0.0, 2, [], "")], "x")):
        s = summarize(df)
        assert s["completed"] == 0
        for key in ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s",
                    "throughput_tok_s", "cpu_token_fraction", "makespan_s"):
            assert math.isnan(s[key]), key
    assert token_timeline(records_frame([], "x")).empty


def test_one_policy_at_a_time(records):
    both = pd.concat([records, records.assign(policy="vllm")])
    with pytest.raises(ValueError, match="one policy"):
        summarize(both)


def test_timeline_counts_tokens_per_distinct_time(records):
    tl = token_timeline(records)
    assert tl["time_s"].tolist() == [1.0, 2.0, 3.5, 4.0, 5.0]
    assert tl["total_tokens"].tolist() == [1, 3, 4, 5, 6]
    assert tl["cpu_tokens"].tolist() == [0, 1, 1, 2, 3]


def big_records(n_requests=2000, n_tokens=300):
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(n_requests):
        times = i * 0.1 + np.cumsum(rng.exponential(0.05, n_tokens))
        owners = "".join(rng.choice(["G", "C"], n_tokens))
        reqs.append(req(i, i * 0.1, n_tokens, times.tolist(), owners))
    return records_frame(reqs, "x")


def test_large_input_is_fast_and_timeline_is_downsampled():
    df = big_records()
    start = time.perf_counter()
    s = summarize(df)
    tl = token_timeline(df)
    assert time.perf_counter() - start < 1.0
    assert s["completed"] == 2000 and len(itl_values(df)) == 2000 * 299
    assert len(tl) <= 2000
    assert tl["total_tokens"].iloc[-1] == 600_000
    assert np.all(np.diff(tl["time_s"]) > 0)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.2, 0.5, 1.5, 3.0], 2.5),
        ([0.2, 1.0, 2.0, 3.0], 2.0),  # meeting the target exactly passes
        ([1.2, 1.5, 2.0, 3.0], "below_sweep"),
        ([0.1, 0.2, 0.3, 0.9], "above_sweep"),
        ([0.2, 0.5, math.nan, math.nan], 2.0),
        ([math.nan, 0.5, 0.6, 0.7], "below_sweep"),
    ],
)
def test_sustainable_rate(values, expected):
    assert sustainable_rate([1.0, 2.0, 3.0, 4.0], values, target=1.0) == expected


def test_sustainable_rate_rejects_bad_sweeps():
    with pytest.raises(ValueError, match="increasing"):
        sustainable_rate([2.0, 1.0], [0.1, 0.2], 1.0)
    with pytest.raises(ValueError, match="equally long"):
        sustainable_rate([1.0], [0.1, 0.2], 1.0)


def resident(req_id, arrival, max_tokens, times, owners, migrations):
    r = req(req_id, arrival, max_tokens, times, owners)
    r.migrations = migrations
    return r


def test_longest_cpu_stall_counts_only_time_with_cpu_resident_requests():
    """A lands on the CPU at 1.0 and decodes at 2.0 and 6.0 (stall 4.0 while resident); B is
    resident 10.0-12.0 with a token at 11.0; the idle gap 6.0-10.0 is not a stall."""
    df = records_frame([
        resident(0, 0.0, 3, [0.5, 2.0, 6.0], "GCC", [(1.0, "prefill_to_cpu")]),
        resident(1, 9.0, 3, [9.5, 11.0, 12.5], "GCG", [(10.0, "swap_out"), (12.0, "swap_in")]),
    ], "x")
    np.testing.assert_allclose(cpu_token_times(df), [2.0, 6.0, 11.0])
    assert longest_cpu_stall(df) == pytest.approx(4.0)
    assert longest_cpu_stall_interval(df) == (2.0, 6.0)


def test_a_resident_request_that_never_decodes_on_the_cpu_is_one_long_stall():
    df = records_frame([
        resident(0, 0.0, 3, [0.5, 1.0, 9.0], "GGG", [(2.0, "swap_out"), (8.0, "swap_in")]),
    ], "x")
    assert longest_cpu_stall(df) == pytest.approx(6.0)


def test_longest_cpu_stall_edge_cases():
    gpu = records_frame([req(0, 0.0, 2, [1.0, 3.0], "GG")], "x")
    assert math.isnan(longest_cpu_stall(gpu)) and longest_cpu_stall_interval(gpu) is None
    assert math.isnan(longest_cpu_stall(records_frame([], "x")))
    two = records_frame([resident(0, 0.0, 2, [1.0, 3.0], "GC", [(2.0, "swap_out")])], "x")
    assert longest_cpu_stall(two) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one policy"):
        longest_cpu_stall(pd.concat([two, two.assign(policy="y")]))


def test_serving_metric_set_matches_hand_computation(records):
    """A: arrival 0, tokens 1, 2, 4; B: arrival 1, tokens 2, 3.5; C: 1 of 4 tokens at 5; D none.
    Prompts are 10 tokens each; makespan 5 s."""
    s = summarize(records, percentiles=(50, 90, 99.9), slos={"p99_ttft_s": 1.0,
                                                              "p99_tpot_s": 1.5,
                                                              "normalized_latency_s": 1.3})
    assert s["request_throughput_req_s"] == pytest.approx(2 / 5)  # A and B completed
    assert s["output_throughput_tok_s"] == pytest.approx(6 / 5) == s["throughput_tok_s"]
    assert s["total_token_throughput_tok_s"] == pytest.approx((6 + 3 * 10) / 5)  # A, B, C prefilled
    ttft = np.array([1.0, 1.0, 3.0])
    assert s["mean_ttft_s"] == pytest.approx(5 / 3)
    assert s["median_ttft_s"] == pytest.approx(1.0)
    assert s["std_ttft_s"] == pytest.approx(ttft.std())
    assert s["p90_ttft_s"] == pytest.approx(1 + 0.8 * 2)  # position 1.8 of [1, 1, 3]
    assert s["p99.9_ttft_s"] == pytest.approx(1 + 0.998 * 2)
    assert s["mean_tpot_s"] == pytest.approx(1.5) and s["std_tpot_s"] == pytest.approx(0.0)
    assert s["mean_itl_s"] == pytest.approx(1.5) and s["median_itl_s"] == pytest.approx(1.5)
    assert s["std_itl_s"] == pytest.approx(np.std([1.0, 1.5, 2.0]))
    # e2el over completed requests: A 4, B 2.5
    assert s["mean_e2el_s"] == pytest.approx(3.25) and s["p50_e2el_s"] == pytest.approx(3.25)
    assert s["p90_e2el_s"] == pytest.approx(2.5 + 0.9 * 1.5)
    # goodput: A (ttft 1, tpot 1.5, 4/3 s per token > 1.3) misses; B (1, 1.5, 1.25) is good
    assert s["good_requests"] == 1 and s["goodput_req_s"] == pytest.approx(1 / 5)
    assert summarize(records)["good_requests"] == 2  # no targets: every completed request
    assert "p95_ttft_s" not in s and "p95_ttft_s" in summarize(records)


def test_serving_metrics_of_nothing_are_nan():
    s = summarize(records_frame([], "x"))
    for key in ("request_throughput_req_s", "goodput_req_s", "mean_e2el_s", "std_itl_s",
                "p90_tpot_s"):
        assert math.isnan(s[key]), key
    assert s["good_requests"] == 0
