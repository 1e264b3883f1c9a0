"""CPU tensor-parallel ranks for the profiler: rank-critical timing (paper Appendix B).

With the CPU engine split over N ranks (`dualpace-hw run --cpu-tp N`), a sharded stage takes
as long as its slowest rank, all-reduce included. So the sharded CPU stages — pre-attention,
decode attention, post-attention (with its two all-reduces) — are measured by N processes at
once, each on its own range of cores with its shard of one decoder layer, and the profile keeps
the maximum over ranks. The ranks agree on every timing loop's invocation count first, since a
stage with an all-reduce must be called as often on every rank. The replicated stages (pre- and
post-layer) and the assist buffers stay with the main process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dualpace_sim.costs.shapes import ModelShape

from ..kv import PagedKVPool
from ..model import Model, ModelWeights
from ..packed import pack_model
from ..processes import forget, gloo_rendezvous, spawn, stop
from ..tp import all_reduce, shard_shape, shard_weights
from .grids import Grids
from .measure import decode_time
from .timing import Protocol, Timer

SHARDED_STAGES = ("cpu.pre_attn", "cpu.post_attn", "cpu.decode_attn")


@dataclass(frozen=True)
class RankSpec:
    shape: ModelShape
    seed: int
    block_size: int
    n_blocks: int
    grids: Grids
    protocol: Protocol
    rank: int
    world: int
    rendezvous: str
    cores: tuple[int, ...]


def _agree_max(estimate: float) -> float:
    t = torch.tensor([estimate], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


class _Rank:
    """One rank's shard of one decoder layer, and its stage timings."""

    def __init__(self, spec: RankSpec) -> None:
        from ..cpu_attention import cpu_paged_decode_attention, pin_threads

        os.sched_setaffinity(0, spec.cores)
        torch.set_num_threads(len(spec.cores))
        pin_threads(list(spec.cores))
        full = ModelWeights.random(spec.shape, spec.seed, "cpu", n_layers=1)
        self.shape = shard_shape(spec.shape, spec.world)
        self.model = pack_model(Model(self.shape, shard_weights(full, spec.shape, spec.rank,
                                                                spec.world), all_reduce()))
        self.pool = PagedKVPool(self.shape, spec.n_blocks, spec.block_size, "cpu", n_layers=1)
        self.grids = spec.grids
        self.timer = Timer(torch.device("cpu"), spec.protocol, agree=_agree_max)
        self.kernel = cpu_paged_decode_attention

    def measure(self, stage: str, args: tuple[int, ...]) -> float:
        h = self.shape.hidden_size
        if stage == "cpu.pre_attn":
            (b,) = args
            x, pos = torch.randn(b, h, dtype=torch.bfloat16), torch.arange(b)
            return self.timer(lambda: self.model.pre_attn(0, x, pos))
        if stage == "cpu.post_attn":
            (b,) = args
            a = torch.randn(b, self.shape.q_dim, dtype=torch.bfloat16)
            r = torch.randn(b, h, dtype=torch.bfloat16)
            return self.timer(lambda: self.model.post_attn(0, a, r))
        if stage == "cpu.decode_attn":
            batch, total = args
            return decode_time(self.shape, self.grids, self.kernel, self.timer, self.pool, "cpu",
                               batch, total)
        raise ValueError(f"no sharded CPU stage {stage!r}; the sharded ones: {SHARDED_STAGES}")


def _rank_main(conn, spec: RankSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the profiler's main process decides
    try:
        dist.init_process_group("gloo", init_method=f"file://{spec.rendezvous}",
                                rank=spec.rank, world_size=spec.world)
        rank = _Rank(spec)
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] != "measure":
                return
            conn.send(("done", rank.measure(msg[1], msg[2])))
    except EOFError:
        return
    except BaseException as e:  # noqa: BLE001 - reported to the main process
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


class CpuRanks:
    """`world` rank processes on consecutive ranges of `cores`; `measure` gives the
    rank-critical time of a sharded stage."""

    def __init__(self, shape: ModelShape, seed: int, block_size: int, n_blocks: int,
                 grids: Grids, protocol: Protocol, world: int, cores: list[int]) -> None:
        if len(cores) < world:
            raise ValueError(f"{world} CPU ranks need at least {world} cores, got {len(cores)}")
        shard_shape(shape, world)  # the heads must split
        self._rendezvous = gloo_rendezvous()
        per = len(cores) // world
        self.procs, self.conns = [], []
        try:
            for rank in range(world):
                spec = RankSpec(shape, seed, block_size, n_blocks, grids, protocol, rank, world,
                                self._rendezvous, tuple(cores[rank * per:(rank + 1) * per]))
                proc, conn = spawn(_rank_main, spec, f"dualpace-profile-rank-{rank}")
                self.procs.append(proc)
                self.conns.append(conn)
            for i in range(world):
                self._recv(i)
        except BaseException:
            self.close()
            raise

    def _recv(self, i: int) -> tuple:
        try:
            msg = self.conns[i].recv()
        except EOFError as e:
            self.procs[i].join(1.0)
            raise RuntimeError(f"profiler CPU rank {i} died (exit code "
                               f"{self.procs[i].exitcode})") from e
        if msg[0] == "error":
            raise RuntimeError(f"profiler CPU rank {i} failed: {msg[1]}")
        return msg

    def measure(self, stage: str, *args: int) -> float:
        for conn in self.conns:
            conn.send(("measure", stage, args))
        return max(self._recv(i)[1] for i in range(len(self.conns)))

    def close(self) -> None:
        stop(self.procs, self.conns)
        self.procs, self.conns = [], []
        forget(self._rendezvous)
