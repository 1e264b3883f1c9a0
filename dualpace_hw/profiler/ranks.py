"""Tensor-parallel ranks for the profiler: rank-critical timing (paper Appendix B).

Split over N ranks, a sharded stage takes as long as its slowest rank, all-reduce included. So
under tensor parallelism the profiler times such stages on N processes at once, each with its
shard of one decoder layer, and keeps the maximum over ranks. The ranks agree on every timing
loop's invocation count first, since a stage with an all-reduce must be called as often on
every rank.

CPU ranks (`--cpu-tp N`, the CPU engine as `dualpace-hw run --cpu-tp N` runs it): the sharded
CPU stages — pre-attention, decode attention, post-attention (with its two all-reduces) — on
Gloo ranks, each on its own range of cores. The replicated stages (pre- and post-layer) and the
assist buffers stay with the main process.

GPU ranks (`--gpu-tp N`): every GPU-side measurement — the stage tables, Dense Assist, the eager
layer and the link — on one NCCL rank per GPU (Gloo ranks on the CPU device, for tests). The
replicated pre- and post-layer run on every rank too, as they do when serving.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dualpace_hw import hostinfo
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.packed import pack_model
from dualpace_hw.executors.tp import all_reduce, shard_shape, shard_weights
from dualpace_hw.hostinfo import rank_cores
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.measure import (
    Measurer,
    cpu_kv_pool,
    cpu_layer_ring,
    decode_time,
    ring_of,
    timing_budget,
)
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_hw.runtime.processes import forget, gloo_rendezvous, spawn, stop
from dualpace_sim.costs.shapes import ModelShape

CPU_STAGES = ("cpu.pre_attn", "cpu.post_attn", "cpu.decode_attn")
GPU_STAGES = ("gpu.pre_attn", "gpu.post_attn", "gpu.pre_layer", "gpu.post_layer",
              "gpu.prefill_attn", "gpu.decode_attn")


def _agree_max(group: dist.ProcessGroup | None = None) -> Callable[[float], float]:
    """Timer's `agree`: the largest first estimate over the ranks (a MAX all-reduce over
    `group`, which must be a Gloo one: the estimate is a host float)."""

    def agree(estimate: float) -> float:
        t = torch.tensor([estimate], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return float(t)

    return agree


@dataclass(frozen=True)
class CpuRankSpec:
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

    def start(self) -> _CpuRank:
        dist.init_process_group("gloo", init_method=f"file://{self.rendezvous}",
                                rank=self.rank, world_size=self.world)
        return _CpuRank(self)


class _CpuRank:
    """One rank's shard of one decoder layer on its cores, and its CPU stage timings."""

    def __init__(self, spec: CpuRankSpec) -> None:
        from dualpace_hw.kernels.cpu_attention import cpu_paged_decode_attention, pin_threads

        os.sched_setaffinity(0, spec.cores)
        torch.set_num_threads(len(spec.cores))
        pin_threads(list(spec.cores))
        full = ModelWeights.random(spec.shape, spec.seed, "cpu", n_layers=1)
        self.shape = shard_shape(spec.shape, spec.world)
        # As on one rank (`Measurer`): the dense stages cycle a ring of layers and decode
        # attention block windows, a layer's each where memory holds them (the ranks share
        # the timing budget), so this rank's shard is read from memory as in a decode step.
        self.cache_bytes = hostinfo.last_level_cache_bytes()
        budget = timing_budget() // spec.world
        ring = cpu_layer_ring(self.shape, self.cache_bytes, budget)
        shard = ring_of(shard_weights(full, spec.shape, spec.rank, spec.world), ring)
        self.model = pack_model(Model(self.shape, shard, all_reduce()))
        self.layers = itertools.cycle(range(ring))
        self.pool = cpu_kv_pool(self.shape, spec.n_blocks, spec.block_size, self.cache_bytes,
                                budget)
        self.grids = spec.grids
        self.timer = Timer(torch.device("cpu"), spec.protocol, agree=_agree_max())
        self.kernel = cpu_paged_decode_attention

    def measure(self, stage: str, args: tuple[int, ...]) -> float:
        h = self.shape.hidden_size
        if stage == "cpu.pre_attn":
            (b,) = args
            x, pos = torch.randn(b, h, dtype=torch.bfloat16), torch.arange(b)
            return self.timer(lambda: self.model.pre_attn(next(self.layers), x, pos))
        if stage == "cpu.post_attn":
            (b,) = args
            a = torch.randn(b, self.shape.q_dim, dtype=torch.bfloat16)
            r = torch.randn(b, h, dtype=torch.bfloat16)
            return self.timer(lambda: self.model.post_attn(next(self.layers), a, r))
        if stage == "cpu.decode_attn":
            batch, total = args
            return decode_time(self.shape, self.grids, self.kernel, self.timer, self.pool, "cpu",
                               batch, total, self.cache_bytes)
        raise ValueError(f"no sharded CPU stage {stage!r}; the sharded ones: {CPU_STAGES}")


@dataclass(frozen=True)
class GpuRankSpec:
    shape: ModelShape
    seed: int
    block_size: int
    grids: Grids
    protocol: Protocol
    rank: int
    world: int
    rendezvous: str
    device_type: str  # "cuda": rank r on cuda:r over NCCL; "cpu": the GPU path on the CPU
    cores: tuple[int, ...]  # this rank's own cores: OpenMP teams of two ranks must not
    # overlap (on the 2-GPU box, overlapping teams made every assist of >= 8 rows 10-20 ms)

    def start(self) -> _GpuRank:
        init = f"file://{self.rendezvous}"
        os.sched_setaffinity(0, self.cores)
        torch.set_num_threads(len(self.cores))
        if self.device_type == "cuda":
            device = torch.device("cuda", self.rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", init_method=init, rank=self.rank,
                                    world_size=self.world, device_id=device)
            return _GpuRank(self, device, dist.new_group(backend="gloo"))
        dist.init_process_group("gloo", init_method=init, rank=self.rank, world_size=self.world)
        return _GpuRank(self, torch.device("cpu"), None)


class _GpuRank:
    """One rank's shard of one decoder layer on its GPU, timed by the profile's own Measurer
    (its `reduce` all-reduces, so post-attention and the assists include both all-reduces)."""

    def __init__(self, spec: GpuRankSpec, device: torch.device,
                 agree_group: dist.ProcessGroup | None) -> None:
        full = ModelWeights.random(spec.shape, spec.seed, device, n_layers=1)
        shape = shard_shape(spec.shape, spec.world)
        model = Model(shape, shard_weights(full, spec.shape, spec.rank, spec.world),
                      all_reduce())
        del full  # the shard holds copies
        agree = _agree_max(agree_group)
        self.m = m = Measurer(shape, device, Timer(device, spec.protocol, agree),
                     Timer(torch.device("cpu"), spec.protocol, agree), spec.grids,
                     spec.block_size, gpu_model=model, cpu=False)
        self.calls: dict[str, Callable] = {
            "gpu.pre_attn": m.gpu_pre_attn, "gpu.post_attn": m.gpu_post_attn,
            "gpu.pre_layer": m.gpu_pre_layer, "gpu.post_layer": m.gpu_post_layer,
            "gpu.prefill_attn": m.gpu_prefill_attn, "gpu.decode_attn": m.gpu_decode_attn,
            "gpu.eager_layer_s": m.eager_layer, "assist": m.assist, "link": m.link,
        }

    def measure(self, stage: str, args: tuple) -> object:
        return self.calls[stage](*args)


def _rank_main(conn, spec: CpuRankSpec | GpuRankSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the profiler's main process decides
    try:
        rank = spec.start()
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] != "measure":
                break
            conn.send(("done", rank.measure(msg[1], msg[2])))
    except EOFError:
        return
    except BaseException as e:  # noqa: BLE001 - reported to the main process
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise
    dist.destroy_process_group()


class _Ranks:
    """The rank processes of `specs` (met through `rendezvous`); `measure` gives a stage's
    rank-critical time."""

    kind = ""  # "CPU" or "GPU", for messages and process names

    def __init__(self, specs: list[CpuRankSpec] | list[GpuRankSpec], rendezvous: str) -> None:
        self._rendezvous = rendezvous
        self.procs, self.conns = [], []
        try:
            for spec in specs:
                proc, conn = spawn(_rank_main, spec,
                                   f"dualpace-profile-{self.kind.lower()}-rank-{spec.rank}")
                self.procs.append(proc)
                self.conns.append(conn)
            for i in range(len(specs)):
                self._recv(i)
        except BaseException:
            self.close()
            raise

    def _recv(self, i: int) -> tuple:
        try:
            msg = self.conns[i].recv()
        except EOFError as e:
            self.procs[i].join(1.0)
            raise RuntimeError(f"profiler {self.kind} rank {i} died (exit code "
                               f"{self.procs[i].exitcode})") from e
        if msg[0] == "error":
            raise RuntimeError(f"profiler {self.kind} rank {i} failed: {msg[1]}")
        return msg

    def _each(self, stage: str, args: tuple) -> list:
        """Every rank's result of `stage`, run by all of them at once."""
        for conn in self.conns:
            conn.send(("measure", stage, args))
        return [self._recv(i)[1] for i in range(len(self.conns))]

    def measure(self, stage: str, *args: int) -> float:
        """The stage's time on its slowest rank."""
        return max(self._each(stage, args))

    def close(self) -> None:
        stop(self.procs, self.conns)
        self.procs, self.conns = [], []
        forget(self._rendezvous)


class CpuRanks(_Ranks):
    """`world` rank processes, each on its own range of `cores` (within one NUMA node where the
    box has several, as the runtime places them), timing CPU_STAGES."""

    kind = "CPU"

    def __init__(self, shape: ModelShape, seed: int, block_size: int, n_blocks: int,
                 grids: Grids, protocol: Protocol, world: int, cores: list[int]) -> None:
        if len(cores) < world:
            raise ValueError(f"{world} CPU ranks need at least {world} cores, got {len(cores)}")
        shard_shape(shape, world)  # the heads must split
        rendezvous = gloo_rendezvous()
        ranges = rank_cores(cores, world)  # as the runtime places its CPU engine's ranks
        super().__init__([CpuRankSpec(shape, seed, block_size, n_blocks, grids, protocol, rank,
                                      world, rendezvous, ranges[rank])
                          for rank in range(world)], rendezvous)


class GpuRanks(_Ranks):
    """`world` rank processes, rank r on cuda:r (or all on the CPU device, for tests), timing
    GPU_STAGES, the eager layer, Dense Assist and the link. The profile's first `threads`
    cores are shared out among ranks, each its own range. The caller checks that the heads
    split `world` ways and that there are `world` GPUs (the profiler before measuring)."""

    kind = "GPU"

    def __init__(self, shape: ModelShape, seed: int, block_size: int, grids: Grids,
                 protocol: Protocol, world: int, device: torch.device, threads: int) -> None:
        rendezvous = gloo_rendezvous()
        cores = sorted(os.sched_getaffinity(0))[:threads]
        per = max(1, len(cores) // world)
        super().__init__([GpuRankSpec(shape, seed, block_size, grids, protocol, rank, world,
                                      rendezvous, device.type,
                                      tuple(cores[rank * per:(rank + 1) * per] or cores))
                          for rank in range(world)], rendezvous)

    def eager_layer(self) -> float:
        return self.measure("gpu.eager_layer_s")

    def assist(self, kind: str, b: int) -> tuple[float, float]:
        """(g_x(b), wall time) of the slowest rank: an assist runs sharded on every GPU."""
        per = self._each("assist", (kind, b))
        return max(g for g, _ in per), max(wall for _, wall in per)

    def link(self) -> dict[str, float]:
        """Every rank copies at once over its own link, as a swap under tensor parallelism
        moves each rank's heads: the bandwidth is the aggregate (all ranks' bytes over the
        slowest rank's time, i.e. N x the slowest rank's bandwidth), the latency the slowest
        rank's."""
        per = self._each("link", ())
        return {"h2d_bytes_per_s": len(per) * min(p["h2d_bytes_per_s"] for p in per),
                "d2h_bytes_per_s": len(per) * min(p["d2h_bytes_per_s"] for p in per),
                "latency_s": max(p["latency_s"] for p in per)}
