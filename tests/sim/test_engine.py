"""The simulated node end to end: engine loops, routes, transfers, determinism."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core import Owner
from dualpace_sim.costs import CostModel, load_profile
from dualpace_sim.costs.profile import AssistCalibration, AssistGroup, PerAssistPath
from dualpace_sim.results.records import records_frame, write_records
from dualpace_sim.sim import DualPaceNode
from dualpace_sim.sim.assist import AssistBooker
from tests.conftest import RTX4090_LLAMA

# A small HBM and a CPU tier big enough to matter exercise every migration path.
PRESSURE = {"gpu_kv_blocks": 600, "host_kv_blocks": 20000}


def simulate(path, node_class=DualPaceNode):
    loaded = load_scenario(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the profile grids must cover what the runs ask for
        return loaded, node_class(loaded.requests, loaded.cost, loaded.config).run()


class SteppingBooker(AssistBooker):
    """Assists booked as before the closed form: a timeout to each one's ready time, then the
    assist."""

    def run(self, b, first_s, kinds, read=0.0, local=0.0, write=0.0):
        env = self.env
        yield env.timeout(first_s)
        for i, kind in enumerate(kinds):
            t = self.terms(kind, b)
            self.link.h2d.carry(t.to_gpu, env.now)
            self.link.d2h.carry(t.to_host, env.now)
            beside = self.gpu.at_stage_boundary(env.now)
            g, service = (t.g_beside, t.service_beside) if beside else (t.g, t.service)
            resume = self.gpu.assist(env.now, service) + g + t.q
            if i < len(kinds) - 1:
                yield env.timeout(resume - env.now + read + local + write)
        yield env.timeout(resume - env.now)


class PerAssistNode(DualPaceNode):
    """The node as it ran before: assists stepped one by one, and every idle CPU engine woken
    after each GPU commit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.assists = SteppingBooker(self.env, self.gpu, self.link, self.cost, self.trace)

    def _wake_cpu(self):
        self._wake("cpu")


def run_counting(path, node_class):
    """Records bytes, engine counters and SimPy events of one run."""
    loaded = load_scenario(path)
    node = node_class(loaded.requests, loaded.cost, loaded.config)
    out = node.run()
    return records_frame(out.requests, "dualpace"), out.stats, node.env.events


@pytest.mark.parametrize("routes", [
    {"route_p": 0, "route_f": 0},  # every CPU batch Fused-Assist
    {"route_p": 4096, "route_f": 0, "cpu_batch_limit": 64},  # every CPU batch Split-Final
    {},  # the profile's fitted (P, F): a mix
])
def test_the_closed_form_assist_chain_books_what_a_timeout_per_assist_booked(write_scenario,
                                                                             routes):
    """Booking a CPU batch's assists ahead of the clock, and leaving an idle CPU engine asleep
    when it has nothing to run, give the same token times, engine counters and GPU timeline as
    stepping to every assist and waking the CPU after every GPU commit, in far fewer events."""
    path = write_scenario(scheduler={**PRESSURE, **routes})
    frame, stats, events = run_counting(path, DualPaceNode)
    old_frame, old_stats, old_events = run_counting(path, PerAssistNode)
    assert stats.assist_calls > 0 and stats.cpu_rounds > 0
    assert frame.equals(old_frame)
    assert stats == old_stats
    assert events < old_events
    if routes.get("route_p") == 0:  # n_layers per CPU round before, a handful now
        assert events < old_events / 2


def test_every_request_completes_with_max_tokens_under_pressure(write_scenario):
    loaded, out = simulate(write_scenario(scheduler=PRESSURE))
    for spec, r in zip(loaded.requests, out.requests, strict=True):
        assert r.generated == spec.max_tokens == r.max_tokens
        assert r.token_times[0] > spec.arrival_s
        assert all(a < b for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    s = out.stats
    assert s.prefills_to_cpu > 0 and s.swap_ins > 0, "the pressure case should migrate"
    assert s.cpu_rounds > 0


def test_cpu_tokens_follow_the_transfer_that_made_the_request_cpu_owned(write_scenario):
    """A request decodes on the CPU only after its Prefill-to-CPU copy or swap-out landed, and
    on the GPU again only after its swap-in landed."""
    _, out = simulate(write_scenario(scheduler=PRESSURE))
    checked = 0
    for r in out.requests:
        owner, since = Owner.GPU, 0.0
        events = sorted(r.migrations)
        for t, who in zip(r.token_times[1:], r.token_owners[1:], strict=True):
            while events and events[0][0] <= t:
                landed, kind = events.pop(0)
                owner = Owner.GPU if kind == "swap_in" else Owner.CPU
                since = landed
            assert who == owner, f"request {r.req_id}: token at {t} by {who}, owner {owner}"
            assert t > since or since == 0.0
            checked += 1
    assert checked > 1000


def test_fused_assist_makes_one_assist_per_layer(write_scenario):
    """(P, F) = (0, 0) routes every CPU batch Fused-Assist: N assists per CPU round."""
    loaded, out = simulate(write_scenario(scheduler={**PRESSURE, "route_p": 0, "route_f": 0}))
    s = out.stats
    assert s.stage_mode and s.routes == {"Fused-Assist": s.cpu_rounds}
    assert s.assist_calls == s.cpu_rounds * loaded.cost.n_layers


def test_split_final_makes_one_assist_per_round(write_scenario):
    loaded, out = simulate(write_scenario(scheduler={**PRESSURE, "route_p": 4096, "route_f": 0,
                                                     "cpu_batch_limit": 64}))
    s = out.stats
    assert s.routes == {"Split-Final": s.cpu_rounds}
    assert s.assist_calls == s.cpu_rounds


def test_whole_forward_path_when_assist_is_unreachable(write_scenario):
    """C <= F: every reachable CPU batch is Full-CPU, so no stage boundaries and no assists."""
    _, out = simulate(write_scenario(scheduler={**PRESSURE, "cpu_batch_limit": 16,
                                                "route_p": 32, "route_f": 16}))
    s = out.stats
    assert not s.stage_mode and s.assist_calls == 0
    assert s.routes == {"Full-CPU": s.cpu_rounds}


def test_assist_lengthens_gpu_main_work(write_scenario):
    """Dense Assist displaces GPU-main service, so GPU-resident requests see it."""
    _, full = simulate(write_scenario(scheduler={**PRESSURE, "cpu_batch_limit": 64,
                                                 "route_p": 128, "route_f": 64}))
    _, fused = simulate(write_scenario(scheduler={**PRESSURE, "cpu_batch_limit": 64,
                                                  "route_p": 0, "route_f": 0}))
    assert fused.stats.gpu_assist_s > 0 and full.stats.gpu_assist_s == 0
    cpu_rounds_s = lambda o: o.stats.cpu_busy_s / o.stats.cpu_rounds  # noqa: E731
    assert cpu_rounds_s(fused) < cpu_rounds_s(full), "assisting should speed CPU rounds up"


def test_same_seed_gives_byte_identical_records(write_scenario, tmp_path):
    path = write_scenario(scheduler=PRESSURE)
    blobs = []
    for i in range(2):
        _, out = simulate(path)
        target = tmp_path / f"r{i}.parquet"
        write_records(records_frame(out.requests, "dualpace"), target)
        blobs.append(target.read_bytes())
    assert blobs[0] == blobs[1]


def test_a_host_filled_by_waiting_requests_no_longer_stalls(write_scenario, tmp_path):
    """Eq. 2 as the paper writes it reserves growth only for CPU-running requests: two
    host-bound prompts admitted in one round fill this host (2 x 32 prompt blocks leave 6 of
    70, less than either's growth) and neither can start decoding. The core reserves the
    waiting requests' growth too (docs/liveness.md): the second waits for the first to finish."""
    trace = tmp_path / "two.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n40,20\n500,200\n500,200\n")
    path = write_scenario(
        scheduler={"gpu_kv_blocks": 4, "host_kv_blocks": 70},
        workload={"source": "vidur", "path": str(trace), "num_requests": 3, "trace": None,
                  "rate": 1e6},
    )
    loaded = load_scenario(path)
    out = DualPaceNode(loaded.requests, loaded.cost, loaded.config).run()
    assert [r.generated for r in out.requests] == [20, 200, 200]


def test_a_calibrated_q_charges_its_stage_boundary_wait_once(write_scenario, tmp_path):
    """A calibrated q_x holds the wait for the GPU's stage boundary, which the simulator books
    itself: the more of q_x that wait is, the shorter a Fused-Assist CPU round."""
    base = load_profile(RTX4090_LLAMA)

    def calibrated(boundary_s: float) -> Path:
        groups = [AssistGroup(path=x, rows=1, calls=1, q_s=2e-3, o_s=2e-5,
                              boundary_s=boundary_s) for x in ("p", "lA", "lS")]
        record = AssistCalibration(runs=["hand-made"], date="2026-12-01", groups=groups)
        assist = base.assist.model_copy(update={
            "q": PerAssistPath(p=2e-3, lA=2e-3, lS=2e-3), "calibration": record})
        out = tmp_path / f"profile-{boundary_s}.yaml"
        base.model_copy(update={"assist": assist}).save(out)
        return out

    per_round = []
    for boundary_s in (0.0, 2e-3):
        path = write_scenario(f"b{boundary_s}.yaml", profile=str(calibrated(boundary_s)),
                              scheduler={**PRESSURE, "route_p": 0, "route_f": 0})
        _, out = simulate(path)
        assert out.stats.assist_calls > 0
        per_round.append(out.stats.cpu_busy_s / out.stats.cpu_rounds)
    assert per_round[1] < per_round[0]


def test_assists_beside_a_running_batch_pay_the_served_cuda_interval(write_scenario, tmp_path):
    """A calibration whose served CUDA intervals ran twice the idle GPU's g_x: the assists
    taken at a running batch's stage boundaries cost more GPU time and longer CPU rounds, the
    closed-form chain still books what stepping to each assist books (which assists are
    beside a batch: tests/sim/test_gpu_device.py)."""
    base = load_profile(RTX4090_LLAMA)
    idle = CostModel(base)
    groups = [AssistGroup(path=x, rows=b, calls=1, q_s=2e-5, o_s=2e-5, boundary_s=0.0,
                          g_s=2 * idle.assist_gpu(x, b))
              for x in ("p", "lA", "lS") for b in (1, 64)]
    record = AssistCalibration(runs=["hand-made"], date="2026-12-02", groups=groups)
    stretched = tmp_path / "stretched.yaml"
    base.model_copy(update={"assist": base.assist.model_copy(
        update={"calibration": record})}).save(stretched)
    runs = {}
    for name, profile in (("idle g", RTX4090_LLAMA), ("served G", stretched)):
        path = write_scenario(f"{name}.yaml", profile=str(profile),
                              scheduler={**PRESSURE, "route_p": 0, "route_f": 0})
        frame, stats, _ = run_counting(path, DualPaceNode)
        if name == "served G":
            old_frame, old_stats, _ = run_counting(path, PerAssistNode)
            assert frame.equals(old_frame) and stats == old_stats
        runs[name] = stats
    g, served = runs["idle g"], runs["served G"]
    per_assist = [s.gpu_assist_s / s.assist_calls for s in (g, served)]
    assert per_assist[0] < per_assist[1]
    assert served.cpu_busy_s / served.cpu_rounds > g.cpu_busy_s / g.cpu_rounds


def test_assists_in_gpu_paced_batches_wait_for_the_stage_queued_ahead(write_scenario,
                                                                       monkeypatch):
    """The real GPU engine keeps the next stage queued where the GPU sets the pace, so an
    assist it takes runs one stage later; the CPU engine's Fused-Assist steps feel that."""
    path = write_scenario(scheduler={**PRESSURE, "cpu_batch_limit": 64, "route_p": 0,
                                     "route_f": 0})
    _, queued = simulate(path)
    monkeypatch.setattr(DualPaceNode, "_gpu_paced", lambda self, plan, layer: False)
    _, at_boundary = simulate(path)
    per_round = lambda o: o.stats.cpu_busy_s / o.stats.cpu_rounds  # noqa: E731
    assert queued.stats.assist_calls > 0
    assert per_round(queued) > per_round(at_boundary)
