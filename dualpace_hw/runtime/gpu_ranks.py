"""GPU tensor parallelism in the runtime: one GPU engine spread over N ranks, one GPU each.

Rank 0 is the runtime's own GPU engine thread (`LeadExecutor`): it schedules, as with one GPU,
and every other rank is a process (`_rank_main`) that runs the same rounds on its shard of the
weights and of the HBM KV pool (its KV heads), joined over NCCL (Gloo on the CPU device, for
the tests). The ranks run in lockstep through a pipe per rank that carries rank 0's calls as
plain data:

    rank 0 -> rank r: "round" (whole?; the Round follows by pipe) | "s" | "end"
                      | "a" (kind, layer, rows) | "copies" | "warm" | "graph" (rows, width)
                      | "stop", in a shared-memory ring they spin on (command_ring.py)
    rank r -> rank 0: ("ready", pid) | ("ok", tokens) | ("copies", done) | ("error", message),
                      by pipe (rank 0 waits on these anyway)

A round is sent before rank 0 runs it and each stage is released as rank 0 issues its own, so
every rank issues the same collectives in the same order, Dense Assists included: rank 0
decides at each stage boundary whether to serve one, and the other ranks learn it in the same
stream of messages. A round with no Dense Assist to interleave (vLLM's, the warm-up) is sent
whole: the other ranks run all its stages on receipt. At the round's end every rank reports its
sampled tokens (the same on every rank; checked) after its swaps landed, so the round's
migrations are complete on every rank when rank 0 reports them to the core.

Migrations and Prefill-to-CPU copies are rank-sharded: the host KV pool is the CPU engine's
one shared pool, and each rank copies its own KV heads of each page over its own PCIe link
(`PagedKVPool.heads`). Dense Assist: the other ranks read their heads' columns of the CPU
batch's attention output from the shared assist buffers and join rank 0's post-attention
all-reduces; the post-layer is replicated, so only rank 0 runs it and writes the results.

Shutdown: every rank releases its CUDA graphs, then leaves the process group, each within a
time limit, and the processes are stopped. NCCL's teardown waits until every graph that
captured one of its all-reduces is gone: on the 2-GPU box, with the decode graphs still held,
every rank hung there at the end of a finished run. A rank that dies ends the run with its
name, also when rank 0 is blocked in a collective with it (the runtime's main thread watches
the processes).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dualpace_hw.executors.gpu import Forward, GpuExecutor, Round
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.tp import all_reduce, shard_shape, shard_weights
from dualpace_hw.memory.command_ring import CommandRing, RingReader, RingRefs
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.migrate import CopyHandle
from dualpace_hw.memory.shm import SharedArena
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.runtime.cpu_worker import ASSIST_KINDS, HostShare, WorkerFailed
from dualpace_hw.runtime.processes import forget, gloo_rendezvous, spawn, stop
from dualpace_sim.core.plans import BlockMoves, GpuPlan
from dualpace_sim.costs.shapes import ModelShape

_TIMEOUT = datetime.timedelta(minutes=5)  # a collective that long means a rank is gone


@dataclass(frozen=True)
class RankSpec:
    shape: ModelShape  # the full model's
    skeleton: ModelWeights  # the shard's (shape, dtype) in place of each tensor
    rank: int
    world: int
    device: str
    rendezvous: str
    gpu_blocks: int
    block_size: int
    dtype: torch.dtype
    host: HostShare | None  # None: vLLM, no host tier
    cores: tuple[int, ...] | None  # off the CPU engine's cores, as rank 0 keeps
    commands: RingRefs  # rank 0's command ring


def _group(device: torch.device, rank: int, world: int, rendezvous: str) -> None:
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}",
                            rank=rank, world_size=world, timeout=_TIMEOUT,
                            device_id=device if cuda else None)


def _rank_main(conn, spec: RankSpec) -> None:
    """A GPU rank other than 0: build its shard, then run what rank 0 sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    try:
        if spec.cores:
            os.sched_setaffinity(0, spec.cores)
            torch.set_num_threads(len(spec.cores))
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _group(device, spec.rank, spec.world, spec.rendezvous)
        weights = spec.skeleton.map(lambda sd: torch.empty(sd[0], dtype=sd[1], device=device))
        for t in weights.tensors():
            dist.recv(t, src=0)
        shard = shard_shape(spec.shape, spec.world)
        model = Model(shard, weights, all_reduce())
        pool = PagedKVPool(shard, spec.gpu_blocks, spec.block_size, device, dtype=spec.dtype)
        host_pool, block = None, None
        if spec.host is not None:
            arena = SharedArena.attach(spec.host.arena)
            if device.type == "cuda":
                arena.pin()
            full = PagedKVPool(spec.shape, spec.host.pool.shape[2], spec.block_size,
                               dtype=spec.dtype, storage=arena.view(spec.host.pool))
            host_pool = full.heads(shard, spec.rank)
            block = spec.host.assist.block(arena)
        ex = GpuExecutor(model, pool, TokenStore(), host_pool, rank=spec.rank)
        parent = os.getppid()
        commands = RingReader(spec.commands, spec.rank - 1, 0.002 if spec.cores else 0.0)
        conn.send(("ready", os.getpid()))
        _serve(commands, lambda: os.getppid() != parent, conn, ex, block)
        ex.release_graphs()  # before leaving: a graph holding an all-reduce holds the group
        _leave_group()
    except (EOFError, BrokenPipeError):
        return  # rank 0 is gone
    except BaseException as e:  # noqa: BLE001 - reported to rank 0
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


def _serve(commands: RingReader, rank_0_gone: Callable[[], bool], conn, ex: GpuExecutor,
           block) -> None:
    rnd: Round | None = None
    fw: Forward | None = None
    stage = 0
    while True:
        what, a, b, c = commands.take(rank_0_gone)
        if what == "round":
            rnd, stage = conn.recv(), 0
            fw = ex.forward(rnd) if rnd.flat is not None else None
            if fw is None:
                ex.migrate_round(rnd)
            elif a:  # a whole round: no Dense Assist between its stages
                for s in fw.stages:
                    s()
                stage = len(fw.stages)
        elif what == "s":
            fw.stages[stage]()
            stage += 1
        elif what == "end":
            tokens = fw.result() if fw is not None else {}
            if rnd.has_migrations and ex.swap_handle is not None:
                ex.swap_handle.wait()
            conn.send(("ok", tokens))
            rnd, fw = None, None
        elif what == "a":
            kind, layer, rows = ASSIST_KINDS[a], b, c
            if kind != "lS":  # the post-layer is replicated: rank 0 alone runs it
                q = ex.shape.q_dim
                ex.join_assist(layer, block.attn[:rows, ex.rank * q:(ex.rank + 1) * q],
                               block.residual[:rows])
        elif what == "copies":
            conn.send(("copies", ex.copies_done()))
        elif what == "warm":
            ex.warm_kernels()
        elif what == "graph":  # rank 0's choice and order: a capture's warm-up all-reduces
            ex.capture_graph((a, b))
        else:
            return


def _split_cores(world: int, cpu_engine_cores: tuple[int, ...] | None
                 ) -> tuple[tuple[int, ...] | None, list[tuple[int, ...] | None]]:
    """(rank 0's process's cores, each other rank's): the cores off the CPU engine's, split
    so that no two GPU ranks' processes share one. Their OpenMP teams must not overlap: a
    team spinning on another process's cores turns every small CPU copy into milliseconds
    (on the 2-GPU box every Dense Assist of 8 rows or more took 10-20 ms)."""
    if not hasattr(os, "sched_getaffinity"):
        return None, [None] * (world - 1)
    free = sorted(os.sched_getaffinity(0) - set(cpu_engine_cores or ()))
    if len(free) < world:
        return None, [None] * (world - 1)
    per = len(free) // world
    others = [tuple(free[r * per:(r + 1) * per]) for r in range(1, world)]
    return tuple(free[:per] + free[world * per:]), others


def _leave_group(wait_s: float = 30.0) -> bool:
    """Leave the process group, giving up after `wait_s`; True if left. Every rank's rounds
    are over by then, so nothing is lost by not finalizing: under NCCL the communicators are
    aborted, which needs no other rank (one may have died). Abort clears the group as destroy
    does, so the next policy's run can form a new one. The executor's CUDA graphs must be
    released first: NCCL's teardown waits until every graph that captured one of its
    collectives is destroyed (pytorch#115388). On the 2-GPU box, with the graphs still held,
    both destroy and abort hung on every rank at the end of a finished run."""
    done = threading.Event()
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)  # torch >= 2.4
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"

    def leave() -> None:
        with contextlib.suppress(Exception):
            (abort if nccl and abort is not None else dist.destroy_process_group)()
        done.set()

    threading.Thread(target=leave, daemon=True, name="leave-group").start()
    return done.wait(wait_s)


class _Peers:
    """Rank 0's handle on the other ranks' processes and pipes."""

    def __init__(self, shape: ModelShape, weights: ModelWeights, world: int, device: torch.device,
                 gpu_blocks: int, block_size: int, dtype: torch.dtype,
                 host: HostShare | None, cores: list[tuple[int, ...] | None]) -> None:
        self.procs, self.conns = [], []
        self.rendezvous = gloo_rendezvous()
        self.commands = CommandRing(world - 1)
        self.grouped = False
        cuda = device.type == "cuda"
        if cuda and torch.cuda.device_count() < world:
            raise ValueError(f"GPU tensor parallelism {world} needs {world} GPUs; this box has "
                             f"{torch.cuda.device_count()}")
        try:
            # the shards' shapes, from meta tensors: no rank's shard exists twice on rank 0
            meta = weights.map(lambda t: torch.empty_like(t, device="meta"))
            for r in range(1, world):
                skeleton = shard_weights(meta, shape, r, world).map(
                    lambda t: (tuple(t.shape), t.dtype))
                spec = RankSpec(shape, skeleton, r, world, f"cuda:{r}" if cuda else "cpu",
                                self.rendezvous, gpu_blocks, block_size, dtype, host,
                                cores[r - 1], self.commands.refs)
                proc, conn = spawn(_rank_main, spec, f"dualpace-gpu-rank-{r}")
                self.procs.append(proc)
                self.conns.append(conn)
            self._join(device, world)
            for r in range(1, world):
                for t in shard_weights(weights, shape, r, world).tensors():
                    dist.send(t.contiguous(), dst=r)
            self.pids = [self._recv(i, "ready")[1] for i in range(len(self.conns))]
        except BaseException:
            self.close()
            raise

    def _join(self, device: torch.device, world: int) -> None:
        """Join the group, watching the other ranks meanwhile: a rank that dies before it
        joins would leave rank 0 waiting in the rendezvous for the whole timeout."""
        failure: list[BaseException] = []

        def join() -> None:
            try:
                _group(device, 0, world, self.rendezvous)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                failure.append(e)

        joiner = threading.Thread(target=join, daemon=True, name="gpu-rank-0-join")
        joiner.start()
        while joiner.is_alive():
            joiner.join(0.05)
            for i, conn in enumerate(self.conns):
                if conn.poll():
                    self._recv(i, "joined")  # raises with the rank's error
                if not self.procs[i].is_alive():
                    self._recv(i, "joined")
        if failure:
            raise failure[0]
        self.grouped = True

    def _recv(self, i: int, expect: str) -> tuple:
        try:
            msg = self.conns[i].recv()
        except (EOFError, OSError) as e:
            self.procs[i].join(1.0)
            raise WorkerFailed(f"GPU rank {i + 1} (pid {self.procs[i].pid}) died (exit code "
                               f"{self.procs[i].exitcode})") from e
        if msg[0] == "error":
            raise WorkerFailed(f"GPU rank {i + 1} failed: {msg[1]}")
        if msg[0] != expect:
            raise WorkerFailed(f"GPU rank {i + 1} answered {msg[0]!r}, not {expect!r}")
        return msg

    def send(self, op: str, *args: int) -> None:
        """A command to every other rank, through the ring."""
        self.commands.write(op, *args, readers_alive=lambda: self.dead() is None)

    def send_round(self, rnd: Round, whole: bool) -> None:
        for conn in self.conns:
            conn.send(rnd)  # before its command: a rank reads it when it takes the command
        self.send("round", int(whole))

    def end(self, tokens: dict[int, int]) -> None:
        """Close a round: every rank finished it, swaps landed, same tokens as rank 0."""
        self.send("end")
        for i in range(len(self.conns)):
            theirs = self._recv(i, "ok")[1]
            if theirs != tokens:
                raise WorkerFailed(f"GPU rank {i + 1} sampled other tokens than rank 0")

    def copies_done(self) -> bool:
        self.send("copies")
        return all([self._recv(i, "copies")[1] for i in range(len(self.conns))])

    def dead(self) -> str | None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                return f"GPU rank {i + 1} (pid {p.pid}) died (exit code {p.exitcode})"
        return None

    def close(self) -> None:
        """Every rank leaves the group together (ranks get "stop", then all destroy it), then
        the processes are stopped (asked, terminated, killed)."""
        if self.grouped:
            self.grouped = False
            if self.dead() is None:
                with contextlib.suppress(EOFError):
                    self.send("stop")
            left = _leave_group()
            if not left:
                print("warning: the GPU ranks' process group did not shut down in 30 s; "
                      "leaving it", file=sys.stderr)
        stop(self.procs, self.conns)
        self.procs, self.conns = [], []
        forget(self.rendezvous)
        self.commands.close()


class _JointHandle(CopyHandle):
    """A migration-only round's swaps on every rank: waiting waits for all of them."""

    def __init__(self, local: CopyHandle | None, peers: _Peers) -> None:
        super().__init__()
        self.local, self.peers, self.waited = local, peers, False

    def done(self) -> bool:
        return self.waited

    def wait(self) -> None:
        if self.local is not None:
            self.local.wait()
        if not self.waited:
            self.peers.end({})
            self.waited = True

    def block(self, stream: torch.cuda.Stream | None = None) -> None:
        if self.local is not None:
            self.local.block(stream)


class LeadExecutor(GpuExecutor):
    """Rank 0 of a tensor-parallel GPU engine: a GpuExecutor over its own shard that sends
    every round, stage and Dense Assist to the other ranks as it runs its own."""

    def __init__(self, shape: ModelShape, weights: ModelWeights, world: int, gpu_blocks: int,
                 block_size: int, tokens: TokenStore, dtype: torch.dtype,
                 host_pool: PagedKVPool | None = None, host: HostShare | None = None,
                 cpu_engine_cores: tuple[int, ...] | None = None) -> None:
        """weights: the full model on rank 0's device; each rank gets its shard from it.
        The other ranks' processes keep off `cpu_engine_cores`, as rank 0's does."""
        device = weights.embed.device
        self.host_cores, peer_cores = _split_cores(world, cpu_engine_cores)
        self.peers = _Peers(shape, weights, world, device, gpu_blocks, block_size, dtype, host,
                            peer_cores)
        try:
            shard = shard_shape(shape, world)
            model = Model(shard, shard_weights(weights, shape, 0, world), all_reduce())
            pool = PagedKVPool(shard, gpu_blocks, block_size, device, dtype=dtype)
            own = host_pool.heads(shard, 0) if host_pool is not None else None
            super().__init__(model, pool, tokens, own, rank=0)
        except BaseException:
            self.peers.close()
            raise
        # an assist's collectives keep the round's order on the round's stream, on every rank
        self.assist_stream = None
        self.world = world

    def execute(self, plan: GpuPlan) -> dict[int, int]:
        """A whole round with no Dense Assist between its stages (vLLM's engine, warm-up): the
        other ranks run every stage as soon as they have the round, one message where a
        stage-by-stage forward sends one per stage (on the 2-GPU box those cost about 1 ms of
        a 7 ms decode round)."""
        rnd = self.round_of(plan)
        self.peers.send_round(rnd, True)
        fw = super().forward(rnd)
        for stage in fw:
            stage()
        tokens = fw.result()
        self.peers.end(tokens)
        self.last_forward = fw
        return tokens

    def forward(self, rnd: Round) -> Forward:
        self.peers.send_round(rnd, False)
        peers = self.peers

        def released(stage: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                peers.send("s")
                stage()
            return run

        return super().forward(rnd).wrapped(released, peers.end)

    def migrate(self, moves: BlockMoves) -> CopyHandle | None:
        rnd = Round(None, moves.swap_out, moves.swap_in)
        if not rnd.has_migrations:
            return None
        self.peers.send_round(rnd, False)
        self.swap_handle = _JointHandle(self.migrate_round(rnd), self.peers)
        return self.swap_handle

    def copies_done(self) -> bool:
        return super().copies_done() and self.peers.copies_done()

    def warm_kernels(self) -> None:
        self.peers.send("warm")
        super().warm_kernels()

    def capture_graph(self, key: tuple[int, int]) -> None:
        """Every rank captures the graphs rank 0 does, in its order: rank 0 decides how many by
        its own free memory (the other ranks hold the same shard, pool and graphs)."""
        self.peers.send("graph", *key)
        super().capture_graph(key)

    def _assist(self, kind: str, layer: int, rows: int) -> None:
        self.peers.send("a", ASSIST_KINDS.index(kind), layer, rows)

    def assist_post_attn(self, layer: int, attn_out_cpu: torch.Tensor,
                         residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                         ) -> torch.Tensor:
        self._assist("p", layer, attn_out_cpu.shape[0])
        return super().assist_post_attn(layer, attn_out_cpu, residual_cpu, out)

    def assist_fused_final(self, layer: int, attn_out_cpu: torch.Tensor,
                           residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                           ) -> torch.Tensor:
        self._assist("lA", layer, attn_out_cpu.shape[0])
        return super().assist_fused_final(layer, attn_out_cpu, residual_cpu, out)

    def failure(self) -> str | None:
        """A dead rank, if any (the runtime's watchdog asks: a rank 0 blocked in a
        collective with a dead peer never returns on its own)."""
        return self.peers.dead()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # a failed GPU: the peers still get stopped
            self.release_graphs()
        self.peers.close()
