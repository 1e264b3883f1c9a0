"""Dense Assist, the GPU engine's side: the server that takes a CPU-Ready request from the
shared control block at stage boundaries and publishes it GPU-Done, and a forward run so that
a ready assist waits for one stage at most, not the whole round.

Assist goes CPU-Ready -> GPU-Running -> GPU-Done through a control block in shared memory
(`cpu_worker.AssistBlock`), which the GPU engine's thread polls at stage boundaries only (and
continuously when it is idle).
"""

from __future__ import annotations

import time

import torch

from dualpace_hw.executors.gpu import Forward, GpuExecutor
from dualpace_hw.runtime.cpu_worker import AssistBlock
from dualpace_hw.runtime.engines import Engines
from dualpace_sim.costs.calibrate import AssistCall
from dualpace_sim.results.trace_events import DENSE_ASSIST


class StagePace:
    """Bounds how far the GPU engine's host thread runs ahead of the GPU, stage by stage.

    Kernel launches are asynchronous: left alone, the host enqueues a whole round and then
    blocks until the GPU finishes it, and a Dense Assist published meanwhile waits for the
    whole round. Recording an event per stage and waiting for the one before lets the host serve
    assists at real stage boundaries while the GPU always has the next stage queued."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.events: list[torch.cuda.Event] = []

    def stage_done(self) -> None:
        if not self.cuda:
            return
        ev = torch.cuda.Event()
        ev.record()
        self.events.append(ev)
        if len(self.events) >= 2:
            self.events[-2].synchronize()

    def drain(self, serve) -> None:
        """Wait for the round's last stage, serving assists meanwhile."""
        if not self.events:
            return
        last = self.events[-1]
        while not last.query():
            if not serve():
                time.sleep(50e-6)




_ASSIST_NAMES = {"p": "post-attention", "lA": "fused final", "lS": "post-layer"}


class AssistServer:
    """The GPU engine's side of Dense Assist: polls the shared control block at stage
    boundaries; a CPU-Ready request becomes GPU-Running, runs, and is published GPU-Done."""

    _METHODS = {"p": "assist_post_attn", "lA": "assist_fused_final", "lS": "assist_post_layer"}

    def __init__(self, block: AssistBlock, engines: Engines) -> None:
        self.block = block
        self.engines = engines  # for the clock and the timeline trace
        self.calls = 0
        self.wait_s = 0.0  # CPU-Ready -> GPU-Running, summed: the stage-boundary wait
        self.service_s = 0.0  # GPU-Running -> GPU-Done, summed
        self.gpu_s = 0.0  # the assists' own GPU time (CUDA events), summed: the service less
        # the GPU stage each one queued behind and the host's part
        self.expecting = False  # the CPU engine is in a step that needs Dense Assist
        self.records: list[AssistCall] = []  # one per call, for Appendix B's calibration

    def serve(self, ex: GpuExecutor) -> bool:
        """Run a ready request, if any; True when one was served."""
        b = self.block
        if not b.ready():
            return False
        start, t0 = time.perf_counter(), self.engines.now()
        kind, layer, rows, waited = b.take()
        began = _timing_event(ex)
        # Results go straight into the shared buffers (one DMA on CUDA, no CPU copy).
        if kind == "lS":
            ex.assist_post_layer(b.residual[:rows], out=b.tokens[:rows])
        else:
            out = b.hidden[:rows] if kind == "p" else b.tokens[:rows]
            getattr(ex, self._METHODS[kind])(layer, b.attn[:rows], b.residual[:rows], out=out)
        cuda_s = 0.0
        if began is not None:
            ended = _timing_event(ex)
            ended.synchronize()  # the assist synchronized already: this returns at once
            cuda_s = began.elapsed_time(ended) / 1e3
        b.done()
        service = time.perf_counter() - start
        self.calls += 1
        self.wait_s += waited
        self.service_s += service
        self.gpu_s += cuda_s
        # W: CPU-Ready -> GPU-Done; L + F: the service the CUDA interval does not cover
        self.records.append(AssistCall(kind, rows, waited + service, cuda_s,
                                       max(service - cuda_s, 0.0)))
        self.engines.slice(DENSE_ASSIST, _ASSIST_NAMES[kind], t0, self.engines.now(), rows=rows,
                           layer=layer, queued_us=round(waited * 1e6, 1))
        return True


def _timing_event(ex: GpuExecutor) -> torch.cuda.Event | None:
    """A timing event recorded now on the stream the executor's assists run on (None off
    CUDA)."""
    if not ex.cuda:
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record(ex.assist_stream)
    return event


def run_forward(ex: GpuExecutor, fw: Forward, channel: AssistServer, paced: bool
                ) -> dict[int, int]:
    """A round's forward as the GPU engine serves it; returns its tokens. With `paced` (the
    CPU engine's steps may need Dense Assist), a ready assist goes first at every stage
    boundary and, while the CPU engine is in such a step, the host stays at most one stage
    ahead of the GPU, so an assist waits for one stage, not the whole round."""
    pace = StagePace(ex.device) if paced else None
    for stage in fw:
        stage()
        if pace is not None:
            if channel.expecting:
                pace.stage_done()
            channel.serve(ex)
    if pace is not None:
        pace.drain(lambda: channel.serve(ex))
    return fw.result()

