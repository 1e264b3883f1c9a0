"""The vLLM v1 policy on the shared core (BASELINES.md §B1-B2): GPU only, no host KV tier.

Every step catches each request's computed tokens up to its tokens so far (vLLM's NOTE(woosuk)),
so chunked prefill, decode and recomputation after preemption are one code path. Running
requests go first under `max_num_batched_tokens`; when blocks run out the newest running request
is preempted by recompute, and a step that preempted admits no waiting request. Prefix caching
is off: a preempted request recomputes its prompt and every output token it already emitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .blocks import BlockPool, retire_finished
from .plans import GpuPlan, GpuResult, PrefillChunk
from .request import Owner, Request, RoundLog, blocks_for, emit_batch


@dataclass(frozen=True, slots=True)
class VllmConfig:
    gpu_kv_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        for name in ("gpu_kv_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"vllm.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def max_request_blocks(self) -> int:
        """The pool a request's finish-peak must fit: HBM, vLLM's only one."""
        return self.gpu_kv_blocks


def _num_tokens(r: Request) -> int:
    """Tokens the request has so far: its prompt and every output token already emitted."""
    return r.prompt_tokens + r.generated


class VllmScheduler:
    """One GPU engine: waiting (FCFS) and running queues over one HBM block pool."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.hbm = BlockPool("HBM", config.gpu_kv_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order; the tail is preempted first
        self.finished: list[Request] = []
        self.rounds = RoundLog()  # when the engine emitted tokens (Request.spans index it)
        self.n_submitted = 0
        self.preemptions = 0

    def submit(self, req: Request) -> None:
        self.waiting.append(req)
        self.n_submitted += 1

    def state_row(self) -> tuple[int, ...]:
        """`EngineState.state_row`'s columns: the running set split into requests without
        a token yet and decoding ones; what vLLM does not have is 0."""
        starting = sum(1 for r in self.running if r.generated == 0)
        return (len(self.waiting), starting, len(self.running) - starting, 0, 0,
                self.hbm.used, 0, 0, 0)

    def _allocate(self, r: Request, n: int) -> bool:
        """allocate_slots: blocks for `n` more computed tokens, or False when they run out."""
        need = blocks_for(r.computed + n, self.config.block_size) - len(r.blocks)
        if need > self.hbm.free:
            return False
        if need > 0:
            r.blocks.extend(self.hbm.allocate(need))
        return True

    def _preempt(self, victim: Request, now: float) -> None:
        self.hbm.release(victim.blocks)
        victim.blocks = []
        victim.computed = 0
        victim.migrations.append((now, "preempt_recompute"))
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def schedule(self, now: float) -> GpuPlan:
        """Decide and allocate one step at time `now` (allocation is the commit, as in vLLM)."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:  # RUNNING first
            r = running[i]
            n = min(_num_tokens(r) - r.computed, budget)
            while not self._allocate(r, n):
                victim = running.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    break
            if i >= len(running) or running[i] is not r:  # the request preempted itself
                break
            scheduled.append((r, n))
            budget -= n
            i += 1
        if not preempted:  # WAITING, strict FCFS head-of-line
            while self.waiting and budget > 0 and len(running) < self.config.max_num_seqs:
                r = self.waiting[0]
                n = min(_num_tokens(r) - r.computed, budget)
                if not self._allocate(r, n):
                    break
                self.waiting.popleft()
                running.append(r)
                scheduled.append((r, n))
                budget -= n
        return self._plan(scheduled)

    @staticmethod
    def _plan(scheduled: list[tuple[Request, int]]) -> GpuPlan:
        plan = GpuPlan()
        for r, n in scheduled:
            total = _num_tokens(r)
            if n == 1 and r.generated and r.computed == total - 1:
                plan.decodes.append(r)
            else:
                plan.prefills.append(PrefillChunk(r, r.computed, n, False, r.computed + n == total))
        plan.decode_context = sum(r.kv_tokens_after_step for r in plan.decodes)
        return plan

    def apply(self, plan: GpuPlan, result: GpuResult) -> None:
        """Advance computed tokens; a request that caught up samples its next token."""
        for r in plan.decodes:
            r.computed += 1
        for c in plan.prefills:
            c.req.computed += c.tokens
        sampled = plan.decodes + [c.req for c in plan.prefills if c.last]
        if emit_batch(sampled, result.end_s, Owner.GPU, self.rounds):
            self.running = retire_finished(self.running, self.hbm, self.finished)

    def check_invariants(self) -> None:
        seen = [r.req_id for q in (self.waiting, self.running, self.finished) for r in q]
        assert len(seen) == len(set(seen)) == self.n_submitted, "a request lost or duplicated"
        held = sum(len(r.blocks) for r in self.running)
        assert held == self.hbm.used, f"HBM accounting: held {held}, used {self.hbm.used}"
        assert all(not r.blocks and r.computed == 0 for r in self.waiting)
