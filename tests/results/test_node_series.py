"""Queues, KV and utilisation over time, from the node's own state: the logs by hand, and a
simulated run of each policy whose series must hold what its pools and engines allow."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.experiments.runner import simulate
from dualpace_sim.results.node_series import (
    ENGINES,
    FINE_BINS,
    FIRST_WIDTH_S,
    STATE_COLUMNS,
    Busy,
    Intervals,
    StateLog,
    held_at,
    read_series,
    write_series,
)

PRESSURE = {"gpu_kv_blocks": 600, "host_kv_blocks": 6000}  # swaps and Prefill-to-CPU happen


def test_utilisation_is_the_share_of_each_bin_an_engine_worked():
    busy = Busy()
    for start, end in [(0.0, 0.5), (0.5, 2.0), (3.0, 3.5)]:
        busy.gpu.add(start, end)
    busy.cpu.add(1.0, 1.0)  # empty: not work
    busy.pcie_d2h.add(0.25, 0.75)
    busy.pcie_d2h.add(0.5, 1.0)  # carried bytes beside a copy: the share is capped at 1
    u = busy.utilisation(4.0, bins=4)
    assert u["start_s"].tolist() == [0, 1, 2, 3] and u["end_s"].tolist() == [1, 2, 3, 4]
    assert u["gpu"].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.5])
    assert u["cpu"].tolist() == [0, 0, 0, 0]
    assert u["pcie_d2h"].tolist() == pytest.approx([1.0, 0, 0, 0])
    assert busy.gpu.total() == pytest.approx(2.5)


def test_busy_bins_coarsen_and_keep_every_busy_second():
    """A run far longer than the first bins span: the bins double until it fits, memory
    stays FINE_BINS numbers, and the busy time is all kept, in the right place."""
    worked = Intervals()
    worked.add(0.0, 1e-3)
    worked.add(10_000.0, 10_010.0)  # 10^4 s: bins of 0.1 ms double 11 times (6.6 s each)
    assert worked.width == FIRST_WIDTH_S * 2 ** 11 and worked.busy.size == FINE_BINS
    assert worked.total() == pytest.approx(10.001)
    edges = np.array([0.0, 5_000.0, 10_000.0, 10_005.0, 11_000.0])
    # in the right place to within a bin (busy time is spread evenly inside one)
    assert np.diff(worked.covered(edges)) == pytest.approx([1e-3, 0.0, 5.0, 5.0],
                                                           abs=worked.width)


def one_at_a_time(intervals: list[tuple[float, float]]) -> tuple[float, np.ndarray]:
    """The bins as splitting each interval the moment it is added gives them (coarsening
    before an interval that ends past the last bin): what the pending intervals must match."""
    width, busy = FIRST_WIDTH_S, np.zeros(FINE_BINS)
    for start, end in intervals:
        if end <= start:
            continue
        while end > width * FINE_BINS:
            busy, width = np.concatenate([busy.reshape(-1, 2).sum(axis=1),
                                          np.zeros(FINE_BINS // 2)]), width * 2
        first, last = int(start // width), min(int(end // width), FINE_BINS - 1)
        if first == last:
            busy[first] += end - start
            continue
        busy[first] += (first + 1) * width - start
        busy[first + 1:last] += width
        busy[last] += end - last * width
    return width, busy


def test_pending_intervals_bin_as_adding_each_one_does():
    """Intervals are binned in batches (some batches spanning a coarsening, the last one
    binned only when read): the bins are those of binning each as it came, to rounding."""
    rng = np.random.default_rng(7)
    t, intervals = 0.0, []
    for _ in range(3 * Intervals.PENDING + 123):
        t += rng.exponential(0.004)
        length = rng.choice([0.0, rng.exponential(1e-4), rng.exponential(0.05)])
        intervals.append((t, t + length))
        if rng.random() < 0.3:
            t += length  # back to back, as a FIFO channel's copies
    worked = Intervals()
    for start, end in intervals:
        worked.add(start, end)
    width, busy = one_at_a_time(intervals)
    assert t > FIRST_WIDTH_S * FINE_BINS * 4  # the run coarsened the bins at least three times
    assert worked.width == width
    assert worked.busy == pytest.approx(busy, rel=1e-9, abs=1e-12)
    assert worked.total() == pytest.approx(sum(e - s for s, e in intervals), rel=1e-12)


def test_a_state_log_keeps_a_row_where_the_state_changed_the_last_of_an_instant():
    state = [(0,) * len(STATE_COLUMNS)]
    log = StateLog(lambda: state[0])
    log.sample(0.0)
    log.sample(0.5)  # unchanged: no row
    state[0] = (1,) + (0,) * (len(STATE_COLUMNS) - 1)
    log.sample(1.0)
    state[0] = (2,) + (0,) * (len(STATE_COLUMNS) - 1)
    log.sample(1.0)  # a later call at the same instant: its state holds
    frame = log.frame()
    assert frame["time_s"].tolist() == [0.0, 1.0] and frame["waiting"].tolist() == [0, 2]
    held = held_at(frame, [-1.0, 0.9, 1.0, 5.0])
    assert held["waiting"].tolist() == [0, 0, 2, 2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One short run of each policy on a small HBM pool, with its loaded scenario."""
    from tests.conftest import RTX4090_LLAMA

    path = tmp_path_factory.mktemp("series") / "s.yaml"
    path.write_text(f"""
name: series
profile: {RTX4090_LLAMA}
policies: [dualpace, vllm, neo]
scheduler: {PRESSURE}
vllm: {{max_num_batched_tokens: 2048, max_num_seqs: 256}}
workload: {{source: default, trace: conv, num_requests: 150, arrival: poisson, rate: 6.0,
           max_prompt_tokens: 3000,
           seed: 3}}
""")
    loaded = load_scenario(path)
    return loaded, {p: simulate(loaded, p) for p in loaded.spec.policies}


@pytest.mark.parametrize("policy", ["dualpace", "vllm", "neo"])
def test_kv_never_exceeds_its_pool_and_the_host_envelope_holds(runs, policy):
    loaded, found = runs
    state = found[policy][0].series.state
    assert (state[list(STATE_COLUMNS)] >= 0).all(axis=None)
    assert state["hbm_kv_blocks"].max() <= loaded.config.gpu_kv_blocks
    reserved = (state["host_kv_blocks"] + state["host_kv_growth_blocks"]
                + state["host_kv_migration_blocks"])
    assert reserved.max() <= loaded.config.host_kv_blocks  # Eq. 2 at every sample
    assert state["hbm_kv_blocks"].max() > 0.8 * loaded.config.gpu_kv_blocks  # under pressure
    assert state["time_s"].is_monotonic_increasing
    assert (state.iloc[-1][list(STATE_COLUMNS)] == 0).all(), "everything freed at the end"
    if policy == "vllm":
        assert (state[["cpu_waiting", "cpu_decoding", "host_kv_blocks"]] == 0).all(axis=None)
    else:
        assert state["host_kv_blocks"].max() > 0 and state["cpu_decoding"].max() > 0
    if policy == "dualpace":
        assert state["host_kv_growth_blocks"].max() > 0


@pytest.mark.parametrize("policy", ["dualpace", "vllm", "neo"])
def test_requests_in_the_node_are_those_arrived_and_not_yet_finished(runs, policy):
    """At every sample, the queues hold every request that has arrived and has not produced
    its last token (the records' arrival and finish times)."""
    _, found = runs
    records = found[policy][0]
    state, rows = records.series.state, records.requests
    t = state["time_s"].to_numpy()
    arrived = np.searchsorted(np.sort(rows["arrival_s"].to_numpy()), t, side="right")
    finished = np.searchsorted(np.sort(rows["finish_s"].to_numpy()), t, side="right")
    in_node = state[list(STATE_COLUMNS[:5])].sum(axis=1).to_numpy()
    assert (in_node == arrived - finished).all()


@pytest.mark.parametrize("policy", ["dualpace", "vllm", "neo"])
def test_utilisation_adds_up_to_the_engines_busy_time(runs, policy):
    _, found = runs
    records, summary = found[policy]
    u = records.series.utilisation
    assert ((u[list(ENGINES)] >= 0) & (u[list(ENGINES)] <= 1)).all(axis=None)
    engine = summary["engine"]
    assert u["end_s"].iloc[-1] == pytest.approx(engine["end_s"])
    width = (u["end_s"] - u["start_s"]).to_numpy()
    busy = {e: float((u[e].to_numpy() * width).sum()) for e in ENGINES}
    # the GPU worker's batches and assists (serviced inside a batch or between batches); a
    # few assists booked from a ready time the GPU had already passed overlap a batch by
    # microseconds, which the capped shares drop
    assert busy["gpu"] == pytest.approx(engine["gpu_busy_s"] + engine["gpu_assist_s"],
                                        rel=1e-5)
    assert busy["cpu"] == pytest.approx(engine["cpu_busy_s"], rel=1e-9)
    if policy == "vllm":
        assert busy["cpu"] == busy["pcie_h2d"] == busy["pcie_d2h"] == 0
    else:
        assert busy["pcie_d2h"] > 0


def test_series_files_round_trip(runs, tmp_path):
    _, found = runs
    series = {p: r.series for p, (r, _) in found.items()}
    write_series(series, tmp_path, {b"k": b"v"})
    back = read_series(tmp_path)
    assert list(back) == ["dualpace", "vllm", "neo"]
    for policy, s in series.items():
        pd.testing.assert_frame_equal(back[policy].state, s.state)
        pd.testing.assert_frame_equal(back[policy].utilisation, s.utilisation)
    assert read_series(tmp_path / "nothing") == {}
    (tmp_path / "state.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="state.parquet: not readable"):
        read_series(tmp_path)


@pytest.mark.parametrize("policy", ["dualpace", "vllm", "neo"])
def test_the_summary_utilisation_is_the_series_over_the_whole_run(runs, policy):
    """summary.json's busy shares are the utilisation series averaged over the run (the GPU's
    with its assists, as the series; the links' also count carried activations at the
    bandwidth, which may overlap a copy)."""
    _, found = runs
    records, summary = found[policy]
    u = records.series.utilisation
    width = (u["end_s"] - u["start_s"]).to_numpy()
    for engine in ("gpu", "cpu"):
        mean = float((u[engine].to_numpy() * width).sum() / u["end_s"].iloc[-1])
        assert summary[f"{engine}_utilisation"] == pytest.approx(mean, rel=1e-5, abs=1e-12)
