"""Token spans: the rounds-and-spans form of a run's tokens that the metrics read."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results.records import records_frame
from dualpace_sim.results.token_spans import TokenSpans, Weighted
from dualpace_sim.sim import DualPaceNode

# A small HBM and a large host: requests move between the engines, so spans break.
PRESSURE = {"gpu_kv_blocks": 600, "host_kv_blocks": 20000}
QS = [0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]


@pytest.mark.parametrize("seed", range(6))
def test_weighted_percentiles_are_numpys_of_the_expanded_sample(seed):
    """The same floats as np.percentile over every value repeated its count, ties included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    values = rng.choice(rng.exponential(0.05, size=max(n // 2, 1)), size=n)  # with ties
    w = Weighted(values, rng.integers(1, 9, size=n))
    expanded = w.expand()
    assert np.array_equal(w.percentile(QS), np.percentile(expanded, QS))
    assert w.size == expanded.size
    assert w.mean() == pytest.approx(expanded.mean(), rel=1e-12)
    assert w.std() == pytest.approx(expanded.std(), rel=1e-9, abs=1e-15)


@pytest.fixture(scope="module")
def requests(tmp_path_factory):
    """A DualPace run whose requests move between the engines."""
    import yaml

    from tests.conftest import RTX4090_LLAMA

    path = tmp_path_factory.mktemp("spans") / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "spans", "profile": str(RTX4090_LLAMA), "scheduler": PRESSURE,
        "workload": {"source": "default", "trace": "conv", "num_requests": 120,
                     "arrival": "poisson", "rate": 4.0, "seed": 1}}))
    loaded = load_scenario(path)
    out = DualPaceNode(loaded.requests, loaded.cost, loaded.config).run()
    return sorted(out.requests, key=lambda r: r.req_id)


def test_the_run_has_both_engines_and_broken_spans(requests):
    """Not a vacuous fixture: CPU tokens, and requests with several spans."""
    assert any(1 in r.token_owners for r in requests)
    assert sum(len(r.spans) > 4 for r in requests) >= 5


def test_spans_read_a_chunk_of_requests_at_a_time_are_the_same(requests, monkeypatch):
    """from_requests reads a few requests' spans at a time (so a 200k-request run's spans
    never all pass through one Python list): chunks of 7 give the arrays one chunk gives."""
    import dualpace_sim.results.token_spans as token_spans

    whole = TokenSpans.from_requests(requests)
    monkeypatch.setattr(token_spans, "FROM_REQUESTS_CHUNK", 7)
    chunked = TokenSpans.from_requests(requests)
    for field in ("round_times", "round_owner", "row", "first", "end"):
        assert np.array_equal(getattr(chunked, field), getattr(whole, field)), field
    assert len(requests) > 7 * 10


def test_token_columns_spell_out_every_token(requests):
    """The token columns read off the spans are each request's token times and owners."""
    tokens = TokenSpans.from_requests(requests)
    lengths, times, letters = tokens.token_columns(0, len(requests))
    assert lengths.tolist() == [r.generated for r in requests]
    assert times.tolist() == [t for r in requests for t in r.token_times]
    assert letters == b"".join(bytes(r.token_owners).translate(b"GC" + bytes(254))
                               for r in requests)
    lengths, times, _ = tokens.token_columns(3, 9)  # a slice of rows, as a row group takes
    assert times.tolist() == [t for r in requests[3:9] for t in r.token_times]
    assert lengths.tolist() == [r.generated for r in requests[3:9]]


def test_itl_is_every_gap_between_a_requests_consecutive_tokens(requests):
    """The weighted round gaps are exactly the per-request diffs of the token times."""
    gaps = np.sort(np.concatenate([np.diff(r.token_times) for r in requests]))
    assert np.array_equal(np.sort(TokenSpans.from_requests(requests).itl().expand()), gaps)


def test_a_frame_read_back_gives_the_same_metrics_as_the_runs_spans(requests):
    """from_frame (a requests.parquet read back) and from_requests (the run) agree."""
    run = TokenSpans.from_requests(requests)
    read = TokenSpans.from_frame(records_frame(requests, "dualpace"))
    assert np.array_equal(np.sort(run.itl().expand()), np.sort(read.itl().expand()))
    pd.testing.assert_frame_equal(run.timeline(50), read.timeline(50))
    assert np.array_equal(run.cpu_round_times(), read.cpu_round_times())
    assert run.cpu_tokens() == read.cpu_tokens() > 0
    for a, b in zip(run.request_ends(len(requests)), read.request_ends(len(requests)),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_timeline_counts_the_tokens_at_or_before_each_round(requests):
    """At every distinct token time: all tokens and CPU tokens emitted by then."""
    times = np.array([t for r in requests for t in r.token_times])
    cpu = np.array([o for r in requests for o in r.token_owners]) == 1
    line = TokenSpans.from_requests(requests).timeline(max_points=10**9)
    assert line["time_s"].tolist() == np.unique(times).tolist()
    expected = [(int((times <= t).sum()), int((times[cpu] <= t).sum())) for t in line["time_s"]]
    assert list(zip(line["total_tokens"], line["cpu_tokens"], strict=True)) == expected


def test_no_tokens_give_empty_spans():
    """A frame without tokens (nothing finished a prefill) has no rounds and no gaps."""
    empty = TokenSpans.from_frame(records_frame([], "x"))
    assert empty.n_rounds == 0 and empty.itl().size == 0 and empty.timeline(10).empty
    assert empty.cpu_tokens() == 0 and empty.token_columns(0, 0)[1].size == 0
