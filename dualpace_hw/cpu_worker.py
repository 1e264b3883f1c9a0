"""The CPU engine's executor in its own process, so the GIL never serializes it behind the GPU.

The runtime's CPU engine thread keeps the scheduling (the core's CpuScheduler, under the
runtime's lock, microseconds per round) and hands each round's `CpuStep` to this process, which
runs the whole decode step — every layer's Python, oneDNN and the C++ attention — on its own
cores. Shared by both processes, in memfd arenas (`shm`): the host KV pool (also CUDA-pinned,
the GPU engine's swaps and Prefill-to-CPU copies land there directly), the CPU engine's copy of
the weights, and the Dense Assist buffers. The pipe carries only small messages:

    parent -> worker: ("step", CpuStep) | ("assisted",) | ("stop",)
    worker -> parent: ("ready", pid) | ("assist", kind, layer, rows)
                      | ("done", tokens, busy_s, assist_s)
                      | ("error", message)

Dense Assist: the worker writes the attention output and residual into the shared buffers and
sends ("assist", ...) (CPU-Ready); the parent's CPU engine thread hands it to the GPU engine,
which serves it at its next stage boundary (GPU-Running), writes the result back and answers
("assisted",) (GPU-Done).

Shutdown: the worker ignores SIGINT (the parent decides), exits when its pipe closes (the
parent died) and is a daemon; the parent stops it with ("stop",), then terminate, then kill.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape

from .cpu_executor import CpuExecutor, CpuStep
from .kv import PagedKVPool
from .model import Model, ModelWeights
from .packed import pack_model
from .shm import ArenaHandle, SharedArena, TensorRef


class WorkerFailed(RuntimeError):
    """The CPU engine's process failed or died; the message says how."""


class WorkerStopped(RuntimeError):
    """The parent stopped the worker in the middle of a step (inside the worker only)."""


@dataclass(frozen=True)
class AssistBuffers:
    """Shared Dense Assist operands and results, rows = the largest CPU batch."""

    attn: TensorRef  # [rows, q_dim] attention output of the CPU batch
    residual: TensorRef  # [rows, H] residual (or the last hidden state, for Split-Final)
    hidden: TensorRef  # [rows, H] post-attention result
    tokens: TensorRef  # [rows] int64 sampled tokens

    @classmethod
    def shapes(cls, shape: ModelShape, rows: int, dtype: torch.dtype) -> list:
        h = shape.hidden_size
        return [((rows, shape.q_dim), dtype), ((rows, h), dtype), ((rows, h), dtype),
                ((rows,), torch.int64)]

    @classmethod
    def allocate(cls, arena: SharedArena, shape: ModelShape, rows: int,
                 dtype: torch.dtype) -> AssistBuffers:
        return cls(*(arena.empty(s, d)[1] for s, d in cls.shapes(shape, rows, dtype)))

    def views(self, arena: SharedArena) -> tuple[torch.Tensor, ...]:
        return tuple(arena.view(r) for r in (self.attn, self.residual, self.hidden, self.tokens))


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the worker needs, all picklable: the weights are arena references."""

    shape: ModelShape
    weights: ModelWeights  # tensors replaced by TensorRef into `weights_arena`
    weights_arena: ArenaHandle
    pool_arena: ArenaHandle  # the host KV pool and the assist buffers
    pool: TensorRef
    block_size: int
    assist: AssistBuffers
    threads: int | None
    cores: tuple[int, ...] | None
    pack: bool


class _RemoteAssist:
    """The worker's side of Dense Assist (the executor's `assist`)."""

    def __init__(self, conn, buffers: tuple[torch.Tensor, ...]) -> None:
        self.conn = conn
        self.attn, self.residual, self.hidden, self.tokens = buffers
        self.waited_s = 0.0  # in assists, end to end, since the last reset

    def _call(self, kind: str, layer: int, attn: torch.Tensor | None,
              residual: torch.Tensor) -> int:
        start = time.perf_counter()
        n = residual.shape[0]
        if attn is not None:
            self.attn[:n].copy_(attn)
        self.residual[:n].copy_(residual)
        self.conn.send(("assist", kind, layer, n))
        reply = self.conn.recv()
        if reply[0] != "assisted":
            raise WorkerStopped(reply[0])
        self.waited_s += time.perf_counter() - start
        return n

    def assist_post_attn(self, layer, attn_out, residual):
        n = self._call("p", layer, attn_out, residual)
        return self.hidden[:n].clone()

    def assist_fused_final(self, layer, attn_out, residual):
        n = self._call("lA", layer, attn_out, residual)
        return self.tokens[:n].tolist()

    def assist_post_layer(self, hidden):
        n = self._call("lS", -1, None, hidden)
        return self.tokens[:n].tolist()


def _worker_main(conn, spec: WorkerSpec) -> None:
    """The CPU engine process: build the executor over shared memory, then serve steps."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        warena, parena = SharedArena.attach(spec.weights_arena), SharedArena.attach(spec.pool_arena)
        model = Model(spec.shape, spec.weights.map(warena.view))
        if spec.pack:
            model = pack_model(model)
        storage = parena.view(spec.pool)
        pool = PagedKVPool(spec.shape, storage.shape[2], spec.block_size, dtype=storage.dtype,
                           storage=storage)
        assist = _RemoteAssist(conn, spec.assist.views(parena))
        ex = CpuExecutor(model, pool, tokens=None, assist=assist, threads=spec.threads,
                         cores=spec.cores)
        ex.configure_thread()
        # Warm-up: load the attention kernel and start the thread team now, not in the first
        # real step. It writes position 0 of block 0; whoever owns block 0 later writes its own
        # tokens there before reading them.
        ex.run(CpuStep(Route.FULL_CPU, [-1], [0], [0], [[0]]))
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            if msg[0] != "step":
                return
            start, assist.waited_s = time.perf_counter(), 0.0
            tokens = ex.run(msg[1])
            conn.send(("done", tokens, time.perf_counter() - start, assist.waited_s))
    except (EOFError, BrokenPipeError, WorkerStopped):
        return  # the parent is gone or stopped us
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


class CpuEngineProcess:
    """The parent's handle on the CPU engine's process and the memory it shares with it.

    `host_pool` is the shared host KV pool (pinned when CUDA is up) for the GPU executor.
    """

    def __init__(
        self,
        weights: ModelWeights,
        shape: ModelShape,
        host_blocks: int,
        block_size: int,
        max_rows: int,
        threads: int | None = None,
        cores: Sequence[int] | None = None,
        pack: bool = True,
        dtype: torch.dtype = torch.bfloat16,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.proc: mp.Process | None = None
        self.conn = None
        self.cores = tuple(cores) if cores else None
        self._warena = SharedArena(SharedArena.bytes_for(
            [(tuple(t.shape), t.dtype) for t in weights.tensors()]), "dualpace-weights")
        dims = PagedKVPool.dims(shape, host_blocks, block_size)
        self._parena = SharedArena(SharedArena.bytes_for(
            [(dims, dtype)] + AssistBuffers.shapes(shape, max_rows, weights.embed.dtype)),
            "dualpace-host-kv")
        try:
            skeleton = weights.map(self._warena.put)
            storage, pool_ref = self._parena.empty(dims, dtype)
            self.host_pool = PagedKVPool(shape, host_blocks, block_size, dtype=dtype,
                                         storage=storage)
            assist = AssistBuffers.allocate(self._parena, shape, max_rows, weights.embed.dtype)
            self.attn, self.residual, self.hidden, self.tokens = assist.views(self._parena)
            self._parena.pin()
            spec = WorkerSpec(shape, skeleton, self._warena.handle(), self._parena.handle(),
                              pool_ref, block_size, assist, threads, self.cores, pack)
            self._start(spec, start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, spec: WorkerSpec, timeout_s: float) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that has CUDA up
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, spec), daemon=True,
                                name="dualpace-cpu-engine")
        self.proc.start()
        child.close()
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.1):
            if not self.proc.is_alive():
                raise WorkerFailed(self._death())
            if time.monotonic() > deadline:
                raise WorkerFailed(f"the CPU engine's process did not start in {timeout_s:.0f} s")
        msg = self._recv()
        if msg[0] != "ready":
            raise WorkerFailed(f"the CPU engine's process did not start: {msg}")
        self.pid = msg[1]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def _death(self) -> str:
        self.proc.join(1.0)
        code = self.proc.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit code {code}")
        return f"the CPU engine's process (pid {self.proc.pid}) died ({how})"

    def _recv(self) -> tuple:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError) as e:
            raise WorkerFailed(self._death()) from e
        if msg[0] == "error":
            raise WorkerFailed(f"the CPU engine's process failed: {msg[1]}")
        return msg

    def step(self, step: CpuStep, assist: Callable[[str, int, int], None],
             stopped: Callable[[], bool]) -> tuple[dict[int, int], float, float]:
        """Run one step in the worker; serve its Dense Assists through `assist(kind, layer,
        rows)`, which reads and writes this object's shared buffers. Returns (tokens, busy_s,
        assist_s): the step's time in the worker, and the part it waited on its assists."""
        self.conn.send(("step", step))
        while True:
            while not self.conn.poll(0.05):
                if stopped():
                    raise WorkerFailed("stopped in the middle of a CPU step")
                if not self.proc.is_alive():
                    raise WorkerFailed(self._death())
            msg = self._recv()
            if msg[0] == "done":
                return msg[1], msg[2], msg[3]
            _, kind, layer, rows = msg
            assist(kind, layer, rows)
            self.conn.send(("assisted",))

    def close(self) -> None:
        """Stop the worker (politely, then not) and release the shared memory. Idempotent."""
        if self.proc is not None:
            if self.proc.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    self.conn.send(("stop",))
                self.proc.join(5.0)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(2.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
            self.proc = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        for arena in ("_warena", "_parena"):
            if hasattr(self, arena):
                getattr(self, arena).close()
