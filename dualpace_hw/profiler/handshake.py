"""Dense Assist through the runtime's own control path: q_x and o_x as Eq. 14 means them.

The assist tables g_x(b) are the CUDA time of one assist called in-process. Serving adds the
runtime's control path around that: the CPU engine publishes CPU-Ready in the shared control
block, the GPU engine's thread takes it, launches the stage, copies the result into the shared
buffer and publishes GPU-Done, and the CPU engine sees it. q_x and o_x are that path's cost, so
they are measured on it: a client process on the CPU engine's cores publishes requests through
an `AssistBlock` in a shared (CUDA-pinned) arena, spinning on it as the CPU engine's process
does, and this process serves them with the runtime's `AssistServer` on the cores left, as the
GPU engine's thread does at a stage boundary. Per assist kind, averaged over the profiled CPU
batch sizes:

* q_x = the client's CPU-Ready -> GPU-Done wait less g_x(b): the CPU-visible wait beyond g;
* o_x = the server's GPU-Running -> GPU-Done wall less g_x(b): the GPU-main time it displaces
  beyond g.

Neither holds the wait for a stage boundary, nor for the stage the GPU engine keeps queued
ahead: the simulator places assists itself (sim/gpu.py). On the H200 box the path costs
2-10 us beyond g, so the 0.9 ms by which serving's assists outlast their CUDA time
(docs/validation) is not the handshake.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.memory.shm import ArenaHandle, SharedArena
from dualpace_hw.runtime.cpu_worker import ASSIST_KINDS, AssistBuffers
from dualpace_hw.runtime.processes import on_cores, spawn, stop
from dualpace_sim.costs.shapes import ModelShape


@dataclass(frozen=True)
class _ClientSpec:
    arena: ArenaHandle
    buffers: AssistBuffers
    plan: tuple[tuple[str, int], ...]  # (kind, rows), each `warmups + repeats` times
    warmups: int
    repeats: int
    cores: tuple[int, ...] | None


def _client_main(conn, spec: _ClientSpec) -> None:
    """The CPU engine's side: publish each request and spin until GPU-Done, timing each."""
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    arena = SharedArena.attach(spec.arena)
    block = spec.buffers.block(arena, spin_s=0.002)  # as the CPU engine's process spins
    waits = []
    for kind, rows in spec.plan:
        times = []
        for _ in range(spec.warmups + spec.repeats):
            start = time.perf_counter()
            block.request(kind, 0, rows, conn.poll)
            times.append(time.perf_counter() - start)
        waits.append(statistics.median(times[spec.warmups:]))
    conn.send(("waits", waits))
    conn.recv()  # hold the mapping until the server is done with it


@dataclass(frozen=True)
class Handshake:
    """Per assist kind: the CPU-visible wait (q) and the GPU-side service (o) beyond g."""

    q: dict[str, float]
    o: dict[str, float]


def measure_handshake(shape: ModelShape, ex: GpuExecutor, batches: Sequence[int],
                      g: dict[str, list[float]], client_cores: Sequence[int] | None,
                      server_cores: Sequence[int] | None, warmups: int = 5,
                      repeats: int = 30, timeout_s: float = 300.0) -> Handshake:
    """Time every (kind, b) through the control block; `g[kind]` are g_x(b) for `batches`.

    `ex` serves layer 0 (the profile's one decoder layer). The client runs on `client_cores`
    (the CPU engine's), this thread on `server_cores` while it serves."""
    from dualpace_hw.runtime.assist_server import AssistServer  # the runtime's own server
    from dualpace_hw.runtime.engines import Engines

    plan = tuple((kind, b) for kind in ASSIST_KINDS for b in batches)
    arena = SharedArena(SharedArena.bytes_for(
        AssistBuffers.shapes(shape, max(batches), torch.bfloat16)), "dualpace-handshake")
    try:
        buffers = AssistBuffers.allocate(arena, shape, max(batches), torch.bfloat16)
        block = buffers.block(arena)
        for t in (block.attn, block.residual, block.hidden):
            t.copy_(torch.randn(t.shape, dtype=t.dtype))
        if ex.cuda:
            arena.pin()
        server = AssistServer(block, Engines([], 16, shape.vocab_size))
        proc, conn = spawn(_client_main, _ClientSpec(
            arena.handle(), buffers, plan, warmups, repeats,
            tuple(client_cores) if client_cores else None), "dualpace-handshake")
        try:
            service = _serve(server, ex, conn, proc, len(plan) * (warmups + repeats), timeout_s,
                             server_cores)
            waits = conn.recv()[1]
        finally:
            stop([proc], [conn])
    finally:
        arena.close()
    per = warmups + repeats
    q: dict[str, list[float]] = {k: [] for k in ASSIST_KINDS}
    o: dict[str, list[float]] = {k: [] for k in ASSIST_KINDS}
    for i, (kind, b) in enumerate(plan):
        g_b = g[kind][list(batches).index(b)]
        q[kind].append(max(waits[i] - g_b, 0.0))
        o[kind].append(max(statistics.median(service[i * per + warmups:(i + 1) * per]) - g_b,
                           0.0))
    return Handshake({k: statistics.mean(v) for k, v in q.items()},
                     {k: statistics.mean(v) for k, v in o.items()})


def _serve(server, ex: GpuExecutor, conn, proc, calls: int, timeout_s: float,
           cores: Sequence[int] | None) -> list[float]:
    """Serve `calls` assists as they come, polling flat out; each one's service wall."""
    service: list[float] = []
    deadline = time.monotonic() + timeout_s
    with on_cores(cores), torch.inference_mode():
        while len(service) < calls:
            before = server.service_s
            if server.serve(ex):
                service.append(server.service_s - before)
                continue
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError(
                    f"the Dense Assist handshake client stopped after {len(service)} of "
                    f"{calls} assists (exit code {proc.exitcode})")
    if not conn.poll(timeout_s):
        raise RuntimeError("the Dense Assist handshake client sent no timings")
    return service
