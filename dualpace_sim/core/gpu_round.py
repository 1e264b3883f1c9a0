"""The DualPace GPU engine round (paper Appendix A.1, steps 1-7).

`schedule()` decides without mutating anything; `commit()` materializes the decision (block
allocations, queue moves, ownership hand-offs); the backend executes the plan and calls
`apply()` with the result. Step numbers in comments refer to Appendix A.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

from .blocks import retire_finished
from .envelope import envelope_fits, extend_reserve, migration_reserve, tail_reserve
from .plans import BlockMoves, GpuPlan, GpuResult, PrefillChunk
from .request import Owner, Request, blocks_for, emit_batch
from .state import EngineState, host_growth


@dataclass(slots=True)
class _Budget:
    """Running totals of one GPU round's candidate batch."""

    rows: int
    tokens: int
    hbm: int  # HBM blocks still free for this round's allocations
    peak: int  # Σ finish-peak of the GPU ownership queue plus marked requests
    queue_peak: int  # Σ finish-peak of the GPU ownership queue only (Eq. 4)
    migration: int  # B_migration for the queue as decided so far
    host_planned: int = 0  # B_planned: host blocks this round will allocate
    host_growth: int = 0  # B_growth over every host-bound request, this round's included
    staging: int = 0  # single-layer staging blocks still free
    new_cpu: int = 0  # requests this round sends to the CPU


class GpuScheduler:
    """Forms GPU rounds over the shared state; owns prefills and GPU-resident decodes."""

    def __init__(self, state: EngineState) -> None:
        self.state = state

    # ----------------------------------------------------------------- schedule (decide)

    def schedule(self) -> GpuPlan:
        st, cfg = self.state, self.state.config
        plan = GpuPlan()
        # 1. Transfer-safe frontier: staging blocks are reused only after the last copy group.
        if st.copy_group:
            plan.wait_for_copies = True
            return plan

        # 2. Restore next-token HBM feasibility.
        relieved = self._restore_feasibility(plan)
        if relieved is None:  # partial relief: a migration-only round
            return plan
        decodes, hbm_left, context = relieved

        # 3. Reserve host space for future GPU evictions (B_migration over the queue).
        budget = self._budget(plan, decodes, hbm_left)
        plan.decodes = list(decodes)

        # 4. Admit GPU decodes (done above) and relieve a saturated CPU tier.
        no_swap_out = not plan.swap_outs
        waiting_was_empty = not st.cpu_waiting
        if no_swap_out and len(st.cpu_running) >= cfg.cpu_batch_limit and st.cpu_waiting:
            self._swap_in_pass(plan, budget)

        # 5. Admit prefills in FIFO order and choose their decode residency.
        self._admit_prefills(plan, budget)

        # 6. Use residual HBM for additional swap-in, or mark CPU-running requests.
        if no_swap_out:
            self._swap_in_pass(plan, budget)
            if waiting_was_empty:
                self._place_marks(plan, budget)

        plan.migration_reserve = budget.migration
        swapped_in = plan.decodes[len(decodes):]
        plan.decode_context = context + sum(r.kv_tokens_after_step for r in swapped_in)
        return plan

    def _restore_feasibility(self, plan: GpuPlan) -> tuple[list[Request], int, int] | None:
        """Step 2, from the running totals of the queue (the requests whose next step needs
        blocks, and the Σ decode context): swap out victims for the HBM deficit, or run the
        decode subset whose growth fits. Returns the round's decodes, the HBM left after their
        growth and their Σ context; None when the victims only partly relieve the deficit
        (the plan is then a migration-only round)."""
        st, cfg = self.state, self.state.config
        bs = cfg.block_size
        running = st.gpu_running
        grow = len(st.gpu_growing)  # a step appends one token: each needs exactly one block
        hbm_free = st.hbm.free
        deficit = grow - hbm_free
        decodes = running
        if deficit > 0:
            needs = [r.next_blocks(bs) for r in running]
            victims, freed = self._choose_victims(deficit, needs)
            if victims and freed < deficit:
                self._with_swap_outs(plan, victims)
                return None
            if victims:
                self._with_swap_outs(plan, victims)
                gone = {id(v) for v in victims}
                decodes = [r for r in running if id(r) not in gone]
                hbm_free += sum(len(v.blocks) for v in victims)
            else:  # nothing evictable: run the decode subset whose growth fits
                decodes, room = [], hbm_free
                for r, n in zip(running, needs, strict=True):
                    if n <= room:
                        decodes.append(r)
                        room -= n
        rows = min(cfg.gpu_max_rows, cfg.gpu_hard_token_limit)
        if decodes is running and len(running) <= rows:  # the whole queue: the totals
            return decodes, hbm_free - grow, st.gpu_context
        decodes = decodes[:rows]
        return (decodes, hbm_free - sum(r.next_blocks(bs) for r in decodes),
                sum(r.kv_tokens_after_step for r in decodes))

    def _budget(self, plan: GpuPlan, decodes: list[Request], hbm_left: int) -> _Budget:
        """Step 3: what steps 4-6 may still spend, with B_migration from the running Σ
        finish-peak of the queue and a scan of its eviction tail."""
        st, cfg = self.state, self.state.config
        victims = plan.swap_outs
        queue_peak = st.gpu_queue_peak - sum(v.peak_blocks for v in victims)
        marks = st.marked.values()
        marked_peak = sum(r.peak_blocks for r in marks)
        return _Budget(
            rows=len(decodes) + len(st.marked),
            tokens=len(decodes) + len(st.marked),
            hbm=hbm_left - sum(len(r.blocks) + 1 for r in marks),
            peak=queue_peak + marked_peak,
            queue_peak=queue_peak,
            migration=tail_reserve(self._tail_peaks(victims), queue_peak, cfg.gpu_kv_blocks)
            if queue_peak > cfg.gpu_kv_blocks else 0,  # a queue that fits HBM reserves nothing
            host_planned=plan.swap_out_blocks,  # swap-outs are same-round host allocations
            host_growth=st.cpu_growth + st.waiting_growth + sum(
                v.peak_blocks - len(v.blocks) for v in victims),
            staging=cfg.staging_blocks,
        )

    def _tail_peaks(self, victims: list[Request]) -> Iterator[int]:
        """Finish-peaks of the GPU ownership queue (running, then prefilling towards HBM) from
        its eviction tail, without this round's swap-out victims."""
        st = self.state
        for r in reversed(st.gpu_prefilling):
            if not r.to_cpu:
                yield r.peak_blocks
        if victims:
            gone = {id(v) for v in victims}
            for r in reversed(st.gpu_running):
                if id(r) not in gone:
                    yield r.peak_blocks
        else:
            for r in reversed(st.gpu_running):
                yield r.peak_blocks

    def _choose_victims(self, deficit: int, needs: list[int]) -> tuple[list[Request], int]:
        """Scan from the eviction tail; skip victims the host envelope cannot take."""
        st, cfg = self.state, self.state.config
        running = st.gpu_running
        prefill_peaks = [r.peak_blocks for r in st.gpu_prefilling if not r.to_cpu]
        chosen: set[int] = set()
        planned = freed = 0
        growth = st.cpu_growth + st.waiting_growth  # a victim's growth joins it on the host
        for i in range(len(running) - 1, -1, -1):
            if freed >= deficit:
                break
            r = running[i]
            size = len(r.blocks)
            if size > st.host.free - planned:
                continue
            rest = [x.peak_blocks for j, x in enumerate(running) if j != i and j not in chosen]
            reserve = migration_reserve(rest + prefill_peaks, cfg.gpu_kv_blocks)
            victim_growth = r.peak_blocks - size
            if not envelope_fits(
                st.host.used, planned + size, growth + victim_growth, reserve, st.host.capacity
            ):
                continue
            chosen.add(i)
            planned += size
            growth += victim_growth
            freed += size + needs[i]
        victims = [running[i] for i in sorted(chosen)]
        return victims, freed

    def _with_swap_outs(self, plan: GpuPlan, victims: list[Request]) -> GpuPlan:
        plan.swap_outs = victims
        plan.swap_out_blocks = sum(len(v.blocks) for v in victims)
        if not plan.has_forward:  # the migration-only round still publishes B_migration
            gone = {id(v) for v in victims}
            queue = [r for r in self.state.gpu_running if id(r) not in gone]
            queue += [r for r in self.state.gpu_prefilling if not r.to_cpu]
            plan.migration_reserve = migration_reserve(
                (r.peak_blocks for r in queue), self.state.config.gpu_kv_blocks
            )
        return plan

    def _swap_in_pass(self, plan: GpuPlan, budget: _Budget) -> None:
        """Swap in a ready FIFO prefix of the CPU waiting queue that stays GPU-resident to the
        end: next-token HBM and its finish-peak must both fit."""
        st, cfg = self.state, self.state.config
        bs, cap = cfg.block_size, cfg.gpu_kv_blocks
        waiting = st.cpu_waiting
        i = len(plan.swap_ins)
        while i < len(waiting):
            r = waiting[i]
            if not r.ready or r.owner != Owner.CPU:
                break
            if r.req_id in st.marked:  # give back what the mark reserved before re-checking
                budget.rows -= 1
                budget.tokens -= 1
                budget.hbm += len(r.blocks) + 1
                budget.peak -= r.peak_blocks
            size = len(r.blocks) + r.next_blocks(bs)
            fits = (
                budget.rows < cfg.gpu_max_rows
                and budget.tokens < cfg.gpu_batch_tokens
                and size <= budget.hbm
                and budget.peak + r.peak_blocks <= cap
            )
            if not fits:
                if r.req_id in st.marked:
                    budget.rows += 1
                    budget.tokens += 1
                    budget.hbm -= len(r.blocks) + 1
                    budget.peak += r.peak_blocks
                break
            budget.rows += 1
            budget.tokens += 1
            budget.hbm -= size
            budget.peak += r.peak_blocks
            budget.migration = extend_reserve(
                budget.migration, budget.queue_peak, r.peak_blocks, cap
            )
            budget.queue_peak += r.peak_blocks
            plan.swap_ins.append(r)
            plan.swap_in_blocks += len(r.blocks)
            plan.decodes.append(r)
            i += 1

    def _admit_prefills(self, plan: GpuPlan, budget: _Budget) -> None:
        """Step 5: FIFO prompts under the row, token and staging limits; once the first prompt
        goes to the CPU, later prompts of the round follow it (no smaller prompt bypasses)."""
        st, cfg = self.state, self.state.config
        bs, cap = cfg.block_size, cfg.gpu_kv_blocks
        to_cpu_chosen = False
        for r in chain(st.gpu_prefilling, st.gpu_waiting):
            room = cfg.gpu_batch_tokens - budget.tokens
            if budget.rows >= cfg.gpu_max_rows or room <= 0:
                break
            remaining = r.prompt_tokens - r.prefilled
            chunk = min(remaining, room)
            is_new = not r.blocks
            if is_new:
                size = blocks_for(r.prompt_tokens, bs)
                to_cpu = to_cpu_chosen or size > budget.hbm
                if to_cpu:
                    if st.cpu_owned_count() + budget.new_cpu >= cfg.host_max_requests:
                        break
                    growth = r.peak_blocks - size  # reserved now: it must reach its peak
                    if not envelope_fits(
                        st.host.used, budget.host_planned + size, budget.host_growth + growth,
                        budget.migration, st.host.capacity,
                    ):
                        break
                    staging = blocks_for(chunk, bs)
                    if staging > budget.staging:
                        break
                    budget.host_planned += size
                    budget.host_growth += growth
                    budget.staging -= staging
                    budget.new_cpu += 1
                    to_cpu_chosen = True
                else:
                    reserve = extend_reserve(
                        budget.migration, budget.queue_peak, r.peak_blocks, cap
                    )
                    if not envelope_fits(
                        st.host.used, budget.host_planned, budget.host_growth, reserve,
                        st.host.capacity,
                    ):
                        break
                    budget.hbm -= size
                    budget.migration = reserve
                    budget.queue_peak += r.peak_blocks
                    budget.peak += r.peak_blocks
            else:  # a continuing chunk keeps its destination; host-bound ones lead later prompts
                to_cpu = r.to_cpu
                if to_cpu:
                    staging = blocks_for(chunk, bs)
                    if staging > budget.staging:
                        break
                    budget.staging -= staging
                    to_cpu_chosen = True
            budget.rows += 1
            budget.tokens += chunk
            last = chunk == remaining
            plan.prefills.append(PrefillChunk(r, r.prefilled, chunk, to_cpu, last))
            if not last:  # a chunked prompt takes the rest of the token budget
                break

    def _place_marks(self, plan: GpuPlan, budget: _Budget) -> None:
        """Deferred swap-in: reserve future GPU rows, tokens and finish-peak HBM for CPU-running
        requests without touching their ownership; the CPU yields them at its next boundary."""
        st, cfg = self.state, self.state.config
        for r in st.cpu_running:
            if r.req_id in st.marked or r.finished:
                continue
            size = len(r.blocks) + 1
            if (
                budget.rows >= cfg.gpu_max_rows
                or budget.tokens >= cfg.gpu_batch_tokens
                or size > budget.hbm
                or budget.peak + r.peak_blocks > cfg.gpu_kv_blocks
            ):
                break
            budget.rows += 1
            budget.tokens += 1
            budget.hbm -= size
            budget.peak += r.peak_blocks
            plan.marks.append(r)

    # ------------------------------------------------------------------- commit (step 7)

    def commit(self, plan: GpuPlan) -> BlockMoves:
        """Materialize the decision; migrations first, as they complete before the forward.
        Returns the block moves the backend makes for the plan's swaps."""
        st, bs = self.state, self.state.config.block_size
        if plan.wait_for_copies:
            return BlockMoves()
        out_src: list[int] = []
        out_dst: list[int] = []
        if plan.swap_outs:
            gone = {id(v) for v in plan.swap_outs}
            st.gpu_running = [r for r in st.gpu_running if id(r) not in gone]
            st.gpu_growing = [r for r in st.gpu_growing if id(r) not in gone]
            for v in reversed(plan.swap_outs):  # oldest victim ends up first
                st.gpu_queue_peak -= v.peak_blocks
                st.gpu_context -= v.kv_tokens_after_step
                st.hbm.release(v.blocks)
                out_src[:0] = v.blocks
                v.blocks = st.host.allocate(len(v.blocks))
                out_dst[:0] = v.blocks
                v.ready, v.transit_to = False, Owner.CPU
                st.cpu_waiting.appendleft(v)
                st.waiting_growth += host_growth(v)
            st.marked.clear()  # an evicting round gives up its deferred swap-ins
        in_src: list[int] = []
        in_dst: list[int] = []
        for r in plan.swap_ins:  # their blocks cover the next step: none of them is growing
            head = st.cpu_waiting.popleft()
            assert head is r, "swap-ins must be a FIFO prefix of the CPU waiting queue"
            st.waiting_growth -= host_growth(r)
            r.source_blocks = r.blocks
            r.blocks = st.hbm.allocate(len(r.blocks) + r.next_blocks(bs))
            in_src += r.source_blocks
            in_dst += r.blocks[: len(r.source_blocks)]
            r.ready, r.transit_to = False, Owner.GPU
            st.marked.pop(r.req_id, None)
            st.gpu_running.append(r)
            st.gpu_queue_peak += r.peak_blocks
            st.gpu_context += r.kv_tokens_after_step
        if len(plan.decodes) == len(st.gpu_running):  # the whole queue decodes
            growing, st.gpu_growing = st.gpu_growing, []
        else:  # a subset (or none): only its growing requests get their blocks
            decoding = {id(r) for r in plan.decodes}
            growing = [r for r in st.gpu_growing if id(r) in decoding]
            st.gpu_growing = [r for r in st.gpu_growing if id(r) not in decoding]
        for r in growing:
            r.blocks.extend(st.hbm.allocate(r.next_blocks(bs)))
        for c in plan.prefills:
            self._commit_prefill(c)
        for r in plan.marks:
            st.marked[r.req_id] = r
        st.b_migration = plan.migration_reserve
        return BlockMoves((out_src, out_dst), (in_src, in_dst))

    def _commit_prefill(self, c: PrefillChunk) -> None:
        st, bs = self.state, self.state.config.block_size
        r = c.req
        if not r.blocks:  # first chunk: persistent blocks for the whole prompt
            head = st.gpu_waiting.popleft()
            assert head is r, "prefills are admitted in FIFO order"
            r.to_cpu = c.to_cpu
            pool = st.host if c.to_cpu else st.hbm
            r.blocks = pool.allocate(blocks_for(r.prompt_tokens, bs))
            st.gpu_prefilling.append(r)
            if c.to_cpu:
                st.waiting_growth += host_growth(r)
            else:
                st.gpu_queue_peak += r.peak_blocks
        if c.to_cpu:
            st.copy_group.append(r)
            if c.last:  # to the CPU waiting frontier, unready until its copies land
                st.gpu_prefilling.remove(r)
                r.ready, r.transit_to = False, Owner.CPU
                st.cpu_waiting.append(r)

    # ---------------------------------------------------------------------------- apply

    def apply(self, plan: GpuPlan, result: GpuResult) -> None:
        """Record sampled tokens; finished requests release HBM; new decodes join the queue."""
        st, t, bs = self.state, result.end_s, self.state.config.block_size
        done = emit_batch(plan.decodes, t, Owner.GPU, st.rounds)
        st.gpu_context += len(plan.decodes)
        if plan.decodes:  # the one pass per row: whose next step now needs a block
            st.gpu_growing = [r for r in st.gpu_running  # next_blocks > 0, in one comparison
                              if r.prompt_tokens + r.generated > len(r.blocks) * bs]
        for c in plan.prefills:
            r = c.req
            r.prefilled += c.tokens
            if not c.last:
                continue
            r.emit(t, Owner.GPU, st.rounds)
            if c.to_cpu:
                continue  # ready, and possibly finished, when its copies land
            st.gpu_prefilling.remove(r)
            if r.finished:
                st.hbm.release(r.blocks)
                r.blocks = []
                st.finished.append(r)
                st.gpu_queue_peak -= r.peak_blocks
            else:
                st.gpu_running.append(r)
                st.gpu_context += r.kv_tokens_after_step
                if r.next_blocks(bs):
                    st.gpu_growing.append(r)
        if done:
            before = len(st.finished)
            st.gpu_running = retire_finished(st.gpu_running, st.hbm, st.finished)
            retired = st.finished[before:]
            st.gpu_queue_peak -= sum(r.peak_blocks for r in retired)
            st.gpu_context -= sum(r.kv_tokens_after_step for r in retired)
            st.gpu_growing = [r for r in st.gpu_growing if not r.finished]
