"""The GPU executor: runs the core's GpuPlans over the paged HBM pool, stage by stage.

`stages(plan)` returns the paper's stage tasks [pre-layer, layer 0 .. N-1, post-layer] over one
shared state; `execute(plan)` runs them in order, so the whole-forward path and the
stage-by-stage path (the runtime services Dense Assist between stages) are the same code.
A round's swaps are issued first, on the migrator's copy stream; the compute stream waits for
them only where the round touches their blocks.

Which forward a round gets: decode-only rounds replay per-stage CUDA graphs captured once per
(batch, table width) bucket (graphs.py), rounds with prefill chunks replay per-layer graphs of
their dense stages, one set per token bucket (chunked_graphs.py), and the rest run eagerly. A
round's inputs go up as one non-blocking copy (batch.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import torch

from dualpace_hw.executors.gpu.assist import DenseAssist
from dualpace_hw.executors.gpu.batch import Batch, FlatBatch, flatten, to_device
from dualpace_hw.executors.gpu.chunked_graphs import TOKEN_BUCKETS, ChunkedGraphs
from dualpace_hw.executors.gpu.forward import Forward, ForwardState, Round
from dualpace_hw.executors.gpu.graphs import (
    WARM_FREE_BYTES,
    DecodeGraph,
    decode_graph_key,
    decode_graph_keys,
)
from dualpace_hw.executors.gpu.stages import StageKernels
from dualpace_hw.executors.gpu.to_cpu import PrefillToCpu
from dualpace_hw.executors.model import Model
from dualpace_hw.executors.sampling import Row, Sampler, sample
from dualpace_hw.kernels.triton_decode import HAVE_TRITON
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.migrate import CopyGroup, CopyHandle, Migrator
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.plans import BlockMoves, GpuPlan, PrefillChunk
from dualpace_sim.core.request import Request


class GpuExecutor:
    def __init__(
        self,
        model: Model,
        pool: PagedKVPool,
        tokens: TokenStore,
        host_pool: PagedKVPool | None = None,
        migrator: Migrator | None = None,
        fused: bool | None = None,
        cuda_graphs: bool | None = None,
        max_graphs: int = 32,
        triton_decode: bool | None = None,
        rank: int = 0,
        chunked_graphs: bool | None = None,
    ) -> None:
        """rank: this executor's tensor-parallel rank (its model and pool hold its heads);
        a Dense Assist's attention output holds every rank's heads, and it takes its own.
        chunked_graphs: rounds with prefill chunks replay per-layer graphs of their dense
        stages (`ChunkedGraphs`); by default with CUDA graphs and the fused kernels, on one
        GPU (a rank's captures would hold collectives that its peers must capture alike)."""
        self.model = model
        self.rank = rank
        self.shape = model.shape
        self.pool = pool
        self.tokens = tokens
        self.host_pool = host_pool
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        if migrator is None and host_pool is not None:
            migrator = Migrator(pool, host_pool)
        self.migrator = migrator
        fused = (self.cuda and HAVE_TRITON) if fused is None else fused
        triton_decode = (self.cuda and HAVE_TRITON) if triton_decode is None else triton_decode
        to_cpu = None if migrator is None else \
            PrefillToCpu(pool, host_pool, migrator, model.shape, model.n_layers, self.device)
        self.kernels = StageKernels(model, pool, fused, triton_decode, to_cpu)
        self.cuda_graphs = self.cuda if cuda_graphs is None else cuda_graphs
        self.max_graphs = max_graphs
        if chunked_graphs is None:
            chunked_graphs = self.cuda_graphs and self.cuda and fused and not model.sharded
        self.chunked_buckets = 0  # chunked-round buckets captured in the warm-up
        self.chunked: ChunkedGraphs | None = \
            ChunkedGraphs(self.kernels, capture=self.cuda) if chunked_graphs else None
        self._graphs: OrderedDict[tuple[int, int], DecodeGraph] = OrderedDict()
        self.graph_captures = 0  # decode graphs captured on first use (in a round, not warm-up)
        self.copies: CopyGroup = CopyGroup()  # the last forward's Prefill-to-CPU copies
        self._swapped_out: set[int] = set()
        self.swap_handle: CopyHandle | None = None
        self.assist = DenseAssist(self.kernels, rank)
        # Dense Assists run on a high-priority stream of their own. On the compute stream an
        # assist queues behind the stage the host has issued, and its result's wait drains
        # the stream, so the GPU idles while the host issues the next stage (on the H200 box,
        # served rounds beside 32-row Fused-Assist steps: 33.8 rounds/s this way, 31.6 on the
        # compute stream; docs/validation/README.md). None: the compute stream.
        self.assist_stream = torch.cuda.Stream(self.device, priority=-1) if self.cuda else None
        self.sampler: Sampler | None = None  # the runtime's, for requests that sample

    # ================================================================== prepare

    def _flatten(self, plan: GpuPlan, external: Sequence[Request] = ()) -> FlatBatch:
        return flatten(plan, self.tokens, self.pool.block_size, external,
                       host_copies=self.migrator is not None)

    def prepare(self, plan: GpuPlan, external: Sequence[Request] = ()) -> Batch:
        """Flatten a plan (after the core's commit) into tensors on the model's device.
        `external` decodes become rows after the plan's whose attention the caller computes
        (NEO's CPU decodes): `kernels.pre_attn` gives their q, k and v and stores nothing for
        them in HBM, `kernels.attention` leaves their output rows to the caller, and they are
        sampled."""
        return to_device(self._flatten(plan, external), self.pool.block_size, self.device)

    # ================================================================ migrations

    def round_of(self, plan: GpuPlan, moves: BlockMoves | None = None) -> Round:
        """A committed plan as plain data, its swaps the block moves the core's commit
        returned (a plan with swaps needs them)."""
        if plan.has_migrations and moves is None:
            raise ValueError("a round with swaps needs the block moves the core's commit "
                             "returned")
        moves = moves or BlockMoves()
        return Round(self._flatten(plan) if plan.has_forward else None, moves.swap_out,
                     moves.swap_in)

    def migrate(self, moves: BlockMoves) -> CopyHandle | None:
        """Issue a committed round's swap-outs then swap-ins on the copy stream. Returns one
        handle for all of them (None when there are none)."""
        return self.migrate_round(Round(None, moves.swap_out, moves.swap_in))

    def migrate_round(self, rnd: Round) -> CopyHandle | None:
        if not rnd.has_migrations:
            return None
        if self.migrator is None:
            raise ValueError("swaps need a host pool and a migrator")
        handle = None
        out_g, out_h = rnd.swap_out
        self._swapped_out = set(out_g)
        if out_g:
            handle = self.migrator.swap_out(out_g, out_h)
        if rnd.swap_in[0]:
            handle = self.migrator.swap_in(*rnd.swap_in)  # same stream: after the swap-outs
        self.swap_handle = handle
        return handle

    # ==================================================================== stages

    def stages(self, plan: GpuPlan, moves: BlockMoves | None = None) -> Forward:
        """The plan's stage tasks [pre-layer, layer 0 .. N-1, post-layer] (with its migrations,
        the commit's `moves`, issued first)."""
        return self.forward(self.round_of(plan, moves))

    def forward(self, rnd: Round) -> Forward:
        """A round's stage tasks, its migrations issued first."""
        handle = self.migrate_round(rnd)
        f = rnd.flat
        if self.cuda_graphs and self.cuda and f.n_dec and not f.chunks:
            fw = self._graph_forward(f)
        elif self.chunked is not None and f.chunks and not f.n_ext \
                and len(f.ids) <= TOKEN_BUCKETS[-1]:
            fw = self.chunked.forward(f, to_device(f, self.pool.block_size, self.device))
            self.copies = fw.copies
        else:
            fw = self._eager_forward(f)
            self.copies = fw.copies
        if handle is not None and self.cuda:
            self._hazards(f, handle, fw)
        return fw if self.sampler is None else self._sampled(fw)

    def _eager_forward(self, f: FlatBatch) -> Forward:
        batch = to_device(f, self.pool.block_size, self.device)
        state = ForwardState()
        copies = CopyGroup()
        fns = self.kernels.stage_fns(batch, state, copies)

        def finish(b=batch, st=state) -> dict[int, int]:
            return dict(zip(b.sample_req_ids, st.tokens.tolist(), strict=True))

        return Forward(fns, finish, state, copies, len(batch.sample_req_ids))

    def _graph_forward(self, flat: FlatBatch) -> Forward:
        """A decode-only round on its bucket's graphs, captured here on first use (the oldest
        evicted past `max_graphs`)."""
        key = decode_graph_key(flat)
        graph = self._graphs.get(key)
        if graph is None:
            graph = DecodeGraph(self.kernels, *key)
            self._graphs[key] = graph
            self.graph_captures += 1
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        self.copies = CopyGroup()
        return graph.forward(flat)

    def _sampled(self, fw: Forward) -> Forward:
        """The forward with its sampling requests' tokens drawn from its logits (the greedy
        ones stay the argmax the stages took, in a CUDA graph or not)."""
        def resample(tokens: dict[int, int]) -> None:
            if not self.sampler.params:
                return
            ids = list(tokens)
            rows = self.sampler.rows(ids, [len(self.tokens.ids(r)) for r in ids])
            if rows is not None:
                tokens.update(zip(ids, sample(fw.logits, rows), strict=True))

        return fw.wrapped(lambda stage: stage, resample)

    def _hazards(self, batch: FlatBatch, handle: CopyHandle, fw: Forward) -> None:
        """The compute stream waits on this round's swaps only where it touches their blocks."""
        if batch.swapped_in or (batch.gpu_blocks & self._swapped_out):
            first = fw.stages[0]

            def waited() -> None:
                handle.block()
                first()

            fw.stages[0] = waited

    def execute(self, plan: GpuPlan) -> dict[int, int]:
        """A whole forward: every stage in order; returns req_id -> sampled token id."""
        fw = self.stages(plan)
        for s in fw:
            s()
        self.last_forward = fw
        return fw.result()

    def copies_done(self) -> bool:
        """Whether the last layer of the last forward's Prefill-to-CPU copies landed."""
        return self.copies.done()

    # ================================================================== warm-up

    def warm_up(self, max_rows: int = 1, max_context: int = 0, max_tokens: int = 0
                ) -> tuple[float, int]:
        """Compile and capture, before the clock starts, what serving would otherwise pay for
        on first use: the Triton kernels of every stage (RMSNorm, QKV+RoPE, SwiGLU, paged
        decode and the split merge for each split-count bucket), the prefill and
        Prefill-to-CPU paths, and the decode graphs of every bucket a run with at most
        `max_rows` decoding requests of at most `max_context` tokens can reach, and the
        chunked rounds' graphs of every bucket up to `max_tokens` a round. On the H200 box
        the first round of a cold run took 3.4 s and cold decode buckets up to 0.66 s; with
        only one graph warmed, each bucket's first round took 45-160 ms for its capture, some
        20 rounds a run (docs/validation). Uses block 0.. of each pool (overwritten before
        anyone reads them) and request ids below zero. Returns the seconds it took and the
        number of decode graphs it captured (`chunked_buckets` counts the chunked rounds')."""
        start = time.perf_counter()
        if self.chunked is not None and max_tokens:
            self.chunked.reserve(max_tokens)  # before the prefill below captures a bucket
        self._warm_paths()
        self.warm_kernels()
        graphs = self.warm_graphs(max_rows, max_context)
        if self.chunked is not None and max_tokens:
            self.chunked_buckets = self.chunked.warm(max_tokens)
        self.graph_captures = 0  # from here on, a capture is one a round paid for
        return time.perf_counter() - start, graphs

    def _warm_paths(self) -> None:
        """One prefill and one decode in HBM, and one Prefill-to-CPU prompt where there is a
        host pool, of requests below zero that leave nothing behind."""
        bs = self.pool.block_size
        n = min(4 * bs, self.pool.n_blocks * bs - 1)  # prompt tokens, +1 decoded
        reqs = []
        try:
            r = Request.create(-1, 0.0, n, 2, bs)
            r.blocks = list(range(-(-(n + 1) // bs)))
            self.tokens.add(r.req_id, [1] * n)
            reqs.append(r)
            self.execute(GpuPlan(prefills=[PrefillChunk(r, 0, n, False, True)]))
            self.tokens.append(r.req_id, 1)
            r.generated += 1  # a decoded token; its time is never recorded
            self.execute(GpuPlan(decodes=[r], decode_context=n + 1))
            if self.migrator is not None and self.host_pool.n_blocks * bs > n:
                h = Request.create(-2, 0.0, n, 2, bs)
                h.blocks = list(range(-(-n // bs)))
                self.tokens.add(h.req_id, [1] * n)
                reqs.append(h)
                self.execute(GpuPlan(prefills=[PrefillChunk(h, 0, n, True, True)]))
                while not self.copies_done():
                    time.sleep(0.001)
        finally:
            for r in reqs:
                self.tokens.remove(r.req_id)

    def warm_graphs(self, max_rows: int, max_context: int) -> int:
        """Capture the decode graphs of `decode_graph_keys` while the GPU keeps
        `WARM_FREE_BYTES` free (each graph holds its own activations and logits, up to
        a few hundred MB for 512 rows; serving needs room for its eager prefill rounds). Those
        left out are captured on first use, as before. Returns how many were captured."""
        if not (self.cuda_graphs and self.cuda):
            return 0
        keys = decode_graph_keys(max_rows, max_context, self.pool.block_size)
        captured = 0
        for key in keys:
            if torch.cuda.mem_get_info(self.device)[0] < WARM_FREE_BYTES:
                break
            if key not in self._graphs:
                self.capture_graph(key)
            captured += 1
        return captured

    def capture_graph(self, key: tuple[int, int]) -> None:
        """A warm-up capture, kept from eviction. Tensor-parallel ranks make the same ones in
        the same order (gpu_ranks.py), so their graph sets, and what they evict, stay alike:
        a rank that re-captured a graph the other still had would run the capture's warm-up
        all-reduces alone."""
        self._graphs[key] = DecodeGraph(self.kernels, *key)
        self.max_graphs = max(self.max_graphs, len(self._graphs))

    def warm_kernels(self) -> None:
        """Compile the paged decode kernel and its split merge for every split-count bucket."""
        if self.cuda and self.kernels.triton_decode:
            from dualpace_hw.kernels import triton_decode

            kc, vc = self.pool.layer(0)
            bs = self.pool.block_size
            q = torch.zeros(1, self.model.shape.n_heads, self.model.shape.head_dim,
                            dtype=kc.dtype, device=self.device)
            width = 128  # the most splits choose_splits picks
            table = torch.zeros(1, width, dtype=torch.int32, device=self.device)
            lens = torch.full((1,), width * bs, dtype=torch.int32, device=self.device)
            for splits in (1, 2, 4, 8, 16, 32, 64, 128):
                triton_decode.paged_decode_attention(q, kc, vc, table, lens, splits=splits)
            torch.cuda.synchronize(self.device)

    def release_graphs(self) -> None:
        """Destroy the decode graphs now rather than at garbage collection. Under tensor
        parallelism they captured NCCL all-reduces, and the ranks cannot leave their process
        group while such a graph exists."""
        for graph in self._graphs.values():
            graph.release()
        self._graphs.clear()
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ============================================================== Dense Assist

    def assist_post_attn(self, layer: int, attn_out_cpu: torch.Tensor,
                         residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                         ) -> torch.Tensor:
        """Dense Assist g_p: one non-final post-attention stage of a CPU batch -> hidden (CPU)."""
        with torch.cuda.stream(self.assist_stream):
            return self.assist.post_attn(layer, attn_out_cpu, residual_cpu, out)

    def join_assist(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> None:
        """A tensor-parallel rank's part of rank 0's Dense Assist (`DenseAssist.join`)."""
        self.assist.join(layer, attn, residual)

    def assist_post_layer(self, hidden_cpu: torch.Tensor,
                          out: torch.Tensor | None = None) -> torch.Tensor:
        """Dense Assist g_lS (Split-Final): the post-layer of a CPU batch -> token ids (CPU)."""
        with torch.cuda.stream(self.assist_stream):
            return self.assist.post_layer(hidden_cpu, out, self._cpu_sampling_rows())

    def assist_fused_final(self, layer: int, attn_out_cpu: torch.Tensor,
                           residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """Dense Assist g_lA (Fused-Assist): the last post-attention stage and the post-layer."""
        with torch.cuda.stream(self.assist_stream):
            return self.assist.fused_final(layer, attn_out_cpu, residual_cpu, out,
                                           self._cpu_sampling_rows())

    def _cpu_sampling_rows(self) -> list[Row] | None:
        """The sampling rows of the CPU step in flight, whose assists' logits are perturbed."""
        return None if self.sampler is None else self.sampler.cpu_rows
