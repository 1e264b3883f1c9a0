"""A CPU batch's Dense Assists, booked on the simulated GPU worker in closed form.

A Fused-Assist CPU batch hands the GPU one assist per layer, each ready when the CPU has read
the previous one's result, run the next layer's local stages and written its activations. The
GPU services each at its running batch's next stage boundary (GpuDevice.assist). Nothing but
the CPU engine's own assists, booked in order, changes the GPU's timeline while a batch runs,
so every assist that becomes ready before the batch ends can be booked at once, ahead of the
clock, with the answer it would get when it becomes ready (GpuDevice.serves_ahead). The chain
then waits for the GPU's next move: a new batch set up (its assists are booked before its end
is scheduled) or a wait without a batch (the next assist gets a wake-up at its ready time).
A CPU batch thus costs a few SimPy events, not one timeout per layer plus a GPU re-sleep per
assist, and every time is the one that stepping to each assist computed.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import simpy

from dualpace_sim.results.trace_events import DENSE_ASSIST, TraceRecorder

from ..costs import CostModel
from .gpu import GpuDevice
from .links import Link

_NAMES = {"p": "assist p", "lA": "assist lA", "lS": "assist lS"}  # trace slice names
# Activations an assist moves (to the GPU, back to the host): a per-layer assist takes the
# attention output and the residual and returns the next layer's input; the final ones
# return only the sampled token.
_ACTIVATIONS = {"p": (2, 1), "lA": (2, 0), "lS": (1, 0)}


@dataclass(frozen=True, slots=True)
class AssistTerms:
    """What one assist of a kind and CPU batch size costs (paper Appendix B, Eq. 14): the GPU
    is displaced for o_x + g_x and the CPU waits q_x + g_x; g_x includes moving the
    activations over the link. The wait for the GPU's stage boundary, which a calibrated q_x
    holds, is booked here (GpuDevice.assist), so after the service starts the CPU waits only
    the rest of q_x (CostModel.assist_q_served)."""

    kind: str
    g: float  # g_x: CUDA time, activations included
    service: float  # o_x + g_x: GPU-worker time
    g_beside: float  # g_x served at a running batch's stage boundary, beside its kernels
    service_beside: float  # o_x + g_beside
    q: float  # q_x less its stage-boundary wait: the CPU's wait beyond g_x once served
    to_gpu: int  # activation bytes host -> GPU
    to_host: int  # activation bytes GPU -> host


@dataclass(slots=True, eq=False)
class AssistChain:
    """The assists of the running CPU batch and how far they are booked."""

    b: int  # CPU batch rows
    terms: list[AssistTerms]  # the assists in order
    read: float  # CPU time to read an assist's result
    local: float  # CPU time of one layer's pre-attention and attention
    write: float  # CPU time to write an assist's activations
    ready: float  # when the next assist is ready
    done: simpy.Event  # succeeds when the last assist's result is back on the CPU
    next: int = 0  # index of the next assist to book
    resume: float = 0.0  # when the last booked assist's result is back on the CPU
    wake: simpy.Event | None = None  # books assist `wake_for` at its ready time
    wake_for: int = -1

    def finish(self, _event: simpy.Event) -> None:
        self.done.succeed()


class AssistBooker:
    """Books the CPU engine's assist chains on the GPU worker; one chain runs at a time."""

    def __init__(self, env: simpy.Environment, gpu: GpuDevice, link: Link, cost: CostModel,
                 trace: TraceRecorder | None) -> None:
        self.env, self.gpu, self.link, self.cost, self.trace = env, gpu, link, cost, trace
        self.chain: AssistChain | None = None
        self._terms: dict[tuple[str, int], AssistTerms] = {}
        gpu.on_batch_start = self.gpu_moves_on

    def run(self, b: int, first_s: float, kinds: tuple[str, ...], read: float = 0.0,
            local: float = 0.0, write: float = 0.0) -> Generator[simpy.Event, None, None]:
        """SimPy process body: the assists of `kinds`, in order, for a CPU batch of `b` rows;
        the first is ready `first_s` from now, each later one `read + local + write` of CPU
        work after the previous one's result is back; returns when the last one's is."""
        env = self.env
        terms = [self.terms(kind, b) for kind in kinds]
        self.chain = AssistChain(b, terms, read, local, write, env.now + first_s, env.event())
        done = self.chain.done
        self._book()
        yield done

    def terms(self, kind: str, b: int) -> AssistTerms:
        """The same for every assist of a kind and batch size, so looked up once."""
        found = self._terms.get((kind, b))
        if found is None:
            cost = self.cost
            g, o = cost.assist_gpu(kind, b), cost.assist_o(kind)
            beside = cost.assist_gpu_beside_batch(kind, b)
            act = cost.activation_bytes(b)
            to_gpu, to_host = _ACTIVATIONS[kind]
            found = self._terms[(kind, b)] = AssistTerms(
                kind, g, o + g, beside, o + beside, cost.assist_q_served(kind), to_gpu * act,
                to_host * act)
        return found

    def gpu_moves_on(self) -> None:
        """The GPU worker set up a batch, or is about to wait without one: the chain's next
        assist may now meet that batch, or needs its own wake-up."""
        if self.chain is not None:
            self._book()

    def _book(self) -> None:
        """Book the chain's assists as far as the GPU's timeline is known: each one ready by
        now or meeting the batch set up now. The times are those of booking each assist at
        its ready time: `ready + (resume - ready + read + local + write)` is the sum that a
        timeout per layer computed, added in the same order."""
        c, env, gpu, trace = self.chain, self.env, self.gpu, self.trace
        now, terms, i, ready, resume = env.now, c.terms, c.next, c.ready, c.resume
        read, local, write = c.read, c.local, c.write
        n = len(terms)
        to_gpu = to_host = 0
        while i < n and (ready <= now or gpu.serves_ahead(ready)):
            t = terms[i]
            start, beside = gpu.serve(ready, t.service, t.service_beside)
            g = t.g_beside if beside else t.g
            if trace is not None:
                service = t.service_beside if beside else t.service
                trace.complete(DENSE_ASSIST, _NAMES[t.kind], start, start + service,
                               cpu_batch=c.b, queued_us=round((start - ready) * 1e6, 3))
            resume = start + g + t.q
            to_gpu += t.to_gpu
            to_host += t.to_host
            i += 1
            if i < n:
                ready = ready + (resume - ready + read + local + write)
        self.link.h2d.carry(to_gpu, now)
        self.link.d2h.carry(to_host, now)
        c.next, c.ready, c.resume = i, ready, resume
        if i == n:
            self.chain = None
            env.timeout(resume - now).callbacks.append(c.finish)
        elif not gpu.active and c.wake_for != i:
            c.wake_for = i
            c.wake = env.timeout(ready - now)
            c.wake.callbacks.append(self._wake)

    def _wake(self, event: simpy.Event) -> None:
        """The next assist's ready time came with no GPU batch set up: book it now."""
        c = self.chain
        if c is not None and event is c.wake and c.wake_for == c.next:
            c.ready = self.env.now
            self._book()
