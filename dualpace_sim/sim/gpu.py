"""The simulated GPU worker: GPU-main batches as FIFO stage tasks plus Dense Assist service.

A GPU-main batch is the stage sequence pre-layer, N transformer layers, post-layer. When Dense
Assist is reachable, the worker polls for a ready assist at every stage boundary (after the
pre-layer and after each layer, i.e. also before the post-layer) and services it before the
next stage; a running stage is never preempted. The boundaries of the current batch form an
arithmetic progression, so finding "the next boundary after t" and pushing the rest of the batch
back by an assist's service time are O(1) without one SimPy event per stage.

A batch that must wait for an assist already being serviced is set up at once with its start
at the assist's end, so the wait costs no event of its own; an assist that becomes ready before
that start queues in front of the batch, as on the GPU's stream.

Where the GPU sets the pace (graph-replayed decode layers, or eager layers slower than the
host's launch floor), the real GPU engine keeps its host one stage ahead, so the GPU always
has the next stage queued (dualpace_hw.runtime.assist_server.StagePace): an assist the host
takes at a boundary queues behind that stage and starts one boundary later. On the H200 box an
assist's service ran 0.88 ms beyond its CUDA time on average at 12 req/s, where the handshake
itself costs ~10 us (profiler/handshake.py). Where the host sets the pace the GPU has nothing queued
and the assist starts at the boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from dualpace_sim.results.node_series import Intervals


class GpuDevice:
    def __init__(self, env: simpy.Environment, poll_s: float, stage_mode: bool) -> None:
        self.env = env
        self.poll_s = poll_s if stage_mode else 0.0  # whole-forward path: no boundary checks
        self.stage_mode = stage_mode
        self.busy_until = 0.0  # end of an assist serviced while no main batch runs
        self.busy_s = 0.0  # GPU-main time, for utilization
        self.assist_s = 0.0  # time spent servicing Dense Assist
        self.assist_calls = 0
        self.worked = Intervals()  # batches and assists, for utilisation over time
        # Called once a batch is set up, before the worker sleeps: lets the caller book the
        # assists that will meet it, so they are known before its end is scheduled.
        self.on_batch_start: Callable[[], None] | None = None
        self.active = False  # a main batch is set up (it may still wait for its start)
        self._pre = 0.0
        self._post = 0.0
        self._start = 0.0  # when the batch's pre-layer starts
        self._first = 0.0  # time of boundary 0 (after the pre-layer), before shifts
        self._layer = 0.0  # one layer stage plus its boundary poll
        self._n_layers = 0
        self._end = 0.0  # planned batch end, before shifts
        self._shift = 0.0  # total assist service inserted into the running batch
        self._next_k = 0  # first boundary that can still take an assist
        self._ahead = 0  # stages queued ahead of an assist taken at a boundary (0 or 1)

    def run_batch(self, pre_s: float, layer_s: float, n_layers: int, post_s: float,
                  stage_queued: bool = False):
        """SimPy process body: wait for a pending assist, run the stages; returns when the
        batch started (after that wait) and when its last transformer layer finished (when its
        Prefill-to-CPU copy can start). `stage_queued`: the GPU sets the pace, so the host
        keeps the next stage queued and an assist runs one boundary later."""
        env = self.env
        self._pre, self._post = pre_s, post_s
        self._layer = layer_s + self.poll_s
        self._n_layers = n_layers
        self._shift = 0.0
        self._next_k = 0
        self._ahead = 1 if stage_queued else 0
        self._begin(max(env.now, self.busy_until))
        self.active = True
        if self.on_batch_start is not None:
            self.on_batch_start()
        while True:
            remaining = self._end + self._shift - env.now
            if remaining <= 1e-12:
                break
            yield env.timeout(remaining)
        self.active = False
        self.busy_s += self._end - self._start
        self.worked.add(self._start, env.now)  # assists it serviced inside fill the rest
        return self._start, self._first + n_layers * self._layer + self._shift

    def _begin(self, start: float) -> None:
        """Place the batch's stages from `start` on."""
        self._start = start
        self._first = start + self._pre + self.poll_s
        self._end = self._first + self._n_layers * self._layer + self._post

    def serves_ahead(self, ready_s: float) -> bool:
        """Whether an assist ready at `ready_s` can be booked now, ahead of the clock, with the
        answer it would get at `ready_s`: a main batch is set up and still runs then, and until
        then only the CPU engine's own assists, booked in order, change the GPU's timeline."""
        return self.active and ready_s < self._end + self._shift

    def planned_layer_ends(self, start: float, pre_s: float, layer_s: float, n: int) -> list[float]:
        first = start + pre_s + self.poll_s
        step = layer_s + self.poll_s
        return [first + (k + 1) * step for k in range(n)]

    def at_stage_boundary(self, ready_s: float) -> bool:
        """Whether an assist ready at `ready_s` is served at a stage boundary of the running
        batch, beside its kernels (rather than in front of it, after it, or on an idle GPU)."""
        return self.active and ready_s >= self._start and self._boundary(ready_s) <= self._n_layers

    def _boundary(self, ready_s: float) -> int:
        """The running batch's first boundary that can take an assist ready at `ready_s`."""
        since_first = ready_s - self._shift - self._first
        return max(self._next_k, math.ceil(since_first / self._layer - 1e-9) + self._ahead)

    def assist(self, ready_s: float, service_s: float) -> float:
        """Book a Dense Assist that becomes ready at `ready_s` and takes `service_s` wherever
        it is served; returns its service start."""
        return self.serve(ready_s, service_s, service_s)[0]

    def serve(self, ready_s: float, service_s: float, beside_s: float) -> tuple[float, bool]:
        """Book a Dense Assist that becomes ready at `ready_s`: it takes `beside_s` when served
        at a stage boundary of the running batch (:meth:`at_stage_boundary`, decided with the
        one boundary lookup), `service_s` elsewhere. Returns its service start and whether it
        was served beside the batch. One serviced inside the running batch is in that batch's
        interval of work (it pushes the batch's end back); the others are logged as their
        own."""
        self.assist_calls += 1
        if self.active:
            if ready_s < self._start:  # the batch waits for an assist: queue in front of it
                self.assist_s += service_s
                start = self.busy_until
                self.busy_until = start + service_s
                self._begin(self.busy_until)
                self.worked.add(start, self.busy_until)
                return start, False
            k = self._boundary(ready_s)
            if k <= self._n_layers:  # at a stage boundary of the running batch
                self.assist_s += beside_s
                start = self._first + k * self._layer + self._shift
                self._shift += beside_s
                self._next_k = k + 1
                return start, True
            start = self._end + self._shift  # in the post-layer: right after the batch
        else:
            start = max(ready_s, self.busy_until)
        self.assist_s += service_s
        self.busy_until = start + service_s
        self.worked.add(start, self.busy_until)
        return start, False
