"""The CPU executor: one decode step of a CPU-owned batch over the host KV pool.

`CpuExecutor.execute(plan)` runs the pre-layer, every layer's pre-attention and attention on the
CPU (the packed AMX dense kernel of packed.py, the C++ paged attention over the host pool's
HND pages), and the post-attention stages and post-layer where `plan.route` says (paper Eq. 5):

* Full-CPU: everything on the CPU.
* Split-Final: all layers on the CPU, the post-layer through `assist.assist_post_layer(hidden)`.
* Fused-Assist: every post-attention stage through `assist.assist_post_attn(layer, attn_out,
  residual)`, the last one through `assist.assist_fused_final(layer, attn_out, residual)`, which
  also runs the post-layer and returns the tokens.

`assist` is any object with those three methods: the GPU executor in the runtime, or
`LocalAssist(model)` here (the same stages on a given Model, any device), which tests use and the
runtime can fall back to when no GPU is there.

Threads and cores: the executor owns a thread count (`torch.set_num_threads`, applied in the
thread that calls `execute`, since OpenMP's thread count is per calling thread) and optionally a
core set (`os.sched_setaffinity` of the calling thread, inherited by the threads it starts, plus
one core per OpenMP worker of its team). In the real runtime the CPU engine runs in its own
process, so neither leaks into the GPU engine; in a test, run it in its own thread (or process)
if the rest of the process must keep its settings.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dualpace_hw.executors.model import Model, greedy
from dualpace_hw.kernels.cpu_attention import cpu_paged_decode_attention, omp_threads, pin_threads
from dualpace_hw.memory.allocator import keep_freed_memory
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_sim.core.plans import CpuPlan
from dualpace_sim.core.routing import Route


class TokenSource(Protocol):
    """What the executor needs of the token store (dualpace_hw.memory.tokens.TokenStore)."""

    def last(self, req_id: int) -> int: ...


class Assist(Protocol):
    """Dense Assist: post-attention stages and the post-layer of a CPU batch, elsewhere."""

    def assist_post_attn(
        self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor
    ) -> torch.Tensor: ...

    def assist_post_layer(self, hidden_cpu: torch.Tensor) -> Any: ...

    def assist_fused_final(
        self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor
    ) -> Any: ...


def _token_list(tokens: Any) -> list[int]:
    """Tokens as a list of ints, from a tensor (any device), a list or a tuple."""
    if isinstance(tokens, torch.Tensor):
        return tokens.reshape(-1).tolist()
    return [int(t) for t in tokens]


class LocalAssist:
    """Dense Assist run by a Model of its own (any device): the same stages as the GPU worker's,
    with CPU tensors in and out."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.calls = {"post_attn": 0, "post_layer": 0, "fused_final": 0}

    def _in(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.model.device, self.model.w.embed.dtype)

    def assist_post_attn(
        self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor
    ) -> torch.Tensor:
        self.calls["post_attn"] += 1
        h = self.model.post_attn(layer, self._in(attn_out_cpu), self._in(residual_cpu))
        return h.to("cpu", residual_cpu.dtype)

    def assist_post_layer(self, hidden_cpu: torch.Tensor) -> torch.Tensor:
        self.calls["post_layer"] += 1
        return greedy(self.model.post_layer(self._in(hidden_cpu))).cpu()

    def assist_fused_final(
        self, layer: int, attn_out_cpu: torch.Tensor, residual_cpu: torch.Tensor
    ) -> torch.Tensor:
        self.calls["fused_final"] += 1
        h = self.model.post_attn(layer, self._in(attn_out_cpu), self._in(residual_cpu))
        return greedy(self.model.post_layer(h)).cpu()


@dataclass(slots=True)
class CpuStep:
    """One CPU decode step as plain data: what the CPU engine's process needs of a CpuPlan.

    Row i decodes request req_ids[i]: input token token_ids[i] at positions[i], over the host
    blocks tables[i] (exactly those holding positions 0..positions[i])."""

    route: Route
    req_ids: list[int]
    token_ids: list[int]
    positions: list[int]
    tables: list[list[int]]

    @classmethod
    def from_plan(cls, plan: CpuPlan, tokens: TokenSource, block_size: int) -> CpuStep:
        step = cls(plan.route, [], [], [], [])
        for r in plan.batch:
            if r.generated < 1:
                raise ValueError(f"request {r.req_id}: a CPU decode needs the first token, "
                                 "sampled by the prefill")
            pos = r.prompt_tokens + r.generated - 1  # the input token's position
            need = pos // block_size + 1
            if len(r.blocks) < need:
                raise ValueError(f"request {r.req_id}: position {pos} needs {need} host blocks, "
                                 f"it holds {len(r.blocks)}")
            step.req_ids.append(r.req_id)
            step.token_ids.append(tokens.last(r.req_id))
            step.positions.append(pos)
            step.tables.append(list(r.blocks[:need]))
        return step


@dataclass(slots=True)
class StepPhases:
    """Where one CPU step's time went, on the executor's clock (seconds). The runtime writes one
    row a step (`dualpace_sim.costs.cpu_step_records`), so a served run shows which stage ran
    slower than the profile's tables, beside what the model charges for the same plan."""

    setup_s: float = 0.0  # the step's positions, block tables and slots
    pre_layer_s: float = 0.0  # embedding
    pre_attn_s: float = 0.0  # N x (norm, QKV, RoPE)
    kv_write_s: float = 0.0  # N x the new token's K, V into the host pool
    attention_s: float = 0.0  # N x paged decode attention
    assists_s: float = 0.0  # Dense Assists end to end (buffers in, wait, result out)
    post_s: float = 0.0  # the CPU's own post-attention stages and post-layer


class CpuExecutor:
    """Decode steps of CPU batches over the host KV pool (see the module docstring).

    model: a CPU Model, normally `packed.pack_model(...)`'s; host_pool: the host PagedKVPool,
    whose block ids are the requests' `blocks`; tokens: the token store (the last token of each
    request is the step's input; as with the GPU executor, the caller appends the sampled
    tokens after the core's `apply`);
    assist: Dense Assist for Split-Final and Fused-Assist plans; threads / cores: this
    executor's thread count and core set.
    """

    def __init__(
        self,
        model: Model,
        host_pool: PagedKVPool,
        tokens: TokenSource,
        assist: Assist | None = None,
        threads: int | None = None,
        cores: Sequence[int] | None = None,
        attention_impl: str = "auto",
    ) -> None:
        if model.device.type != "cpu":
            raise ValueError(f"the CPU executor needs a CPU model, got one on {model.device}")
        if host_pool.device.type != "cpu":
            raise ValueError(f"the CPU executor needs the host pool, got one on {host_pool.device}")
        if host_pool.n_layers < model.n_layers:
            raise ValueError(f"the host pool has {host_pool.n_layers} layers, the model "
                             f"{model.n_layers}")
        self.model = model
        self.pool = host_pool
        self.tokens = tokens
        self.assist = assist
        self.cores = sorted(set(cores)) if cores else None
        self.threads = threads or (len(self.cores) if self.cores else torch.get_num_threads())
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        self.attention_impl = attention_impl
        self._configured: set[int] = set()  # thread idents whose threads/affinity are set
        self.pinned_threads = 0
        self.steps = 0
        self.phases = StepPhases()  # the last step's

    # --- threads and cores ------------------------------------------------------------------
    def configure_thread(self) -> None:
        """Apply the thread count and core set to the calling thread (once per thread), and
        keep the process's freed memory for the next step's temporaries (`allocator`)."""
        ident = threading.get_ident()
        if not self._configured:
            keep_freed_memory()
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if ident in self._configured:
            return
        if self.cores is not None:
            if not hasattr(os, "sched_setaffinity"):
                raise RuntimeError("core affinity needs os.sched_setaffinity (Linux)")
            os.sched_setaffinity(0, self.cores)  # this thread, and threads it starts later
            self.pinned_threads = pin_threads(self.cores)  # one core per OpenMP worker
        self._configured.add(ident)

    def effective_threads(self) -> int:
        """Threads the attention kernel's parallel regions use from the calling thread."""
        return omp_threads()

    # --- one decode step ----------------------------------------------------------------------
    def execute(self, plan: CpuPlan) -> dict[int, int]:
        """One decode step of every request in plan.batch; returns req_id -> sampled token."""
        self._check_route(plan.route)  # before building the step: the clearer error first
        return self._run(CpuStep.from_plan(plan, self.tokens, self.pool.block_size))

    def run(self, step: CpuStep) -> dict[int, int]:
        """One decode step given as a CpuStep (what the CPU engine's process receives)."""
        self._check_route(step.route)
        return self._run(step)

    def _run(self, step: CpuStep) -> dict[int, int]:
        if not step.req_ids:
            return {}
        self.configure_thread()
        with torch.inference_mode():
            tokens = self._step(step)
        self.steps += 1
        return dict(zip(step.req_ids, tokens, strict=True))

    def _check_route(self, route: Route) -> None:
        if route != Route.FULL_CPU and self.assist is None:
            raise ValueError(f"a {route.value} plan needs Dense Assist, and this executor has none")

    def _step(self, step: CpuStep) -> list[int]:
        """The step's layers, each phase timed into `self.phases` (a few hundred clock reads
        a step, against steps of tens of milliseconds)."""
        m, route, bs = self.model, step.route, self.pool.block_size
        self.phases = ph = StepPhases()
        clock = time.perf_counter
        t0 = clock()
        n = len(step.req_ids)
        positions = torch.tensor(step.positions)
        width = max(len(t) for t in step.tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in step.tables],  # pad: unread
                              dtype=torch.int32)
        slots = tables[torch.arange(n), positions // bs].long() * bs + positions % bs
        ids, lens = torch.tensor(step.token_ids), (positions + 1).to(torch.int32)
        t1 = clock()
        h = m.pre_layer(ids)
        t2 = clock()
        ph.setup_s, ph.pre_layer_s = t1 - t0, t2 - t1
        last = m.n_layers - 1
        for layer in range(m.n_layers):
            t0 = clock()
            q, k, v = m.pre_attn(layer, h, positions)
            t1 = clock()
            self.pool.write(layer, slots, k, v)
            t2 = clock()
            kc, vc = self.pool.layer(layer)
            o = cpu_paged_decode_attention(q, kc, vc, tables, lens, impl=self.attention_impl,
                                           validate=layer == 0)  # one table set per step
            o = o.reshape(n, -1)
            t3 = clock()
            ph.pre_attn_s += t1 - t0
            ph.kv_write_s += t2 - t1
            ph.attention_s += t3 - t2
            if route == Route.FUSED_ASSIST:
                if layer == last:
                    tokens = _token_list(self.assist.assist_fused_final(layer, o, h))
                    ph.assists_s += clock() - t3
                    return tokens
                h = self.assist.assist_post_attn(layer, o, h)
                ph.assists_s += clock() - t3
            else:
                h = m.post_attn(layer, o, h)
                ph.post_s += clock() - t3
        t0 = clock()
        if route == Route.SPLIT_FINAL:
            tokens = _token_list(self.assist.assist_post_layer(h))
            ph.assists_s += clock() - t0
            return tokens
        tokens = greedy(m.post_layer(h)).tolist()
        ph.post_s += clock() - t0
        return tokens
