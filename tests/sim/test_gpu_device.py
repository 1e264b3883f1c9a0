"""The GPU worker's stage-boundary Dense Assist service."""

from __future__ import annotations

import pytest
import simpy

from dualpace_sim.sim.gpu import GpuDevice

PRE, LAYER, N, POST = 1.0, 2.0, 4, 1.0  # a batch of 1 + 4*2 + 1 = 10 s


def run_with_assists(stage_mode: bool, poll: float, assists: list[tuple[float, float]],
                     stage_queued: bool = False):
    """Start one batch at t=0 and book assists (ready time, service time) as the CPU would."""
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=poll, stage_mode=stage_mode)
    starts, ends = [], []

    def batch():
        yield from gpu.run_batch(PRE, LAYER, N, POST, stage_queued)
        ends.append(env.now)

    def cpu():
        for ready, service in assists:
            yield env.timeout(ready - env.now)
            starts.append(gpu.assist(env.now, service))

    env.process(batch())
    env.process(cpu())
    env.run()
    return gpu, starts, ends


def test_assist_waits_for_the_next_stage_boundary():
    """An assist ready mid-layer starts when that layer ends, never preempting it."""
    _, starts, ends = run_with_assists(True, 0.0, [(2.0, 0.5)])
    # boundaries: 1 (after pre-layer), 3, 5, 7, 9 (after each layer); 2.0 falls inside layer 1
    assert starts == [3.0]
    assert ends == [10.5]  # the rest of the batch moved back by the service time


def test_assist_at_a_boundary_and_after_earlier_shift():
    """Later assists see the boundaries already pushed back by earlier ones."""
    _, starts, ends = run_with_assists(True, 0.0, [(0.5, 1.0), (4.5, 1.0)])
    assert starts[0] == 1.0  # after the pre-layer
    # boundaries are now 2 (after service), 4, 6, 8, 10: 4.5 -> next boundary at 6
    assert starts[1] == 6.0
    assert ends == [12.0]


def test_where_the_gpu_sets_the_pace_an_assist_runs_after_the_stage_queued_ahead():
    """The real GPU engine keeps its host one stage ahead of a GPU-paced batch: an assist taken
    at a boundary queues behind that stage and starts one boundary later; the next one can
    start no earlier than the boundary after that; past the last layer it runs after the
    batch."""
    _, starts, ends = run_with_assists(True, 0.0, [(2.0, 0.5), (3.2, 0.5)], stage_queued=True)
    # noticed at boundary 3, queued behind the next layer: starts at 5 and ends at 5.5; the
    # second, ready since 3.2, is taken then and queues behind the layer launched next: 7.5
    assert starts == [5.0, 7.5]
    assert ends == [11.0]
    _, starts, ends = run_with_assists(True, 0.0, [(8.0, 0.5)], stage_queued=True)
    assert starts == [10.0] and ends == [10.0]  # behind the post-layer: after the batch
    _, starts, _ = run_with_assists(True, 0.0, [(2.0, 0.5)], stage_queued=False)
    assert starts == [3.0]  # the host sets the pace: nothing queued, at the boundary


def test_polling_cost_is_paid_at_every_boundary_in_stage_mode_only():
    """Stage mode polls at N + 1 boundaries; the whole-forward path does not poll at all."""
    _, _, staged = run_with_assists(True, 0.1, [])
    _, _, whole = run_with_assists(False, 0.1, [])
    assert staged == [pytest.approx(10.0 + 0.1 * (N + 1))]
    assert whole == [10.0]


def test_assist_during_post_layer_runs_after_the_batch_and_delays_the_next():
    """In the post-layer no boundary remains: the assist starts when the batch ends and the
    next GPU-main batch waits for it."""
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=0.0, stage_mode=True)
    log = {}

    def engine():
        yield from gpu.run_batch(PRE, LAYER, N, POST)
        log["first_end"] = env.now
        log["second_start"] = None
        start = env.now
        yield from gpu.run_batch(PRE, LAYER, N, POST)
        log["second_end"] = env.now
        log["second_span"] = env.now - start

    def cpu():
        yield env.timeout(9.5)
        log["assist_start"] = gpu.assist(env.now, 2.0)

    env.process(engine())
    env.process(cpu())
    env.run()
    assert log["assist_start"] == 10.0 and log["first_end"] == 10.0
    assert log["second_end"] == 22.0  # 10 + 2 (assist) + 10


def test_idle_gpu_serves_assists_immediately_and_back_to_back():
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=0.0, stage_mode=True)
    assert gpu.assist(1.0, 0.5) == 1.0
    assert gpu.assist(1.2, 0.5) == 1.5  # the first still occupies the GPU
    assert gpu.assist_calls == 2


def test_a_batch_behind_a_serviced_assist_starts_at_its_end_and_later_assists_queue_first():
    """A batch set up while an assist is serviced starts when it ends; an assist that becomes
    ready before that start runs in front of the batch, which starts after it."""
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=0.0, stage_mode=True)
    log = {}
    assert gpu.assist(0.0, 2.0) == 0.0  # the GPU is busy until 2

    def engine():
        log["span"] = yield from gpu.run_batch(PRE, LAYER, N, POST)
        log["end"] = env.now

    def cpu():
        yield env.timeout(1.0)
        log["queued"] = gpu.assist(env.now, 0.5)

    env.process(engine())
    env.process(cpu())
    env.run()
    assert log["queued"] == 2.0  # behind the first, in front of the batch
    assert log["span"] == (2.5, 11.5)  # started at 2.5; last layer ends 2.5 + 1 + 4 * 2
    assert log["end"] == 12.5


def test_an_assist_is_booked_ahead_only_while_the_batch_set_up_runs():
    """serves_ahead: ready before the batch's (shifted) end, with a batch set up."""
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=0.0, stage_mode=True)
    seen = []

    def engine():
        yield from gpu.run_batch(PRE, LAYER, N, POST)
        seen.append(("after", gpu.serves_ahead(env.now + 1.0)))

    def probe():
        seen.append(("idle", gpu.serves_ahead(0.5)))
        yield env.timeout(0.5)
        gpu.assist(env.now, 1.0)  # shifts the end from 10 to 11
        seen.append(("inside", gpu.serves_ahead(10.5)))
        seen.append(("beyond", gpu.serves_ahead(11.0)))

    env.process(probe())
    env.process(engine())
    env.run()
    assert seen == [("idle", False), ("inside", True), ("beyond", False), ("after", False)]


def test_only_an_assist_taken_at_a_running_batchs_stage_boundary_runs_beside_its_kernels():
    """at_stage_boundary: what the booker charges the served (stretched) CUDA interval for.
    Not on an idle GPU, not in front of a batch that waits to start, not past its last layer
    (the post-layer: the assist runs after the batch)."""
    env = simpy.Environment()
    gpu = GpuDevice(env, poll_s=0.0, stage_mode=True)
    seen = []
    gpu.assist(0.0, 2.0)  # the batch set up next waits for this one: it starts at 2

    def engine():
        yield from gpu.run_batch(PRE, LAYER, N, POST)

    def probe():
        seen.append(("before it starts", gpu.at_stage_boundary(0.0)))
        yield env.timeout(1.0)
        seen.append(("in front", gpu.at_stage_boundary(1.0)))  # the batch starts at 2
        seen.append(("first layer", gpu.at_stage_boundary(3.5)))  # boundaries 3, 5, 7, 9, 11
        seen.append(("post-layer", gpu.at_stage_boundary(11.5)))  # ends at 12
        yield env.timeout(12.0)
        seen.append(("idle, after", gpu.at_stage_boundary(env.now)))

    env.process(engine())
    env.process(probe())
    env.run()
    assert seen == [("before it starts", False), ("in front", False), ("first layer", True),
                    ("post-layer", False), ("idle, after", False)]
