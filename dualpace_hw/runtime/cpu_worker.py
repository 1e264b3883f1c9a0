"""The CPU engine's executor in its own process, so the GIL never serializes it behind the GPU.

The runtime's CPU engine thread keeps the scheduling (the core's CpuScheduler, under the
runtime's lock, microseconds per round) and hands each round's `CpuStep` to this process, which
runs the whole decode step — every layer's Python, the dense kernel and the C++ attention — on
its own cores. Shared by both processes, in memfd arenas (`shm`): the host KV pool (also
CUDA-pinned, the GPU engine's swaps and Prefill-to-CPU copies land there directly), the CPU
engine's copy of the weights, and the Dense Assist control block and buffers. The pipe carries
one message per step each way:

    parent -> worker: ("step", CpuStep, rows) | ("stop",)   (rows: sampling.Row per request)
    worker -> parent: ("ready", pid) | ("done", tokens, busy_s, assist_s, phases)
                      | ("error", message)

Dense Assist goes through the shared control block (`AssistBlock`), as in the paper: the worker
writes the attention output and residual into the shared buffers and sets CPU-Ready; the GPU
engine's thread polls the block at its stage boundaries, sets GPU-Running, runs the stage,
writes the result back and sets GPU-Done; the worker spins on the block meanwhile (on its own
cores). No thread hand-off and no pipe on this path.

CPU tensor parallelism (`tp` > 1): the CPU engine is several such processes, one per rank,
each on its own cores with its shard of the weights (`tp`), joined over Gloo; they share the one
host pool and each touches only its KV heads, and Dense Assist is rank-sharded: each rank writes
its heads' columns of the attention output, rank 0 publishes the request.

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
import torch.distributed as dist

from dualpace_hw.executors.cpu_executor import CpuExecutor, CpuStep, StepPhases
from dualpace_hw.executors.model import LayerWeights, Model, ModelWeights
from dualpace_hw.executors.packed import pack_model
from dualpace_hw.executors.sampling import Sampler, SamplingModel
from dualpace_hw.executors.tp import all_reduce, shard_shape, shard_weights
from dualpace_hw.hostinfo import rank_cores
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.shm import ArenaHandle, SharedArena, TensorRef
from dualpace_hw.runtime.collector import ServingCollector
from dualpace_hw.runtime.processes import forget, gloo_rendezvous, spawn, stop
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape


class WorkerFailed(RuntimeError):
    """The CPU engine's process failed or died; the message says how."""


class WorkerStopped(RuntimeError):
    """The parent stopped the worker in the middle of a step (inside the worker only)."""


# Control block slots and states (the paper's Dense Assist states).
_STATE, _KIND, _LAYER, _ROWS, _READY_NS = range(5)
IDLE, CPU_READY, GPU_RUNNING, GPU_DONE, STOPPED = range(5)
ASSIST_KINDS = ("p", "lA", "lS")  # post-attention, fused final, post-layer (Split-Final)
_NAP_S = 50e-6  # past its spin budget, the CPU engine checks the block every ~50 us


@dataclass(frozen=True)
class AssistBuffers:
    """Where the shared Dense Assist control block and buffers are (rows = largest CPU batch)."""

    ctrl: TensorRef  # int64 [5]: state, kind, layer, rows, CPU-Ready time (ns, monotonic)
    attn: TensorRef  # [rows, q_dim] attention output of the CPU batch
    residual: TensorRef  # [rows, H] residual (or the last hidden state, for Split-Final)
    hidden: TensorRef  # [rows, H] post-attention result
    tokens: TensorRef  # [rows] int64 sampled tokens

    @classmethod
    def shapes(cls, shape: ModelShape, rows: int, dtype: torch.dtype) -> list:
        h = shape.hidden_size
        return [((5,), torch.int64), ((rows, shape.q_dim), dtype), ((rows, h), dtype),
                ((rows, h), dtype), ((rows,), torch.int64)]

    @classmethod
    def allocate(cls, arena: SharedArena, shape: ModelShape, rows: int,
                 dtype: torch.dtype) -> AssistBuffers:
        return cls(*(arena.empty(s, d)[1] for s, d in cls.shapes(shape, rows, dtype)))

    def block(self, arena: SharedArena, spin_s: float = 0.0) -> AssistBlock:
        views = [arena.view(r) for r in (self.ctrl, self.attn, self.residual, self.hidden,
                                         self.tokens)]
        return AssistBlock(*views, spin_s=spin_s)


class AssistBlock:
    """The Dense Assist control block and its operands, the same bytes in both processes.

    x86 keeps stores in order, so operands written before the state store are visible to the
    other process once it sees the new state."""

    def __init__(self, ctrl: torch.Tensor, attn: torch.Tensor, residual: torch.Tensor,
                 hidden: torch.Tensor, tokens: torch.Tensor, spin_s: float = 0.0) -> None:
        """spin_s: how long the CPU engine spins on a request before napping between checks;
        spinning is polite only on cores of its own."""
        self.ctrl = ctrl.numpy()  # plain loads and stores, ~100 ns from Python
        self.spin_s = spin_s
        self.attn, self.residual, self.hidden, self.tokens = attn, residual, hidden, tokens

    # --- the CPU engine's side ---------------------------------------------------------------
    def request(self, kind: str, layer: int, rows: int, parent_gone: Callable[[], bool]) -> None:
        """Publish CPU-Ready and spin until GPU-Done (operands already in the buffers)."""
        c = self.ctrl
        c[_KIND], c[_LAYER], c[_ROWS] = ASSIST_KINDS.index(kind), layer, rows
        c[_READY_NS] = time.perf_counter_ns()
        c[_STATE] = CPU_READY
        spins, spin_until = 0, time.perf_counter() + self.spin_s
        while c[_STATE] != GPU_DONE:
            if c[_STATE] == STOPPED:
                raise WorkerStopped("stopped during a Dense Assist")
            spins += 1
            if spins % 256 == 0:
                if parent_gone():
                    raise WorkerStopped("the parent went away during a Dense Assist")
                if time.perf_counter() > spin_until:
                    time.sleep(_NAP_S)  # a long wait: give the core back now and then
        c[_STATE] = IDLE

    # --- the GPU engine's side ---------------------------------------------------------------
    def ready(self) -> bool:
        return self.ctrl[_STATE] == CPU_READY

    def take(self) -> tuple[str, int, int, float]:
        """GPU-Running: (kind, layer, rows, seconds it waited for this stage boundary)."""
        c = self.ctrl
        c[_STATE] = GPU_RUNNING
        waited = (time.perf_counter_ns() - int(c[_READY_NS])) / 1e9
        return ASSIST_KINDS[int(c[_KIND])], int(c[_LAYER]), int(c[_ROWS]), waited

    def done(self) -> None:
        self.ctrl[_STATE] = GPU_DONE

    def stop(self) -> None:
        self.ctrl[_STATE] = STOPPED


@dataclass(frozen=True)
class HostShare:
    """Where the shared host KV pool and assist buffers are, for the GPU engine's other
    tensor-parallel ranks (picklable)."""

    arena: ArenaHandle
    pool: TensorRef
    assist: AssistBuffers


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
    rank: int = 0  # CPU tensor parallelism: this rank of `world`, joined over Gloo
    world: int = 1
    rendezvous: str | None = None  # a file path for Gloo's rendezvous when world > 1


class _RemoteAssist:
    """The worker's side of Dense Assist (the executor's `assist`), over the control block.

    Under CPU tensor parallelism every rank writes its heads' columns of the attention output
    into the shared buffer; rank 0 also writes the residual (the same on every rank), publishes
    the request once all ranks have written, and all ranks read the result once it is done."""

    def __init__(self, block: AssistBlock, conn, rank: int = 0, world: int = 1) -> None:
        self.b, self.conn, self.rank, self.world = block, conn, rank, world
        self.waited_s = 0.0  # in assists, end to end, since the last reset

    def _call(self, kind: str, layer: int, attn: torch.Tensor | None,
              residual: torch.Tensor) -> int:
        start = time.perf_counter()
        n = residual.shape[0]
        if attn is not None:
            width = attn.shape[1]
            self.b.attn[:n, self.rank * width:(self.rank + 1) * width].copy_(attn)
        if self.rank == 0:
            self.b.residual[:n].copy_(residual)
        if self.world > 1:
            dist.barrier()  # every rank's columns are in
        if self.rank == 0:
            self.b.request(kind, layer, n, self.conn.poll)  # a message mid-step: stop, or EOF
        if self.world > 1:
            dist.barrier()  # the result is in
        self.waited_s += time.perf_counter() - start
        return n

    def assist_post_attn(self, layer, attn_out, residual):
        n = self._call("p", layer, attn_out, residual)
        return self.b.hidden[:n].clone()

    def assist_fused_final(self, layer, attn_out, residual):
        n = self._call("lA", layer, attn_out, residual)
        return self.b.tokens[:n].tolist()

    def assist_post_layer(self, hidden):
        n = self._call("lS", -1, None, hidden)
        return self.b.tokens[:n].tolist()


def _worker_main(conn, spec: WorkerSpec) -> None:
    """The CPU engine process: build the executor over shared memory, then serve steps."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        warena, parena = SharedArena.attach(spec.weights_arena), SharedArena.attach(spec.pool_arena)
        weights, shape, reduce = spec.weights.map(warena.view), spec.shape, None
        storage = parena.view(spec.pool)
        if spec.world > 1:  # this rank's heads and MLP columns; its heads of the host pool
            dist.init_process_group("gloo", init_method=f"file://{spec.rendezvous}",
                                    rank=spec.rank, world_size=spec.world)
            weights = shard_weights(weights, shape, spec.rank, spec.world)
            shape, reduce = shard_shape(shape, spec.world), all_reduce()
            kvh = shape.n_kv_heads
            storage = storage[:, :, :, spec.rank * kvh:(spec.rank + 1) * kvh]
        model = Model(shape, weights, reduce)
        del weights
        if spec.world > 1:
            dist.barrier()  # every rank has copied its shard out of the shared weights
        sharded = spec.world > 1

        def release(i: int, packed: LayerWeights) -> None:
            """Give back a layer's shared projections once this process has its own copy."""
            for name in ("qkv", "o", "gate_up", "down"):
                if sharded or getattr(getattr(packed, name), "is_packed", False):
                    warena.release(getattr(spec.weights.layers[i], name).weight)

        if spec.pack:
            model = pack_model(model, on_layer=release)
        elif sharded:
            for i, lw in enumerate(model.w.layers):
                release(i, lw)
        head = spec.weights.lm_head.weight
        if head is not spec.weights.embed and getattr(model.w.lm_head, "is_packed", False):
            if sharded:
                dist.barrier()  # the head is replicated: every rank has packed it from here
            warena.release(head)  # an untied LM head, repacked
        model = SamplingModel(model)  # its post-layer samples the rows each step names
        pool = PagedKVPool(shape, storage.shape[2], spec.block_size, dtype=storage.dtype,
                           storage=storage)
        # Spin on the assist block only on cores of our own (the runtime's --cpu-cores).
        block = spec.assist.block(parena, 0.002 if spec.cores else 0.0)
        assist = _RemoteAssist(block, conn, spec.rank, spec.world)
        ex = CpuExecutor(model, pool, tokens=None, assist=assist, threads=spec.threads,
                         cores=spec.cores)
        ex.configure_thread()
        # Warm-up: load the attention kernel and start the thread team now, not in the first
        # real step. It writes position 0 of block 0; whoever owns block 0 later writes its own
        # tokens there before reading them.
        ex.run(CpuStep(Route.FULL_CPU, [-1], [0], [0], [[0]]))
        conn.send(("ready", os.getpid()))
        with ServingCollector():  # a full collection would stall a step, as the GPU engine's
            while True:
                msg = conn.recv()
                if msg[0] != "step":
                    return
                start, assist.waited_s = time.perf_counter(), 0.0
                model.rows = msg[2]
                tokens = ex.run(msg[1])
                conn.send(("done", tokens, time.perf_counter() - start, assist.waited_s,
                           ex.phases))
    except (EOFError, BrokenPipeError, WorkerStopped):
        return  # the parent is gone or stopped us
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


@dataclass(frozen=True, slots=True)
class StepDone:
    """One CPU step as the engine's process ran it (its slowest rank's times)."""

    tokens: dict[int, int]  # req_id -> sampled token
    busy_s: float  # the whole step
    assist_s: float  # of it, waiting on Dense Assists end to end
    phases: StepPhases  # where the step's time went


class CpuEngineProcess:
    """The parent's handle on the CPU engine's process(es) and the memory it shares with them.

    `host_pool` is the shared host KV pool (pinned when CUDA is up) for the GPU executor.
    With `tp` > 1 the CPU engine is `tp` tensor-parallel ranks, each a process on its share of
    `cores`, joined over Gloo; they share the one host pool, each reading and writing its own
    KV heads, so migrations need no sharding. Each step goes to every rank; the step takes as
    long as its slowest rank (rank-critical time) and every rank samples the same tokens.
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
        tp: int = 1,
    ) -> None:
        self.procs: list[mp.Process] = []
        self.conns: list = []
        self.sampler: Sampler | None = None  # the runtime's, for requests that sample
        self.cores = tuple(cores) if cores else None
        self.tp = tp
        if tp > 1:
            shard_shape(shape, tp)  # the heads must split: fail here, not in the ranks
            if self.cores is not None and len(self.cores) < tp:
                raise ValueError(f"{tp} CPU ranks need at least {tp} cores, got {len(cores)}")
        self._warena = SharedArena(SharedArena.bytes_for(
            [(tuple(t.shape), t.dtype) for t in weights.tensors()]), "dualpace-weights")
        dims = PagedKVPool.dims(shape, host_blocks, block_size)
        self._parena = SharedArena(SharedArena.bytes_for(
            [(dims, dtype)] + AssistBuffers.shapes(shape, max_rows, weights.embed.dtype)),
            "dualpace-host-kv")
        self._rendezvous = None
        try:
            skeleton = weights.map(self._warena.put)
            storage, pool_ref = self._parena.empty(dims, dtype)
            self.host_pool = PagedKVPool(shape, host_blocks, block_size, dtype=dtype,
                                         storage=storage)
            assist = AssistBuffers.allocate(self._parena, shape, max_rows, weights.embed.dtype)
            self.assist = assist.block(self._parena)
            self.share = HostShare(self._parena.handle(), pool_ref, assist)
            self._parena.pin()
            if tp > 1:
                self._rendezvous = gloo_rendezvous()
            ranges = rank_cores(list(self.cores), tp) if self.cores else None
            for rank in range(tp):
                # each rank its own cores, within one NUMA node where the box has several
                mine = ranges[rank] if ranges else None
                rank_threads = threads or (None if mine or tp == 1
                                           else max(1, (os.cpu_count() or tp) // tp))
                spec = WorkerSpec(shape, skeleton, self._warena.handle(), self._parena.handle(),
                                  pool_ref, block_size, assist, rank_threads, mine, pack,
                                  rank, tp, self._rendezvous)
                self._spawn(spec)
            self.pids = [self._ready(i, start_timeout_s) for i in range(tp)]
            self.pid = self.pids[0]
        except BaseException:
            self.close()
            raise

    def _spawn(self, spec: WorkerSpec) -> None:
        proc, conn = spawn(_worker_main, spec, f"dualpace-cpu-engine-{spec.rank}")
        self.procs.append(proc)
        self.conns.append(conn)

    def _ready(self, i: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while not self.conns[i].poll(0.1):
            if not self.procs[i].is_alive():
                raise WorkerFailed(self._death(i))
            if time.monotonic() > deadline:
                raise WorkerFailed(f"the CPU engine's process did not start in {timeout_s:.0f} s")
        msg = self._recv(i)
        if msg[0] != "ready":
            raise WorkerFailed(f"the CPU engine's process did not start: {msg}")
        return msg[1]

    @property
    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def _death(self, i: int) -> str:
        proc = self.procs[i]
        proc.join(1.0)
        code = proc.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit code {code}")
        rank = f" rank {i}" if self.tp > 1 else ""
        return f"the CPU engine's process{rank} (pid {proc.pid}) died ({how})"

    def _recv(self, i: int) -> tuple:
        try:
            msg = self.conns[i].recv()
        except (EOFError, OSError) as e:
            raise WorkerFailed(self._death(i)) from e
        if msg[0] == "error":
            raise WorkerFailed(f"the CPU engine's process failed: {msg[1]}")
        return msg

    def step(self, step: CpuStep, stopped: Callable[[], bool]) -> StepDone:
        """Run one step on every rank (Dense Assists go through `self.assist`, served by the
        GPU engine); its times are the slowest rank's."""
        sampler = self.sampler
        rows = None if sampler is None else sampler.rows(
            step.req_ids, [p + 1 for p in step.positions])  # the sampled tokens' positions
        if sampler is not None:
            sampler.cpu_rows = rows  # the step's Dense Assists sample them on the GPU
        try:
            return self._step(step, rows, stopped)
        finally:
            if sampler is not None:
                sampler.cpu_rows = None

    def _step(self, step: CpuStep, rows, stopped: Callable[[], bool]) -> StepDone:
        for conn in self.conns:
            conn.send(("step", step, rows))
        results = []
        for i, conn in enumerate(self.conns):
            while not conn.poll(0.05):
                if stopped():
                    raise WorkerFailed("stopped in the middle of a CPU step")
                dead = next((j for j, p in enumerate(self.procs) if not p.is_alive()), None)
                if dead is not None:
                    raise WorkerFailed(self._death(dead))
            results.append(self._recv(i)[1:])
        tokens = results[0][0]
        if any(r[0] != tokens for r in results[1:]):
            raise WorkerFailed("the CPU engine's ranks sampled different tokens")
        _, busy_s, assist_s, phases = max(results, key=lambda r: r[1])
        return StepDone(tokens, busy_s, assist_s, phases)

    def close(self) -> None:
        """Stop the workers (politely, then not) and release the shared memory. Idempotent."""
        if self.procs and hasattr(self, "assist"):
            self.assist.stop()  # a worker spinning on an assist lets go
        stop(self.procs, self.conns)
        self.procs, self.conns = [], []
        forget(self._rendezvous)
        self._rendezvous = None
        for arena in ("_warena", "_parena"):
            if hasattr(self, arena):
                getattr(self, arena).close()
