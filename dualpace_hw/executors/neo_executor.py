"""NEO's iterations on the runtime's executors (BASELINES.md §A4): its asymmetric pipeline of
two sub-batches, its GPU-only mode (one sub-batch), its swaps and its CPU prefills.

Each sub-batch of a `NeoPlan` becomes one batch of the GPU executor (`GpuExecutor.prepare`):
its GPU decodes and prefills (a CPU prefill's pages go to the host layer by layer, as
DualPace's Prefill-to-CPU chunks do), then its CPU decodes as rows whose attention the GPU
does not compute. At every layer the GPU computes q/k/v of all of a sub-batch's rows (one
projection of the sub-batch's width: NEO's linr_T), the CPU decodes' q/k/v cross to the host
on a copy stream, a worker thread stores their K/V into the host pool and runs the C++ paged
decode attention over it (`cpu_attention.py`; the op releases the GIL, so the GPU engine's
thread keeps issuing GPU work meanwhile), and the output crosses back before the sub-batch's
post-attention stage.

The pipelined order is NEO's (swiftllm/worker/layers/transformer_layer.py): per layer i,

    stage 0:  GPU: post-attention[i] + pre-attention[i+1] of sub-batch 0, attention[i] of 1
              CPU: attention[i] of sub-batch 1's CPU decodes
    stage 1:  GPU: post-attention[i] + pre-attention[i+1] of sub-batch 1, attention[i+1] of 0
              CPU: attention[i+1] of sub-batch 0's CPU decodes

so one sub-batch's CPU attention hides under the other's linear work (paper Eq. 1). A CPU job
starts as soon as its q/k/v reach the host and the job before it is done; the GPU engine's
thread waits for a job's output only before the post-attention stage that needs it.

Swaps move every layer of their blocks with the Migrator before the forward: the compute
stream and the first CPU job wait for them. The iteration ends when its CPU prefills' pages
have landed on the host (they are CPU decodes from the next iteration on), as the simulator
charges it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from dualpace_hw.executors.gpu import Batch, GpuExecutor
from dualpace_hw.executors.model import greedy
from dualpace_hw.kernels.cpu_attention import (
    cpu_paged_decode_attention,
    load_extension,
    pin_threads,
)
from dualpace_hw.memory.allocator import keep_freed_memory
from dualpace_hw.memory.kv import PagedKVPool, slot_mapping
from dualpace_hw.memory.migrate import CopyGroup, CopyHandle
from dualpace_sim.core.neo import NeoPlan, SubBatch
from dualpace_sim.core.plans import GpuPlan, PrefillChunk
from dualpace_sim.core.request import Request


@dataclass
class CpuRows:
    """A sub-batch's CPU decodes as the host kernel reads them."""

    reqs: list[Request]
    tables: torch.Tensor  # [n, max blocks] int32 host block tables
    lens: torch.Tensor  # [n] int32 context, the current token included
    slots: torch.Tensor  # [n] int64 host slot of the current token's K/V

    @classmethod
    def of(cls, reqs: list[Request], block_size: int) -> CpuRows:
        width = max((len(r.blocks) for r in reqs), default=1)
        tables = torch.zeros(len(reqs), width, dtype=torch.int32)
        lens, slots = [], []
        for i, r in enumerate(reqs):
            n = r.prompt_tokens + r.generated
            if len(r.blocks) * block_size < n:
                raise ValueError(f"request {r.req_id}: {len(r.blocks)} host blocks hold no {n} "
                                 "tokens")
            tables[i, : len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
            lens.append(n)
            slots.extend(slot_mapping(r.blocks, n - 1, 1, block_size))
        return cls(reqs, tables, torch.tensor(lens, dtype=torch.int32),
                   torch.tensor(slots, dtype=torch.int64))


class CpuAttention:
    """One worker thread running NEO's CPU attention, layer by layer, over the host pool.

    NEO calls its kernel in the engine's own thread after issuing the GPU work it overlaps; a
    thread of the engine's process does the same here, so the GPU engine's thread goes on
    issuing while the kernel runs (torch.ops releases the GIL for the op's duration)."""

    def __init__(self, host_pool: PagedKVPool, cores: list[int] | None = None) -> None:
        load_extension()  # build or load before the clock starts, not in the first iteration
        self.host = host_pool
        self.busy_s = 0.0  # store + kernel time, summed
        self._pool = ThreadPoolExecutor(1, "neo-cpu-attention", self._init, (cores,))

    @staticmethod
    def _init(cores: list[int] | None) -> None:
        keep_freed_memory()  # the attention's per-layer temporaries, as the CPU engine's
        if cores:
            torch.set_num_threads(len(cores))
            pin_threads(cores)

    def submit(self, layer: int, rows: CpuRows, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, ready: list) -> Future:
        """Store the rows' K/V of `layer` at their host slots, then attend; the inputs are
        read only once everything in `ready` (copy events or handles) has landed."""
        return self._pool.submit(self._run, layer, rows, q, k, v, ready)

    def _run(self, layer: int, rows: CpuRows, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, ready: list) -> torch.Tensor:
        for r in ready:
            r.wait() if isinstance(r, CopyHandle) else r.synchronize()
        start = time.perf_counter()
        self.host.write(layer, rows.slots, k, v)
        kc, vc = self.host.layer(layer)
        o = cpu_paged_decode_attention(q, kc, vc, rows.tables, rows.lens, validate=layer == 0)
        self.busy_s += time.perf_counter() - start
        return o

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class ActivationLink:
    """The CPU decodes' q/k/v to the host and their attention output back, every layer, on one
    copy stream (so an output's copy back precedes the next layer's copy out, and a reused
    pinned buffer is free by the time its next copy lands). On the CPU device: no copies."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self._buffers: dict[tuple[int, str], torch.Tensor] = {}
        self.to_host_bytes = 0
        self.to_gpu_bytes = 0

    def _buffer(self, part: int, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get((part, name))
        if buf is None or buf.numel() < like.numel() or buf.dtype != like.dtype:
            buf = torch.empty(max(like.numel(), 1 << 14), dtype=like.dtype, pin_memory=True)
            self._buffers[(part, name)] = buf
        return buf[: like.numel()].view(like.shape)

    def to_host(self, part: int, tensors: tuple[torch.Tensor, ...]
                ) -> tuple[tuple[torch.Tensor, ...], list]:
        """Copies of `tensors` (rows of the compute stream's latest work) on the host, and
        what to wait on before reading them."""
        self.to_host_bytes += sum(t.numel() * t.element_size() for t in tensors)
        if not self.cuda:
            return tensors, []
        s = self.stream
        s.wait_stream(torch.cuda.current_stream())
        out = []
        with torch.cuda.stream(s):
            for name, t in zip("qkv", tensors, strict=True):
                t.record_stream(s)
                out.append(self._buffer(part, name, t).copy_(t, non_blocking=True))
            done = torch.cuda.Event()
            done.record(s)
        return tuple(out), [done]

    def to_gpu(self, part: int, o_cpu: torch.Tensor, dst: torch.Tensor) -> None:
        """`o_cpu` into the rows `dst` of the compute stream's tensor, before its next work."""
        self.to_gpu_bytes += o_cpu.numel() * o_cpu.element_size()
        if not self.cuda:
            dst.copy_(o_cpu)
            return
        staged = self._buffer(part, "o", o_cpu).copy_(o_cpu)
        compute = torch.cuda.current_stream()
        self.stream.wait_stream(compute)  # `dst`'s memory may have been another tensor's
        with torch.cuda.stream(self.stream):
            dst.copy_(staged, non_blocking=True)
        compute.wait_stream(self.stream)


@dataclass
class _Part:
    """One sub-batch on its way through the layers."""

    batch: Batch
    cpu: CpuRows | None
    h: torch.Tensor
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    o: torch.Tensor | None = None
    pending: Future | None = None  # the CPU attention of the current layer

    @property
    def n_gpu(self) -> int:
        return self.batch.n_rows - self.batch.n_ext


@dataclass
class IterationTimes:
    """What one iteration spent where (seconds)."""

    swap_s: float = 0.0  # issuing the swaps (the GPU waits for them on its stream)
    forward_s: float = 0.0  # issuing and running the layers, until the tokens are on the host
    copies_s: float = 0.0  # then waiting for the CPU prefills' pages to land
    sub_batches: list[int] = field(default_factory=list)  # rows per sub-batch


class NeoExecutor:
    """Runs committed NeoPlans on a GPU executor (with a host pool) and a CPU attention
    thread; returns each iteration's sampled tokens."""

    def __init__(self, gpu: GpuExecutor, cores: list[int] | None = None) -> None:
        if gpu.host_pool is None or gpu.migrator is None:
            raise ValueError("NEO needs a host KV pool beside the GPU executor")
        self.gpu = gpu
        self.cpu = CpuAttention(gpu.host_pool, cores)
        self.link = ActivationLink(gpu.device)
        self.block_size = gpu.pool.block_size

    def close(self) -> None:
        self.cpu.close()

    def iterate(self, plan: NeoPlan) -> tuple[dict[int, int], IterationTimes]:
        """One committed iteration: its swaps (the block moves its commit made), then the
        forward of its one or two sub-batches."""
        times = IterationTimes()
        t0 = time.perf_counter()
        handle = self.gpu.migrate(plan.moves)
        if handle is not None and self.gpu.cuda:
            handle.block()  # the compute stream waits for the swaps (NEO: before layer 0)
        t1 = time.perf_counter()
        times.swap_s = t1 - t0
        if not plan.batches:
            if handle is not None:
                handle.wait()
            return {}, times
        copies = CopyGroup()
        parts = [self._part(b) for b in plan.batches]
        times.sub_batches = [p.batch.n_rows for p in parts]
        first_wait = [handle] if handle is not None else []
        if len(parts) == 1:
            tokens = self._sequential(parts[0], copies, first_wait)
        else:
            tokens = self._pipelined(parts, copies, first_wait)
        t2 = time.perf_counter()
        times.forward_s = t2 - t1
        copies.wait()
        if handle is not None:
            handle.wait()
        times.copies_s = time.perf_counter() - t2
        return tokens, times

    # ------------------------------------------------------------------ building blocks

    def _part(self, sb: SubBatch) -> _Part:
        chunks = [PrefillChunk(r, 0, r.prompt_tokens, False, True) for r in sb.gpu_prefills]
        chunks += [PrefillChunk(r, 0, r.prompt_tokens, True, True) for r in sb.cpu_prefills]
        batch = self.gpu.prepare(GpuPlan(decodes=sb.gpu_decodes, prefills=chunks),
                                 external=sb.cpu_decodes)
        cpu = CpuRows.of(sb.cpu_decodes, self.block_size) if sb.cpu_decodes else None
        return _Part(batch, cpu, self.gpu.kernels.embed(batch))

    def _qkv(self, layer: int, p: _Part, index: int, waits: list) -> None:
        """Pre-attention of `layer`; the CPU decodes' q/k/v leave for the host and their
        attention starts on the worker as soon as they land."""
        p.q, p.k, p.v = self.gpu.kernels.pre_attn(layer, p.h, p.batch)
        if p.cpu is None:
            return
        rows = slice(p.n_gpu, None)
        (q, k, v), ready = self.link.to_host(index, (p.q[rows], p.k[rows], p.v[rows]))
        p.pending = self.cpu.submit(layer, p.cpu, q, k, v, waits + ready)

    def _gpu_attention(self, layer: int, p: _Part, copies: CopyGroup) -> None:
        p.o = self.gpu.kernels.attention(layer, p.q, p.k, p.v, p.batch, copies)
        p.q = p.k = p.v = None

    def _post(self, layer: int, p: _Part, index: int) -> None:
        """Join the layer's CPU attention (if any), then the post-attention stage."""
        if p.pending is not None:
            o_cpu = p.pending.result()
            p.pending = None
            self.link.to_gpu(index, o_cpu, p.o[p.n_gpu:])
        p.h = self.gpu.kernels.post_attn(layer, p.o.view(p.o.shape[0], -1), p.h)
        p.o = None

    def _tokens(self, parts: list[_Part]) -> dict[int, int]:
        hidden = [p.h if p.batch.sample_rows is None else p.h.index_select(0, p.batch.sample_rows)
                  for p in parts]
        ids = [i for p in parts for i in p.batch.sample_req_ids]
        tokens = greedy(self.gpu.model.post_layer(torch.cat(hidden))).tolist()
        return dict(zip(ids, tokens, strict=True))

    # -------------------------------------------------------------------- the two modes

    def _sequential(self, p: _Part, copies: CopyGroup, waits: list) -> dict[int, int]:
        """GPU-only mode (NEO's _forward_sequential): every layer in turn."""
        for layer in range(self.gpu.model.n_layers):
            self._qkv(layer, p, 0, waits if layer == 0 else [])
            self._gpu_attention(layer, p, copies)
            self._post(layer, p, 0)
        return self._tokens([p])

    def _pipelined(self, parts: list[_Part], copies: CopyGroup, waits: list) -> dict[int, int]:
        """Two sub-batches, each layer's CPU attention of one under the other's GPU work."""
        b0, b1 = parts
        n = self.gpu.model.n_layers
        self._qkv(0, b0, 0, waits)
        self._qkv(0, b1, 1, [])
        self._gpu_attention(0, b0, copies)
        for layer in range(n):
            more = layer + 1 < n
            # stage 0: sub-batch 0's linear work; sub-batch 1's attention
            self._post(layer, b0, 0)
            if more:
                self._qkv(layer + 1, b0, 0, [])
            self._gpu_attention(layer, b1, copies)
            # stage 1: sub-batch 1's linear work; sub-batch 0's attention of the next layer
            self._post(layer, b1, 1)
            if more:
                self._qkv(layer + 1, b1, 1, [])
                self._gpu_attention(layer + 1, b0, copies)
        return self._tokens(parts)
