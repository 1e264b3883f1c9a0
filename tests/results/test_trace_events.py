"""Timeline traces: the recorder's Trace Event Format, and `dualpace-sim run --trace-events`
on the quickstart scenario checked against what the simulator did."""

from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from itertools import pairwise

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results.trace_events import (
    CPU_ENGINE,
    DENSE_ASSIST,
    GPU_ENGINE,
    PCIE_D2H,
    PCIE_H2D,
    TraceRecorder,
    write_trace,
)
from tests.conftest import REPO_ROOT

runner = CliRunner()
ROUTES = {"Full-CPU", "Split-Final", "Fused-Assist"}


def ns(us: float) -> int:
    """The file's microseconds back to the recorder's whole nanoseconds."""
    return round(us * 1000)


def test_recorder_writes_slices_tracks_and_flows_in_the_trace_event_format(tmp_path):
    rec = TraceRecorder("box: dualpace")
    rec.complete(PCIE_D2H, "swap-out", 1.0, 1.5, bytes=4096, req_ids=(7,))
    rec.flow_from(7, PCIE_D2H, 1.25)
    rec.complete(CPU_ENGINE, "Full-CPU", 2.0, 2.25, batch=1)
    rec.flow_to(7, CPU_ENGINE, 2.1)
    rec.flow_to(8, CPU_ENGINE, 2.1)  # nothing open under 8: no arrow
    rec.write(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and "name" in
             e["args"]}
    assert names == {("process_name", "box: dualpace"), ("thread_name", PCIE_D2H),
                     ("thread_name", CPU_ENGINE)}  # only the tracks that have slices
    swap = next(e for e in events if e["name"] == "swap-out")
    assert (swap["ph"], swap["ts"], swap["dur"], swap["args"]) == (
        "X", 1e6, 0.5e6, {"bytes": 4096, "req_ids": [7]})
    start, end = (e for e in events if e["ph"] in "sf")
    assert start["id"] == end["id"] and end["bp"] == "e"
    assert (start["ts"], end["ts"]) == (1.25e6, 2.1e6)
    assert start["tid"] == swap["tid"] and end["tid"] != swap["tid"]


def test_a_gz_name_writes_gzip_and_identical_runs_give_identical_files(tmp_path):
    def write(name):
        rec = TraceRecorder("p")
        rec.complete(GPU_ENGINE, "forward", 0.0, 1.0, decodes=3)
        rec.write(tmp_path / name)
        return tmp_path / name

    first, second, plain = write("a.json.gz"), write("b.json.gz"), write("c.json")
    assert first.read_bytes()[:2] == b"\x1f\x8b"  # the gzip magic number
    assert first.read_bytes() == second.read_bytes()
    assert json.loads(gzip.decompress(first.read_bytes())) == json.loads(plain.read_text())


def test_slices_that_touch_in_seconds_touch_exactly_in_the_file(tmp_path):
    """Viewers drop slices that overlap by even a nanosecond; rounding must not create one."""
    rec = TraceRecorder("p")
    t = 0.0
    for _ in range(1000):
        step = 1e-4 / 3 + t * 1e-7  # times with no exact decimal form
        rec.complete(GPU_ENGINE, "forward", t, t + step)
        t += step
    rec.write(tmp_path / "t.json")
    xs = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
          if e["ph"] == "X"]
    for a, b in pairwise(xs):
        assert ns(a["ts"]) + ns(a["dur"]) == ns(b["ts"])


def test_reopening_a_flow_replaces_the_arrow_that_never_arrived():
    """A request swapped out and back in before the CPU computed it: one arrow, from the last
    transfer."""
    rec = TraceRecorder("p")
    rec.flow_from(3, PCIE_D2H, 1.0)
    rec.flow_from(3, PCIE_H2D, 2.0)
    rec.flow_to(3, GPU_ENGINE, 3.0)
    rec.flow_to(3, GPU_ENGINE, 4.0)
    flows = [e for e in rec.events(1) if e["ph"] in "sf"]
    assert [(e["ph"], e["ts"]) for e in flows] == [("s", 2e6), ("f", 3e6)]


def test_a_slice_ending_before_it_starts_is_refused():
    with pytest.raises(ValueError, match="ends at 1.0 before its start 2.0"):
        TraceRecorder("p").complete(GPU_ENGINE, "forward", 2.0, 1.0)


def test_recorders_are_processes_of_one_file_with_their_own_tracks(tmp_path):
    a, b = TraceRecorder("a"), TraceRecorder("b")
    for rec in (a, b):
        rec.complete(GPU_ENGINE, "forward", 0.0, 1.0)
        rec.complete("Migrator", "copy", 0.0, 1.0)  # a track of the backend's own
        rec.flow_from(1, GPU_ENGINE, 0.5)
        rec.flow_to(1, "Migrator", 0.5)
    write_trace(tmp_path / "t.json", [a, b])
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {1: "a", 2: "b"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    assert threads == {(1, 1): GPU_ENGINE, (1, 6): "Migrator", (2, 1): GPU_ENGINE,
                       (2, 6): "Migrator"}
    assert len({e["id"] for e in events if e["ph"] == "s"}) == 2  # flow ids unique per file


# --- dualpace-sim run --trace-events ---------------------------------------------------------

@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    """The quickstart scenario, shortened to 300 requests, under all three policies."""
    tmp = tmp_path_factory.mktemp("trace")
    doc = yaml.safe_load((REPO_ROOT / "scenarios/quickstart.yaml").read_text())
    doc["profile"] = str((REPO_ROOT / "scenarios" / doc["profile"]).resolve())
    doc["policies"] = ["dualpace", "vllm", "neo"]
    doc["workload"]["num_requests"] = 300
    doc["vllm"] = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    doc["neo"] = {"max_tokens_in_batch": 8192}
    scenario = tmp / "quick.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    trace = tmp / "traces" / "quick.json"
    result = runner.invoke(app, ["run", str(scenario), "--out", str(tmp / "out"), "--quiet",
                                 "--trace-events", str(trace)])
    assert result.exit_code == 0, result.output
    summaries = json.loads((tmp / "out" / "summary.json").read_text())
    events = json.loads(trace.read_text())["traceEvents"]
    return load_scenario(scenario), {s["policy"]: s for s in summaries}, events


def by_policy(events: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """policy -> track name -> its X events, in time order."""
    procs = {e["pid"]: e["args"]["name"].split(": ")[1] for e in events
             if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    out: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e["ph"] == "X":
            out[procs[e["pid"]]][threads[e["pid"], e["tid"]]].append(e)
    for tracks in out.values():
        for xs in tracks.values():
            xs.sort(key=lambda e: e["ts"])
    return out


def span(e: dict) -> tuple[int, int]:
    return ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])


def test_every_policy_gets_its_process_and_tracks(traced_run):
    _, _, events = traced_run
    tracks = {p: set(t) for p, t in by_policy(events).items()}
    assert tracks["dualpace"] == {GPU_ENGINE, DENSE_ASSIST, CPU_ENGINE, PCIE_H2D, PCIE_D2H}
    assert tracks["vllm"] == {GPU_ENGINE}  # no host tier, no link traffic
    assert tracks["neo"] == {GPU_ENGINE, CPU_ENGINE, PCIE_H2D, PCIE_D2H}
    for e in events:
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0, e


def test_engine_rounds_and_link_transfers_never_overlap_and_end_within_the_makespan(traced_run):
    _, summaries, events = traced_run
    for policy, tracks in by_policy(events).items():
        end_ns = ns(summaries[policy]["engine"]["end_s"] * 1e6)
        for track, xs in tracks.items():
            spans = [span(e) for e in xs]
            for (_, a_end), (b_start, _) in pairwise(spans):
                assert a_end <= b_start, (policy, track)
            assert spans[-1][1] <= end_ns, (policy, track)


def test_rounds_and_assists_match_the_engine_counters(traced_run):
    _, summaries, events = traced_run
    runs = by_policy(events)
    dp, stats = runs["dualpace"], summaries["dualpace"]["engine"]
    assert len(dp[CPU_ENGINE]) >= stats["cpu_rounds"]  # rounds, plus waits on the queue head
    rounds = [e for e in dp[CPU_ENGINE] if e["name"] in ROUTES]
    assert len(rounds) == stats["cpu_rounds"]
    assert Counter(e["name"] for e in rounds) == stats["routes"]
    assert all(e["args"]["batch"] == len(e["args"]["req_ids"]) >= 1 for e in rounds)
    forwards = [e for e in dp[GPU_ENGINE] if e["name"] == "forward"]
    assert len(forwards) == stats["gpu_rounds"] - stats["migration_only_rounds"]
    assert len(dp[DENSE_ASSIST]) == stats["assist_calls"] > 0
    assert len(runs["vllm"][GPU_ENGINE]) == summaries["vllm"]["engine"]["gpu_rounds"]
    neo_iterations = [e for e in runs["neo"][GPU_ENGINE] if e["name"] == "iteration"]
    assert len(neo_iterations) == summaries["neo"]["engine"]["gpu_rounds"]


def test_dense_assists_run_on_the_gpu_inside_the_cpu_round_that_asked(traced_run):
    """The GPU worker services an assist at a stage boundary of a forward (the forward grows
    around it) or while no forward runs; the CPU round waits for it, so the CPU round spans it
    (o_x <= q_x in this profile: the GPU's finalization ends before the CPU sees the result)."""
    loaded, _, events = traced_run
    assert loaded.cost.assist_o("p") <= loaded.cost.assist_q("p")
    dp = by_policy(events)["dualpace"]
    forwards = [span(e) for e in dp[GPU_ENGINE] if e["name"] == "forward"]
    rounds = [span(e) for e in dp[CPU_ENGINE] if e["name"] in ROUTES]
    inside_forwards = 0
    for assist in dp[DENSE_ASSIST]:
        start, end = span(assist)
        # both lists are sequential: only the last one starting before the assist ends (the
        # forward) or at its start (the round) can hold it
        k = bisect_left(forwards, (end,)) - 1
        f_start, f_end = forwards[k] if k >= 0 else (0, 0)
        if start < f_end:  # overlaps a forward: must lie inside it
            assert f_start <= start and end <= f_end, assist
            inside_forwards += 1
        r_start, r_end = rounds[bisect_right(rounds, (start, float("inf"))) - 1]
        assert r_start <= start and end <= r_end, assist
        assert assist["args"]["queued_us"] >= 0
    assert inside_forwards > 0


def test_link_transfers_take_latency_plus_bytes_over_bandwidth(traced_run):
    loaded, summaries, events = traced_run
    link, cost = loaded.profile.link, loaded.cost
    bandwidth = {PCIE_H2D: link.h2d_bytes_per_s, PCIE_D2H: link.d2h_bytes_per_s}
    token_bytes = cost.kv_block_bytes_per_layer // cost.block_size
    for policy in ("dualpace", "neo"):
        tracks = by_policy(events)[policy]
        moved = defaultdict(list)
        for track in (PCIE_H2D, PCIE_D2H):
            for e in tracks[track]:
                nbytes = e["args"]["bytes"]
                expected = link.latency_s + nbytes / bandwidth[track]
                assert e["dur"] == pytest.approx(expected * 1e6, abs=2e-3), e
                unit = token_bytes if e["name"] == "Prefill-to-CPU copy" else cost.kv_block_bytes
                assert nbytes % unit == 0, e
                moved[e["name"]] += e["args"]["req_ids"]
        stats = summaries[policy]["engine"]
        assert len(moved["swap-out"]) == stats["swap_outs"] > 0
        assert len(moved["swap-in"]) == stats["swap_ins"] > 0
        copied = [e for e in tracks[PCIE_D2H] if e["name"] == "Prefill-to-CPU copy"]
        assert len(copied) % loaded.profile.model.n_layers == 0 and copied


def test_migration_arrows_run_from_a_transfer_to_a_later_round(traced_run):
    _, _, events = traced_run
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    slices = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            slices[e["pid"], e["tid"]].append(span(e))
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            flows[e["id"]][e["ph"]] = e
            # the arrow binds to the slice containing it on its own track
            assert any(a < ns(e["ts"]) < b for a, b in slices[e["pid"], e["tid"]]), e
    assert flows
    ended_on = set()
    for pair in flows.values():
        start, end = pair["s"], pair["f"]
        assert threads[start["pid"], start["tid"]] in (PCIE_H2D, PCIE_D2H)
        assert start["ts"] < end["ts"]
        ended_on.add(threads[end["pid"], end["tid"]])
    assert ended_on == {GPU_ENGINE, CPU_ENGINE}


@pytest.mark.parametrize("where, expected", [
    ("", "is a directory; give a file such as {tmp}/trace.json"),
    ("a-file/t.json", "cannot create its folder: File exists ({tmp}/a-file)"),
])
def test_an_unwritable_trace_file_is_one_clear_error_before_simulating(write_scenario, tmp_path,
                                                                      where, expected):
    (tmp_path / "a-file").write_text("")
    trace = tmp_path / where
    result = runner.invoke(app, ["run", str(write_scenario()), "--out", str(tmp_path / "o"),
                                 "--trace-events", str(trace)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --trace-events {trace}: {expected.format(tmp=tmp_path)}"]
    assert not (tmp_path / "o").exists()  # nothing was simulated
