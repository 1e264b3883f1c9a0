"""The DualPace CPU engine round (paper Appendix A.2, steps 1-5).

The CPU engine advances host-resident decodes on its own clock. It trusts the B_migration the
GPU last published and never bypasses an unready head of its waiting queue.
"""

from __future__ import annotations

from .blocks import retire_finished
from .plans import CpuPlan, CpuResult
from .request import Owner, Request, emit_batch
from .routing import route_for
from .state import EngineState, host_growth


class CpuScheduler:
    """Forms CPU decode batches over host-resident requests."""

    def __init__(self, state: EngineState) -> None:
        self.state = state

    def schedule(self) -> CpuPlan:
        """Decide the next batch without mutating the shared state."""
        st, cfg = self.state, self.state.config
        # 1. Local admission budget: what the envelope leaves after materialized use and the
        #    migration reserve. Each selected request consumes its whole remaining growth
        #    (b̂ - b), which covers its next-token block too.
        budget = st.host.capacity - st.host.used - st.b_migration
        limit = cfg.cpu_batch_limit
        batch: list[Request] = []
        held_back: list[Request] = []  # yielded (marked) or past the frontier boundary
        # 2. Preserve the running frontier, FIFO. Without marks, a frontier within the batch
        #    limit whose whole growth (the running B_growth) fits keeps every row, as the walk
        #    would find row by row: most rounds take that path.
        running = st.cpu_running
        if not st.marked and len(running) <= limit and st.cpu_growth <= budget:
            batch = list(running)
            budget -= st.cpu_growth
            context = st.cpu_context
        else:
            boundary, context = False, 0
            for r in running:
                if r.req_id in st.marked:
                    held_back.append(r)
                    continue
                growth = r.peak_blocks - len(r.blocks)
                if boundary or len(batch) >= limit or growth > budget:
                    boundary = True
                    held_back.append(r)
                    continue
                batch.append(r)
                budget -= growth
                context += r.prompt_tokens + r.generated
        # 3. Admit the ready waiting prefix, only when the frontier stayed intact.
        admitted = 0
        if not held_back:
            for r in st.cpu_waiting:
                if len(batch) >= limit or not r.ready or r.req_id in st.marked:
                    break
                growth = r.peak_blocks - len(r.blocks)
                if growth > budget:
                    break
                batch.append(r)
                budget -= growth
                context += r.prompt_tokens + r.generated
                admitted += 1
        plan = CpuPlan(
            batch=batch,
            route=route_for(len(batch), cfg.route_p, cfg.route_f),
            context=context,
            held_back=held_back,
            admitted=admitted,
        )
        # 4. Wait on readiness (or on the GPU taking a marked head) rather than bypassing it.
        if not batch and st.cpu_waiting:
            head = st.cpu_waiting[0]
            if not head.ready or head.req_id in st.marked:
                plan.wait_for = head
        return plan

    def commit(self, plan: CpuPlan) -> None:
        """5. Materialize only the next-token blocks; finish-peak stays a reservation."""
        st, bs = self.state, self.state.config.block_size
        if plan.held_back:
            st.cpu_waiting.extendleft(reversed(plan.held_back))
            st.waiting_growth += sum(host_growth(r) for r in plan.held_back)
        for _ in range(plan.admitted):
            st.waiting_growth -= host_growth(st.cpu_waiting.popleft())
        growth = 0
        host = st.host
        for r in plan.batch:  # Request.next_blocks, inline: this runs for every row of every round
            blocks = r.blocks
            if r.prompt_tokens + r.generated > len(blocks) * bs:
                blocks.extend(host.allocate(-(-(r.prompt_tokens + r.generated) // bs)
                                            - len(blocks)))
            growth += r.peak_blocks - len(blocks)
        st.cpu_running = list(plan.batch)
        st.cpu_growth = growth
        st.cpu_context = plan.context

    def apply(self, plan: CpuPlan, result: CpuResult) -> None:
        """Record sampled tokens; finished requests release their host KV."""
        st, t = self.state, result.end_s
        if emit_batch(plan.batch, t, Owner.CPU, st.rounds):
            st.cpu_running = retire_finished(st.cpu_running, st.host, st.finished)
            st.cpu_growth = sum(r.peak_blocks - len(r.blocks) for r in st.cpu_running)
            st.cpu_context = sum(r.prompt_tokens + r.generated for r in st.cpu_running)
            # a marked request that finished on the CPU needs no swap-in
            st.marked = {i: r for i, r in st.marked.items() if not r.finished}
        else:  # each row attends to one more token next step
            st.cpu_context += len(plan.batch)
