"""The NEO policy on the shared core (BASELINES.md §A0-A4): GPU-gated asymmetric pipelining.

One engine loop forms each iteration: GPU decodes always run; swap-out at 100% of the GPU pool
from the tail, swap-in at 95% from the head (strict head-of-line); prefills go to the GPU until
the pool cannot hold the prompt, then all later ones to the CPU; CPU decodes join a sub-batch
only while NEO's overlap conditions (paper Eq. 1, with the launch term) hold; the pipelined
iteration is adopted only if its predicted rate beats GPU-only execution. CPU-resident requests
therefore advance only when the GPU iteration offers a long enough overlap window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from .blocks import BlockPool, retire_finished
from .plans import BlockMoves
from .request import Owner, Request, RoundLog, blocks_for, emit_batch


class NeoPredictor(Protocol):
    """NEO's per-layer performance tables (seconds), read by interpolation."""

    lnch_T: float  # CPU launch term added to every CPU-attention estimate

    def linr_T(self, width: int) -> float: ...  # all non-attention GPU work of one layer
    def pref_T(self, prompt: int) -> float: ...  # GPU prefill attention of one prompt
    def gdec_T(self, n: int, context: int) -> float: ...  # GPU paged decode attention
    def cdec_T(self, n: int, context: int) -> float: ...  # CPU paged decode attention


@dataclass(frozen=True, slots=True)
class NeoConfig:
    gpu_kv_blocks: int
    host_kv_blocks: int
    block_size: int = 16
    max_batch_size: int = 512
    max_tokens_in_batch: int = 3072
    itm_blocks: int | None = None  # staging pool for CPU-bound prefills; NEO: = GPU blocks
    linr_s_threshold: int = 128  # minimum sub-batch width when trimming prefills
    swap_in_fraction: float = 0.95
    launch_s: float | None = None  # lnch_T its predictor decides with; None: the profile's

    def __post_init__(self) -> None:
        for name in ("gpu_kv_blocks", "host_kv_blocks", "block_size", "max_batch_size",
                     "max_tokens_in_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"neo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.swap_in_fraction <= 1:
            raise ValueError(f"neo.swap_in_fraction must be in (0, 1], got "
                             f"{self.swap_in_fraction}")

    @property
    def max_request_blocks(self) -> int:
        """The pool a request's finish-peak must fit: the host's, where NEO's CPU queue
        decodes."""
        return self.host_kv_blocks


@dataclass(slots=True)
class _Budget:
    """NEO's ScheduleBudget: request slots and tokens; GPU decodes may overspend it."""

    slots: int
    tokens: int

    def take(self, tokens: int) -> bool:
        if self.slots >= 1 and self.tokens >= tokens:
            self.slots -= 1
            self.tokens -= tokens
            return True
        return False

    def refund(self, tokens: int) -> None:
        self.slots += 1
        self.tokens += tokens

    @property
    def overspent(self) -> bool:
        return self.slots < 0 or self.tokens < 0


@dataclass(slots=True)
class SubBatch:
    """One of NEO's sub-batches; the GPU runs its dense stages, the CPU its CPU attention.

    Aggregates are kept up to date as requests come and go, because NEO re-evaluates its overlap
    conditions after every tentative CPU decode and recomputing sums would be quadratic."""

    gpu_prefills: list[Request] = field(default_factory=list)
    cpu_prefills: list[Request] = field(default_factory=list)
    gpu_decodes: list[Request] = field(default_factory=list)
    cpu_decodes: list[Request] = field(default_factory=list)
    width: int = 0  # tokens through the dense stages: whole prompts plus one per decode
    pref: float = 0.0  # Σ pref_T over its prefills
    gdec_ctx: int = 0  # Σ KV tokens of its GPU decodes
    cdec_ctx: int = 0  # Σ KV tokens of its CPU decodes

    @classmethod
    def with_gpu_decodes(cls, decodes: list[Request], context: int | None = None) -> SubBatch:
        """A sub-batch of `decodes`; `context`: their Σ KV tokens where the caller keeps it."""
        if context is None:
            context = sum(r.kv_tokens_after_step for r in decodes)
        return cls(gpu_decodes=list(decodes), width=len(decodes), gdec_ctx=context)

    def copy(self) -> SubBatch:
        return SubBatch(list(self.gpu_prefills), list(self.cpu_prefills), list(self.gpu_decodes),
                        list(self.cpu_decodes), self.width, self.pref, self.gdec_ctx,
                        self.cdec_ctx)

    def add_prefill(self, r: Request, to_cpu: bool, p: NeoPredictor) -> None:
        (self.cpu_prefills if to_cpu else self.gpu_prefills).append(r)
        self.width += r.prompt_tokens
        self.pref += p.pref_T(r.prompt_tokens)

    def pop_cpu_prefill(self, p: NeoPredictor) -> Request:
        r = self.cpu_prefills.pop()
        self.width -= r.prompt_tokens
        self.pref -= p.pref_T(r.prompt_tokens)
        return r

    def add_cpu_decode(self, r: Request) -> None:
        self.cpu_decodes.append(r)
        self.width += 1
        self.cdec_ctx += r.kv_tokens_after_step

    def pop_cpu_decode(self) -> None:
        r = self.cpu_decodes.pop()
        self.width -= 1
        self.cdec_ctx -= r.kv_tokens_after_step

    @property
    def prefills(self) -> list[Request]:
        return self.gpu_prefills + self.cpu_prefills

    def __len__(self) -> int:  # requests, not tokens (NEO's len(SubBatch))
        return (len(self.gpu_prefills) + len(self.cpu_prefills) + len(self.gpu_decodes)
                + len(self.cpu_decodes))

    def gpu_attn(self, p: NeoPredictor) -> float:
        """Per-layer GPU attention: prefill attention plus GPU paged decode attention."""
        gdec = p.gdec_T(len(self.gpu_decodes), self.gdec_ctx) if self.gpu_decodes else 0.0
        return self.pref + gdec

    def gpu_time(self, p: NeoPredictor) -> float:
        """Per-layer GPU time: linear work plus GPU attention."""
        return p.linr_T(self.width) + self.gpu_attn(p)

    def cpu_time(self, p: NeoPredictor) -> float:
        """Per-layer CPU attention plus the launch term (charged even with no CPU decode)."""
        n = len(self.cpu_decodes)
        return (p.cdec_T(n, self.cdec_ctx) if n else 0.0) + p.lnch_T


def _remains(b0: SubBatch, b1: SubBatch, p: NeoPredictor) -> tuple[float, float]:
    """Slack of NEO's two overlap conditions (paper Eq. 1 with the launch term):
    remains[j] = linr(s_{1-j}) + pref_j + gdec_j - (cdec_j + lnch)."""
    return (p.linr_T(b1.width) + b0.gpu_attn(p) - b0.cpu_time(p),
            p.linr_T(b0.width) + b1.gpu_attn(p) - b1.cpu_time(p))


@dataclass(slots=True)
class NeoPlan:
    """One NEO iteration: [] nothing runs, [b] GPU-only, [b0, b1] pipelined."""

    batches: list[SubBatch] = field(default_factory=list)
    swap_outs: list[Request] = field(default_factory=list)
    swap_ins: list[Request] = field(default_factory=list)
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    moves: BlockMoves = field(default_factory=BlockMoves)  # the swaps' block ids, once committed

    @property
    def pipelined(self) -> bool:
        return len(self.batches) == 2

    @property
    def is_empty(self) -> bool:
        return not (self.batches or self.swap_outs or self.swap_ins)


def layer_time(plan: NeoPlan, p: NeoPredictor) -> float:
    """Per-layer time of the iteration (BASELINES §A4): GPU-only runs gpu_time; pipelined runs
    two stages, each max(GPU part, CPU part + launch)."""
    if not plan.batches:
        return 0.0
    if not plan.pipelined:
        return plan.batches[0].gpu_time(p)
    b0, b1 = plan.batches
    stage0 = max(p.linr_T(b0.width), b1.cpu_time(p))
    stage1 = max(p.linr_T(b1.width) + b0.gpu_attn(p), b0.cpu_time(p))
    return stage0 + stage1


class NeoHostFull(RuntimeError):
    """NEO's host pool cannot take what an iteration moves there. NEO sizes the host as swap
    space and never checks it: its swap-outs and CPU decodes grow without bound, so a host
    that is small for the load overflows. The message is one line saying what to enlarge."""


class NeoScheduler:
    """The three NEO queues over an HBM pool and a host pool."""

    def __init__(self, config: NeoConfig, predictor: NeoPredictor) -> None:
        self.config = config
        self.p = predictor
        self.hbm = BlockPool("HBM", config.gpu_kv_blocks)
        self.host = BlockPool("host", config.host_kv_blocks)
        self.waiting: deque[Request] = deque()
        self.gpu_q: list[Request] = []
        self.cpu_q: deque[Request] = deque()
        # Σ _blocks over cpu_q, kept up to date as requests join, leave and decode there: the
        # CPU threshold reads it every iteration, and the queue grows past saturation.
        self.cpu_q_blocks = 0
        # The GPU queue's running totals, for the same reason: at saturation it holds ~26
        # decodes, and every iteration reads their Σ blocks (the swap thresholds), their Σ KV
        # (GPU decode attention) and how many need a new block. Σ _blocks and Σ KV over gpu_q:
        self.gpu_q_blocks = 0
        self.gpu_q_kv = 0
        # Every request in gpu_q gets one token per forward iteration, so its KV length less
        # the count of those iterations (`gpu_steps`) is fixed while it stays there; the
        # requests are counted by that difference modulo the block size, so an iteration
        # knows in one read how many of them cross into a new block.
        self.gpu_steps = 0
        self.gpu_q_by_phase = [0] * config.block_size
        self.finished: list[Request] = []
        self.rounds = RoundLog()  # when each engine emitted tokens (Request.spans index it)
        self.n_submitted = 0

    def submit(self, req: Request) -> None:
        self.waiting.append(req)
        self.n_submitted += 1

    def state_row(self) -> tuple[int, ...]:
        """`EngineState.state_row`'s columns: the waiting queue and the GPU and CPU decoding
        queues; what NEO does not have is 0."""
        return (len(self.waiting), 0, len(self.gpu_q), 0, len(self.cpu_q), self.hbm.used,
                self.host.used, 0, 0)

    def _blocks(self, r: Request) -> int:
        """_get_block_needed: blocks for the KV this iteration leaves behind."""
        return blocks_for(r.kv_tokens_after_step, self.config.block_size)

    def count_gpu(self, r: Request, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) r's share of the GPU queue's running totals, as it
        joins or leaves gpu_q."""
        kv = r.prompt_tokens + r.generated
        self.gpu_q_blocks += sign * blocks_for(kv, self.config.block_size)
        self.gpu_q_kv += sign * kv
        self.gpu_q_by_phase[(kv - self.gpu_steps) % self.config.block_size] += sign

    # ----------------------------------------------------------------- one iteration

    def schedule(self, now: float) -> NeoPlan:
        """Decide and commit one iteration (NEO's get_next_batch mutates its queues too)."""
        cfg, bs = self.config, self.config.block_size
        plan = NeoPlan()
        budget = _Budget(cfg.max_batch_size, cfg.max_tokens_in_batch)
        swap_in_threshold = round(cfg.swap_in_fraction * cfg.gpu_kv_blocks)
        cpu_threshold = cfg.host_kv_blocks - cfg.gpu_kv_blocks
        itm_blocks = cfg.gpu_kv_blocks if cfg.itm_blocks is None else cfg.itm_blocks
        # GPU decodes always run.
        gpu_needed = self.gpu_q_blocks
        budget.slots -= len(self.gpu_q)
        budget.tokens -= len(self.gpu_q)
        # Swap-out from the tail at 100%; victims go to the CPU queue's head in arrival order.
        while self.gpu_q and (budget.overspent or gpu_needed > cfg.gpu_kv_blocks):
            r = self.gpu_q.pop()
            self.count_gpu(r, -1)
            self.cpu_q.appendleft(r)
            gpu_needed -= self._blocks(r)
            self.cpu_q_blocks += self._blocks(r)
            budget.refund(1)
            plan.swap_outs.append(r)
        # Swap-in from the head at 95%, strict head-of-line, never in a swap-out iteration.
        while not plan.swap_outs and self.cpu_q:
            head = self.cpu_q[0]
            if gpu_needed + self._blocks(head) > swap_in_threshold or not budget.take(1):
                break
            self.gpu_q.append(self.cpu_q.popleft())
            self.count_gpu(head, 1)
            gpu_needed += self._blocks(head)
            self.cpu_q_blocks -= self._blocks(head)
            plan.swap_ins.append(head)
        # Prefill candidates, FCFS; the first CPU-bound prompt sends all later ones to the CPU.
        itm_needed = 0
        cpu_needed = self.cpu_q_blocks
        b0 = SubBatch.with_gpu_decodes(self.gpu_q, self.gpu_q_kv)
        for r in self.waiting:
            blk = blocks_for(r.prompt_tokens, bs)
            if itm_needed + blk > itm_blocks or cpu_needed + blk > cpu_threshold:
                break
            if not budget.take(r.prompt_tokens):
                break
            if not b0.cpu_prefills and gpu_needed + blk <= cfg.gpu_kv_blocks:
                b0.add_prefill(r, False, self.p)
                gpu_needed += blk
            else:
                b0.add_prefill(r, True, self.p)
                itm_needed += blk
                cpu_needed += blk
        plan.batches = self._decide_mode(b0, budget)
        self._commit(plan, now)
        return plan

    def _decide_mode(self, b0: SubBatch, budget: _Budget) -> list[SubBatch]:
        """_decide_mode_and_gen_batch: pipelined [b0, b1] or GPU-only [b], or nothing."""
        cfg, p = self.config, self.p
        if not len(b0) and cfg.gpu_kv_blocks > 0:
            return []  # nothing on the GPU: nothing runs, even with CPU decodes waiting
        gpu_only = b0.copy()
        while gpu_only.cpu_prefills:  # keep CPU prefills only to hold the width >= 128
            if gpu_only.width - gpu_only.cpu_prefills[-1].prompt_tokens < cfg.linr_s_threshold:
                break
            gpu_only.pop_cpu_prefill(p)
        b1 = self._scan_cpu_queue(b0, budget)
        if not b1.cpu_decodes:
            return [gpu_only]
        while b0.cpu_prefills:  # CPU prefills survive only as cover or to hold the width
            last = b0.pop_cpu_prefill(p)
            if b0.width < cfg.linr_s_threshold or min(_remains(b0, b1, p)) < 0:
                b0.add_prefill(last, True, p)
                break
        seq_rate = len(gpu_only) / gpu_only.gpu_time(p)
        pipe_rate = (len(b0) + len(b1)) / (b0.gpu_time(p) + b1.gpu_time(p))
        return [b0, b1] if seq_rate < pipe_rate else [gpu_only]

    def _scan_cpu_queue(self, b0: SubBatch, budget: _Budget) -> SubBatch:
        """NEO's candidate walk over the CPU queue in order: each request joins b0 or b1 (the
        one with more slack) while both overlap conditions hold; after a rejection only shorter
        requests are tried. Fills b0 and returns b1."""
        p, b1 = self.p, SubBatch()
        linr_T, cdec_T, lnch = p.linr_T, p.cdec_T, p.lnch_T
        nxt, min_out = 1, None
        # The scan adds CPU decodes only, so each candidate changes its target sub-batch's
        # width (the other's linr term) and CPU time; both GPU-attention terms stay fixed.
        # _remains, from those terms: remains[j] = linr(s_{1-j}) + gpu_attn_j - cpu_time_j.
        # A tentative decode is tried on these plain numbers (width, CPU decodes, their Σ KV)
        # and only an admitted one joins its sub-batch: at saturation a scan tries ~13
        # candidates, and in ~3 % of iterations it admits hundreds.
        attn = (b0.gpu_attn(p), b1.gpu_attn(p))
        width = [b0.width, b1.width]
        n = [len(b0.cpu_decodes), 0]
        ctx = [b0.cdec_ctx, 0]
        linr = [linr_T(width[0]), linr_T(width[1])]
        cpu = [b0.cpu_time(p), b1.cpu_time(p)]
        joined: tuple[list[Request], list[Request]] = ([], [])
        slots, tokens = budget.slots, budget.tokens
        for r in self.cpu_q:
            if slots < 1 or tokens < 1:  # budget.take(1) would fail
                break
            kv = r.prompt_tokens + r.generated
            if min_out is not None and kv >= min_out:
                continue  # (take and refund: the budget is unchanged)
            j = nxt
            # SubBatch.cpu_time of the target with r added (n >= 1, so its cdec_T is read)
            linr_j, cpu_j = linr_T(width[j] + 1), cdec_T(n[j] + 1, ctx[j] + kv) + lnch
            if j:
                rem = (linr_j + attn[0] - cpu[0], linr[0] + attn[1] - cpu_j)
            else:
                rem = (linr[1] + attn[0] - cpu_j, linr_j + attn[1] - cpu[1])
            if min(rem) < 0:  # rejected: take and refund leave the budget as it was
                if rem[1 - j] < 0:
                    # The other sub-batch's slack moved only with the target's width, which any
                    # candidate grows by one: every later one fails it too, is refunded and
                    # changes nothing, so the rest of the queue (hundreds of requests at
                    # saturation) is not walked.
                    break
                min_out = kv  # every longer request is skipped from now on
                continue
            slots -= 1
            tokens -= 1
            width[j] += 1
            n[j] += 1
            ctx[j] += kv
            linr[j], cpu[j] = linr_j, cpu_j
            joined[j].append(r)
            nxt = 1 if rem[1] > rem[0] else 0
        budget.slots, budget.tokens = slots, tokens
        for b, rs, j in ((b0, joined[0], 0), (b1, joined[1], 1)):
            if rs:
                b.cpu_decodes.extend(rs)
                b.width, b.cdec_ctx = width[j], ctx[j]
        return b1

    def _commit(self, plan: NeoPlan, now: float) -> None:
        """Move blocks for swaps, pop the surviving FCFS prefix of prefills, allocate KV."""
        bs = self.config.block_size
        cpu_growing = self._check_host(plan)
        moved: dict[str, tuple[list[int], list[int]]] = {"swap_out": ([], []),
                                                          "swap_in": ([], [])}
        for kind, reqs, src, dst, owner in (
                ("swap_out", plan.swap_outs, self.hbm, self.host, Owner.CPU),
                ("swap_in", plan.swap_ins, self.host, self.hbm, Owner.GPU)):
            for r in reqs:
                moved[kind][0].extend(r.blocks)
                src.release(r.blocks)
                r.blocks = dst.allocate(len(r.blocks))
                moved[kind][1].extend(r.blocks)
                r.owner = owner
                r.migrations.append((now, kind))
        plan.swap_out_blocks = len(moved["swap_out"][0])
        plan.swap_in_blocks = len(moved["swap_in"][0])
        plan.moves = BlockMoves(moved["swap_out"], moved["swap_in"])
        # gpu_q now holds this iteration's GPU decodes and HBM their blocks: the blocks their
        # KV needs beyond those are the ones to add (Σ of next_blocks, without a walk).
        gpu_growth = self.gpu_q_blocks - self.hbm.used
        for b, growing in zip(plan.batches, cpu_growing, strict=True):
            for r in b.gpu_prefills:
                self.waiting.popleft()
                r.blocks = self.hbm.allocate(blocks_for(r.prompt_tokens, bs))
                self.gpu_q.append(r)
                self.count_gpu(r, 1)
            for r in b.cpu_prefills:
                self.waiting.popleft()
                r.blocks = self.host.allocate(blocks_for(r.prompt_tokens, bs))
                r.owner = Owner.CPU
                r.migrations.append((now, "prefill_to_cpu"))
                self.cpu_q.append(r)
                self.cpu_q_blocks += self._blocks(r)
            if gpu_growth:  # in gpu_q's order, until all gpu_growth blocks are handed out
                for r in b.gpu_decodes:
                    if r.next_blocks(bs):
                        r.blocks.extend(self.hbm.allocate(1))
                        gpu_growth -= 1
                        if not gpu_growth:
                            break
            for r in growing:
                r.blocks.extend(self.host.allocate(1))

    def _check_host(self, plan: NeoPlan) -> list[list[Request]]:
        """NeoHostFull before anything moves if the host cannot take this iteration's
        swap-outs, CPU prefills and CPU decodes' next blocks (swap-ins free host blocks only
        once they have moved, so they do not count). Returns each sub-batch's CPU decodes
        that need a block (a decode appends one token, so one block at most)."""
        bs = self.config.block_size
        need = sum(len(r.blocks) for r in plan.swap_outs)
        growing = []
        for b in plan.batches:
            need += sum(blocks_for(r.prompt_tokens, bs) for r in b.cpu_prefills)
            grow = [r for r in b.cpu_decodes
                    if -(-(r.prompt_tokens + r.generated) // bs) > len(r.blocks)]
            need += len(grow)
            growing.append(grow)
        if need > self.host.free + sum(len(r.blocks) for r in plan.swap_ins):
            raise NeoHostFull(
                f"NEO's host pool is full: an iteration needs {need} more blocks and "
                f"{self.host.free} of {self.host.capacity} are free; NEO treats the host as swap "
                "space and never bounds what it moves there, so enlarge "
                "scheduler.host_kv_blocks (or lower the load)")
        return growing

    def apply(self, plan: NeoPlan, end_s: float) -> None:
        """Every request in the iteration gets exactly one token."""
        bs, done = self.config.block_size, False
        on_cpu = [r for b in plan.batches for r in b.cpu_prefills + b.cpu_decodes]
        # Each KV grows by one token: a KV of k tokens takes a new block when k % bs == 0.
        self.cpu_q_blocks += sum(1 for r in on_cpu if (r.prompt_tokens + r.generated) % bs == 0)
        if plan.batches:  # every request in gpu_q is a GPU row of this iteration
            self.gpu_q_kv += len(self.gpu_q)
            self.gpu_q_blocks += self.gpu_q_by_phase[-self.gpu_steps % bs]
            self.gpu_steps += 1
        for b in plan.batches:
            done |= emit_batch(b.prefills + b.gpu_decodes, end_s, Owner.GPU, self.rounds)
            done |= emit_batch(b.cpu_decodes, end_s, Owner.CPU, self.rounds)
        if done:
            before = len(self.finished)
            self.gpu_q = retire_finished(self.gpu_q, self.hbm, self.finished)
            for r in self.finished[before:]:
                self.count_gpu(r, -1)
            # Only this iteration's CPU rows can have finished in cpu_q, which holds hundreds
            # of requests at saturation: it is rebuilt only when one of them did.
            if any(r.finished for r in on_cpu):
                before = len(self.finished)
                self.cpu_q = deque(retire_finished(self.cpu_q, self.host, self.finished))
                self.cpu_q_blocks -= sum(self._blocks(r) for r in self.finished[before:])

    def check_invariants(self) -> None:
        queues = (self.waiting, self.gpu_q, self.cpu_q, self.finished)
        seen = [r.req_id for q in queues for r in q]
        assert len(seen) == len(set(seen)) == self.n_submitted, "a request lost or duplicated"
        assert sum(len(r.blocks) for r in self.gpu_q) == self.hbm.used, "HBM accounting"
        assert sum(len(r.blocks) for r in self.cpu_q) == self.host.used, "host accounting"
        assert all(r.owner == Owner.GPU for r in self.gpu_q)
        assert all(r.owner == Owner.CPU for r in self.cpu_q)
        # apply rebuilds cpu_q only when one of its iteration's CPU rows finished
        assert not any(r.finished for r in self.cpu_q), "a finished request left in cpu_q"
        cpu_blocks = sum(self._blocks(r) for r in self.cpu_q)
        assert cpu_blocks == self.cpu_q_blocks, (
            f"Σ blocks of cpu_q {self.cpu_q_blocks}, actual {cpu_blocks}")
        # the GPU queue's running totals against a full recomputation
        bs = self.config.block_size
        gpu_blocks = sum(self._blocks(r) for r in self.gpu_q)
        assert gpu_blocks == self.gpu_q_blocks, (
            f"Σ blocks of gpu_q {self.gpu_q_blocks}, actual {gpu_blocks}")
        gpu_kv = sum(r.kv_tokens_after_step for r in self.gpu_q)
        assert gpu_kv == self.gpu_q_kv, f"Σ KV of gpu_q {self.gpu_q_kv}, actual {gpu_kv}"
        phases = [0] * bs
        for r in self.gpu_q:
            phases[(r.kv_tokens_after_step - self.gpu_steps) % bs] += 1
        assert phases == self.gpu_q_by_phase, (
            f"gpu_q by phase {self.gpu_q_by_phase}, actual {phases}")
