"""Serving-shaped timing (paper Appendix B): W warm-ups, then R repeats of I timed
invocations; a primitive's latency is the mean over repeats of the per-invocation mean (the
fastest repeat under the quick protocol of tests)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dualpace_hw.executors.gpu.graphs import no_collection


@dataclass(frozen=True)
class Protocol:
    warmups: int = 5  # W
    invocations: int = 100  # I, at most: fewer when one repeat would exceed max_repeat_s
    repeats: int = 3  # R
    max_repeat_s: float = 0.25  # keeps slow points (big CPU batches) inside the time budget
    fastest: bool = False  # keep the fastest repeat instead of the mean (quick profiles)

    @classmethod
    def quick(cls) -> Protocol:
        """Tiny grids' protocol (tests: a tiny model on a shared 2-core CI machine). Its
        points take microseconds, so one descheduling of the process would dominate a mean of
        two repeats (tables came out 30x too slow, or falling with their shape, under load);
        it keeps the fastest of three."""
        return cls(warmups=1, invocations=2, repeats=3, max_repeat_s=0.02, fastest=True)


class Timer:
    """Times a callable on one device: CUDA events on a GPU, wall clock on the CPU."""

    def __init__(self, device: torch.device, protocol: Protocol,
                 agree: Callable[[float], float] | None = None) -> None:
        """agree: how tensor-parallel ranks settle on one first estimate (and so on the same
        invocation count: a stage with an all-reduce must be called as often on every rank)."""
        self.device = device
        self.p = protocol
        self.cuda = device.type == "cuda"
        self.agree = agree or (lambda estimate: estimate)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def graphed(self, fn: Callable[[], object]) -> float:
        """On CUDA, time `fn` replayed from a CUDA graph, as the executor runs decode-shaped
        batches (no per-kernel launch cost); eagerly where capture is impossible."""
        if not self.cuda:
            return self(fn)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), no_collection():
                fn()
        except RuntimeError:
            torch.cuda.synchronize(self.device)
            return self(fn)
        return self(graph.replay)

    def __call__(self, fn: Callable[[], object]) -> float:
        p = self.p
        for _ in range(p.warmups):
            fn()
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        estimate = self.agree(max(time.perf_counter() - start, 1e-7))
        n = max(1, min(p.invocations, int(p.max_repeat_s / estimate)))
        samples = []
        for _ in range(p.repeats):
            if self.cuda:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
                samples.append(begin.elapsed_time(end) / 1e3 / n)
            else:
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter() - start) / n)
        return min(samples) if p.fastest else statistics.mean(samples)

    def wall(self, fn: Callable[[], object]) -> float:
        """Wall-clock per call including a device sync (for host-visible latencies); ranks
        agree on the invocation count here too."""

        def synced() -> None:
            fn()
            self.sync()

        return Timer(torch.device("cpu"), self.p, self.agree)(synced)
