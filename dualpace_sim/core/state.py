"""Shared request state: the only things the two engines share.

Request ownership, transfer readiness, future migration intent (marks and B_migration) and the
host-KV obligations of Eq. 2. Each engine mutates it only inside its own commit/apply steps, so
both backends (simulated or real) see the same sequence of states for the same decisions.
"""

from __future__ import annotations

from collections import deque
from itertools import chain

from .blocks import BlockPool
from .config import SchedulerConfig
from .envelope import envelope_fits
from .request import Owner, Request, RoundLog


def host_growth(r: Request) -> int:
    """The blocks (b̂ - b) a host-bound request may still add before its finish-peak."""
    growth = r.peak_blocks - len(r.blocks)
    return growth if growth > 0 else 0


class EngineState:
    """Queues, pools and published quantities of one serving node."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.hbm = BlockPool("HBM", config.gpu_kv_blocks)
        self.host = BlockPool("host", config.host_kv_blocks)
        self.gpu_waiting: deque[Request] = deque()  # prompts not yet admitted, FIFO
        self.gpu_prefilling: list[Request] = []  # admitted prompts whose prefill is under way
        self.gpu_running: list[Request] = []  # GPU ownership queue; eviction-priority tail last
        self.cpu_waiting: deque[Request] = deque()  # CPU-side queue, FIFO, may hold unready ones
        self.cpu_running: list[Request] = []  # the active CPU batch
        # Deferred swap-in marks (A.1 step 6b), by request id in the order placed: CPU-owned
        # requests whose future GPU rows and HBM a GPU round reserved. The one record of a
        # mark: `r.req_id in state.marked`.
        self.marked: dict[int, Request] = {}
        self.b_migration = 0  # B_migration, published by each GPU round
        self.cpu_growth = 0  # B_growth = Σ over cpu_running of (b̂ - b)
        # Σ context (prompt + generated) of cpu_running, what its next step attends to: a
        # round that keeps the frontier reads it instead of summing every row.
        self.cpu_context = 0
        # The same over the host-bound requests that are not CPU-running (host_growth): CPU
        # waiting (ready, swapping out or copying in) and Prefill-to-CPU prompts still
        # prefilling, kept up to date as they join and leave those queues.
        #
        # Eq. 3 reserves growth for CPU-running requests only, so as written a small host
        # filled by waiting requests can deadlock: none of them fits the CPU's budget, and none
        # leaves. The core also reserves theirs (docs/liveness.md): every request bound for
        # the host can then reach its finish-peak, whatever the interleaving.
        self.waiting_growth = 0
        # Σ finish-peak of the GPU ownership queue (gpu_running and the prefills bound for
        # HBM), kept up to date as requests join and leave it rather than summed every round.
        self.gpu_queue_peak = 0
        # Σ decode context of gpu_running (each request's KV length after its next step) and
        # the requests of gpu_running whose next step needs HBM blocks (Request.next_blocks >
        # 0), in queue order: a round of the whole queue reads them instead of a pass over
        # every row. The GPU round keeps both up to date as requests join, leave, decode and
        # get their blocks.
        self.gpu_context = 0
        self.gpu_growing: list[Request] = []
        self.copy_group: list[Request] = []  # Prefill-to-CPU requests whose copies are in flight
        self.finished: list[Request] = []
        self.rounds = RoundLog()  # when each engine emitted tokens (Request.spans index it)
        self.n_submitted = 0

    def state_row(self) -> tuple[int, ...]:
        """The occupancy a run's state log records after each core call, in the order of
        `results.node_series.STATE_COLUMNS`: prompts not yet admitted, prefills under way,
        the GPU and CPU running sets, the CPU waiting queue (migrations in flight included),
        both pools' used blocks, the host growth the envelope reserves (B_growth of every
        host-bound request) and B_migration."""
        return (len(self.gpu_waiting), len(self.gpu_prefilling), len(self.gpu_running),
                len(self.cpu_waiting), len(self.cpu_running), self.hbm.used, self.host.used,
                self.cpu_growth + self.waiting_growth, self.b_migration)

    # --- arrivals and transfer completions (both engines observe these) -------------------

    def submit(self, req: Request) -> None:
        """Every request enters through the GPU engine: all prefills run on the GPU."""
        self.gpu_waiting.append(req)
        self.n_submitted += 1

    def host_envelope_fits(self, planned: int = 0, migration: int | None = None) -> bool:
        """Eq. 2 with B_growth over every host-bound request (`waiting_growth` too)."""
        m = self.b_migration if migration is None else migration
        growth = self.cpu_growth + self.waiting_growth
        return envelope_fits(self.host.used, planned, growth, m, self.host.capacity)

    def cpu_owned_count(self) -> int:
        """Requests owned by, in transit to, or bound for the CPU engine (the host
        decode-admission limit): a chunked Prefill-to-CPU prompt counts from its first chunk."""
        bound = sum(1 for r in self.gpu_prefilling if r.to_cpu)
        return len(self.cpu_waiting) + len(self.cpu_running) + bound

    def complete_migrations(self, swap_outs: list[Request], swap_ins: list[Request], t: float):
        """Swap transfers landed: ownership flips and the source copies are released."""
        for r in swap_outs:
            r.owner, r.ready, r.transit_to = Owner.CPU, True, None
            r.migrations.append((t, "swap_out"))
        for r in swap_ins:
            self.host.release(r.source_blocks)
            r.source_blocks = []
            r.owner, r.ready, r.transit_to = Owner.GPU, True, None
            r.migrations.append((t, "swap_in"))

    def complete_copy_group(self, t: float) -> None:
        """The last layer of every Prefill-to-CPU copy landed: requests whose final chunk was in
        the group become ready; those still mid-prefill stay with the GPU."""
        done = [r for r in self.copy_group if r.transit_to is Owner.CPU]  # last chunks only
        self.copy_group = []
        gone = False
        for r in done:
            r.owner, r.ready, r.transit_to = Owner.CPU, True, None
            r.migrations.append((t, "prefill_to_cpu"))
            if r.finished:  # max_tokens == 1: the first token finished it
                self.waiting_growth -= host_growth(r)
                self.host.release(r.blocks)
                r.blocks = []
                self.finished.append(r)
                gone = True
        if gone:
            self.cpu_waiting = deque(r for r in self.cpu_waiting if not r.finished)

    # --- invariants (tests call this after every commit and apply) ------------------------

    def check_invariants(self) -> None:
        """Single ownership, pool accounting and the host envelope (Eq. 2)."""
        seen: dict[int, str] = {}
        queues = {
            "gpu_waiting": self.gpu_waiting, "gpu_prefilling": self.gpu_prefilling,
            "gpu_running": self.gpu_running, "cpu_waiting": self.cpu_waiting,
            "cpu_running": self.cpu_running, "finished": self.finished,
        }
        hbm_held = host_held = 0
        for name, queue in queues.items():
            for r in queue:
                assert r.req_id not in seen, f"request {r.req_id} in {seen[r.req_id]} and {name}"
                seen[r.req_id] = name
                if name == "finished":
                    assert r.finished and not r.blocks and not r.source_blocks, r.req_id
                    continue
                tier_is_gpu = name.startswith("gpu") and not (
                    name == "gpu_prefilling" and r.to_cpu
                )
                if tier_is_gpu:
                    hbm_held += len(r.blocks)
                    host_held += len(r.source_blocks)
                else:
                    host_held += len(r.blocks)
                if r.ready:
                    expected = Owner.GPU if name.startswith("gpu") else Owner.CPU
                    assert r.owner == expected, f"request {r.req_id} in {name} owned by {r.owner}"
                else:
                    assert r.transit_to is not None and r.owner != r.transit_to, r.req_id
        assert len(seen) == self.n_submitted, f"{self.n_submitted - len(seen)} requests lost"
        assert hbm_held == self.hbm.used, f"HBM accounting: held {hbm_held}, used {self.hbm.used}"
        assert host_held == self.host.used, f"host accounting: {host_held} vs {self.host.used}"
        self.check_running_totals()
        for i, r in self.marked.items():  # a mark: a CPU-owned request the CPU has not finished
            assert i == r.req_id and seen.get(i) in ("cpu_running", "cpu_waiting") and (
                r.owner == Owner.CPU), f"mark on request {i} in {seen.get(i)}, {r.owner}"
        assert self.host_envelope_fits(), (
            f"host envelope: used {self.host.used} + growth {self.cpu_growth} + waiting growth "
            f"{self.waiting_growth} + migration {self.b_migration} > capacity "
            f"{self.host.capacity}"
        )

    def check_running_totals(self) -> None:
        """The totals the rounds keep up to date instead of re-summing (B_growth, the CPU
        frontier's context, the waiting growth, the GPU queue's finish-peak and context, the
        growing list) against a full recomputation."""
        growth = sum(max(r.peak_blocks - len(r.blocks), 0) for r in self.cpu_running)
        assert growth == self.cpu_growth, f"B_growth {self.cpu_growth}, actual {growth}"
        cpu_context = sum(r.prompt_tokens + r.generated for r in self.cpu_running)
        assert cpu_context == self.cpu_context, (
            f"CPU context {self.cpu_context}, actual {cpu_context}")
        bound = chain(self.cpu_waiting, (r for r in self.gpu_prefilling if r.to_cpu))
        waiting = sum(host_growth(r) for r in bound)
        assert waiting == self.waiting_growth, (
            f"waiting growth {self.waiting_growth}, actual {waiting}")
        queue_peak = sum(r.peak_blocks for r in self.gpu_running) + sum(
            r.peak_blocks for r in self.gpu_prefilling if not r.to_cpu)
        assert queue_peak == self.gpu_queue_peak, (
            f"GPU queue peak {self.gpu_queue_peak}, actual {queue_peak}")
        context = sum(r.kv_tokens_after_step for r in self.gpu_running)
        assert context == self.gpu_context, f"GPU context {self.gpu_context}, actual {context}"
        bs = self.config.block_size
        growing = [r.req_id for r in self.gpu_running if r.next_blocks(bs)]
        kept = [r.req_id for r in self.gpu_growing]
        assert kept == growing, f"GPU growing {kept}, actual {growing} (in queue order)"
        needs = {r.next_blocks(bs) for r in self.gpu_growing}
        assert needs <= {1}, f"a growing request needs {max(needs)} blocks, not 1"
