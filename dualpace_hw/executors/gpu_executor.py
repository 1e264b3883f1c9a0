"""The GPU executor: runs the core's GpuPlans over the paged HBM pool, stage by stage.

A plan's batch is flattened into rows: the decodes first (one row each: the request's last
token at position prompt + generated - 1), then the prefill chunks (prompt ids start ..
start + tokens - 1). Each layer computes q/k/v for all rows, stores K/V into the pages, runs
paged decode attention for the decode rows and causal attention over the prefix for each chunk,
then the post-attention stage; the post-layer samples the decode rows and the last row of every
chunk that completes its prompt.

`stages(plan)` returns the paper's stage tasks [pre-layer, layer 0 .. N-1, post-layer] over one
shared state; `execute(plan)` runs them in order, so the whole-forward path and the
stage-by-stage path (the runtime services Dense Assist between stages) are the same code.

Prefill-to-CPU chunks keep no KV in HBM: their K/V are computed on the GPU, attention uses GPU
staging (earlier chunks of the prompt are gathered from the host pool layer by layer), and every
layer's pages are copied to the request's host blocks on the migrator's copy stream; the
forward's `copies` (and `copies_done()`) report when the last layer landed.

On CUDA: RMSNorm, q/k-norm + RoPE + the paged K/V store and SiLU-and-multiply run as fused
Triton kernels (triton_ops.py), decode attention is the Triton paged kernel (triton_decode.py),
prefill attention is FlashAttention-2's varlen kernel over the gathered prefix, decode-only
batches replay per-stage CUDA graphs captured once per (batch, table width) bucket, and rounds
with prefill chunks replay per-layer graphs of their dense stages, one set per token bucket,
with attention run eagerly between them. A round's inputs go up as one non-blocking copy. On
the CPU device (the tests) the stages are model.py's own and attention is attention.py's
reference.
"""

from __future__ import annotations

import gc
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain

import torch
import torch.nn.functional as F

from dualpace_hw.executors.model import Model, greedy
from dualpace_hw.executors.sampling import Sampler, perturb, sample
from dualpace_hw.kernels import attention as ref_attn
from dualpace_hw.kernels.triton_decode import HAVE_TRITON
from dualpace_hw.memory.kv import PagedKVPool, slot_mapping
from dualpace_hw.memory.migrate import CopyGroup, CopyHandle, Migrator
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.plans import BlockMoves, GpuPlan, PrefillChunk
from dualpace_sim.core.request import Request


@dataclass
class _Chunk:
    row0: int
    n: int
    start: int
    req_id: int
    blocks: list[int]  # GPU block ids, or host block ids for a Prefill-to-CPU chunk
    to_cpu: bool
    last: bool
    table: torch.Tensor | None = None  # GPU block table (GPU-bound chunks), set by prepare
    cu: torch.Tensor | None = None  # the flash kernel's lengths on the device, set by prepare


@dataclass
class Batch:
    """A GpuPlan flattened into tensors on the model's device."""

    ids: torch.Tensor  # [T] token ids
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] slots in the GPU pool; -1 for Prefill-to-CPU rows
    n_dec: int
    block_tables: torch.Tensor  # [D, max blocks] int32 (decodes)
    context_lens: torch.Tensor  # [D] int32, tokens including the current one
    chunks: list[_Chunk]
    sample_rows: torch.Tensor | None  # rows that sample; None = every row
    sample_req_ids: list[int]
    gpu_blocks: set[int] = field(default_factory=set)  # HBM blocks read or written
    swapped_in: bool = False  # a decode was swapped in this round
    n_ext: int = 0  # trailing decode rows whose attention is computed elsewhere (NEO's CPU)
    padded: bool = False  # rows may pad a graph's bucket: slot -1, never sampled
    cos: torch.Tensor | None = None  # [T, hd/2] fp32 (fused path)
    sin: torch.Tensor | None = None

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class _Flat:
    """A plan flattened into host lists (what `prepare` turns into tensors)."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    n_dec: int = 0
    chunks: list[_Chunk] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    sample_ids: list[int] = field(default_factory=list)
    gpu_blocks: set[int] = field(default_factory=set)
    swapped_in: bool = False
    n_ext: int = 0


class ForwardState:
    """What a forward's stages hand each other: the hidden states, then the logits and the
    sampled tokens (the profiler's stage timings drive the stages with one too)."""

    hidden: torch.Tensor
    logits: torch.Tensor
    tokens: torch.Tensor


class Forward:
    """One plan's stage tasks; iterate and call them in order, then read `result()`."""

    def __init__(self, stages: list[Callable[[], None]], finish: Callable[[], dict[int, int]],
                 state: ForwardState, copies: CopyGroup, n_sampled: int) -> None:
        self.stages = stages
        self.n_sampled = n_sampled
        self._finish = finish
        self.state = state
        self.copies = copies  # Prefill-to-CPU layer copies issued by this forward

    def __iter__(self):
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def result(self) -> dict[int, int]:
        """Sampled token per request (decodes and completing chunks); syncs with the GPU."""
        return self._finish()

    def wrapped(self, stage: Callable[[Callable[[], None]], Callable[[], None]],
                finish: Callable[[dict[int, int]], None]) -> Forward:
        """The same forward with each stage passed through `stage` and `finish` called on the
        result (a tensor-parallel rank 0 releases the other ranks' stages and checks them)."""
        def done() -> dict[int, int]:
            tokens = self._finish()
            finish(tokens)
            return tokens

        return Forward([stage(s) for s in self.stages], done, self.state, self.copies,
                       self.n_sampled)

    @property
    def logits(self) -> torch.Tensor:
        """[sampled rows, V] fp32 logits, in the order of `result()`."""
        return self.state.logits[: self.n_sampled]


@dataclass
class Round:
    """One GPU round as plain data: its flattened batch and its swaps. Rank 0 of a
    tensor-parallel GPU engine builds it from the core's plan; the other ranks run it as sent."""

    flat: _Flat | None  # None: a round of migrations only
    swap_out: tuple[list[int], list[int]]  # (GPU blocks, host blocks), pairwise
    swap_in: tuple[list[int], list[int]]  # (host blocks, GPU blocks), pairwise

    @property
    def has_migrations(self) -> bool:
        return bool(self.swap_out[0] or self.swap_in[0])


def _bucket(n: int, sizes: tuple[int, ...]) -> int:
    for s in sizes:
        if n <= s:
            return s
    return -(-n // sizes[-1]) * sizes[-1]


_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
_TABLE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# A chunked round's tokens, padded up to one of these: every 32 to 1,024, every 64 to 2,048,
# every 256 to 8,192 (the scheduler's hard cap), so a pad adds at most 6 % of dense work.
_TOKEN_BUCKETS = (tuple(range(32, 1025, 32)) + tuple(range(1088, 2049, 64))
                  + tuple(range(2304, 8193, 256)))
_WARM_GRAPHS = 128  # at most this many decode graphs captured before the clock
_WARM_FREE_BYTES = 4 << 30  # and only while this much GPU memory stays free


def decode_graph_keys(max_rows: int, max_context: int, block_size: int,
                      most: int = _WARM_GRAPHS) -> list[tuple[int, int]]:
    """The (batch, table width) buckets a run's decode-only rounds can reach, with at most
    `max_rows` requests decoding and `max_context` tokens in any one: small batches first, and
    no more than `most` (the rest are captured on first use, as before)."""
    rows = sorted({_bucket(n, _BATCH_BUCKETS) for n in range(1, max(1, max_rows) + 1)})
    widths = sorted({_bucket(w, _TABLE_BUCKETS)
                     for w in range(1, max(1, -(-max_context // block_size)) + 1)})
    return [(r, w) for r in rows for w in widths][:most]


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
        stages (`_ChunkedGraphs`); by default with CUDA graphs and the fused kernels, on one
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
        self.fused = (self.cuda and HAVE_TRITON) if fused is None else fused
        self.triton_decode = (self.cuda and HAVE_TRITON) if triton_decode is None \
            else triton_decode
        self.cuda_graphs = self.cuda if cuda_graphs is None else cuda_graphs
        self.max_graphs = max_graphs
        if chunked_graphs is None:
            chunked_graphs = self.cuda_graphs and self.cuda and self.fused and not model.sharded
        self.chunked_buckets = 0  # chunked-round buckets captured in the warm-up
        self.chunked: _ChunkedGraphs | None = \
            _ChunkedGraphs(self, capture=self.cuda) if chunked_graphs else None
        self._graphs: OrderedDict[tuple[int, int], _DecodeGraph] = OrderedDict()
        self.graph_captures = 0  # decode graphs captured on first use (in a round, not warm-up)
        self.copies: CopyGroup = CopyGroup()  # the last forward's Prefill-to-CPU copies
        self._req_copies: dict[int, CopyGroup] = {}  # per request, its latest chunk's copies
        self._swapped_out: set[int] = set()
        self.swap_handle: CopyHandle | None = None
        self._pinned: dict[str, torch.Tensor] = {}
        self._assist_event = torch.cuda.Event() if self.cuda else None
        # Dense Assists run on a high-priority stream of their own. On the compute stream an
        # assist queues behind the stage the host has issued, and its result's wait drains
        # the stream, so the GPU idles while the host issues the next stage (on the H200 box,
        # served rounds beside 32-row Fused-Assist steps: 33.8 rounds/s this way, 31.6 on the
        # compute stream; docs/validation/README.md). None: the compute stream.
        self.assist_stream = torch.cuda.Stream(self.device, priority=-1) if self.cuda else None
        self.sampler: Sampler | None = None  # the runtime's, for requests that sample

    # ================================================================== prepare

    def _flatten(self, plan: GpuPlan, external: Sequence[Request] = ()) -> _Flat:
        bs = self.pool.block_size
        f = _Flat()
        for r in plan.decodes:
            toks = self.tokens.ids(r.req_id)
            n = r.prompt_tokens + r.generated
            if len(toks) != n:
                raise ValueError(f"request {r.req_id}: the token store holds {len(toks)} ids, "
                                 f"the core counts {n}")
            if len(r.blocks) * bs < n:
                raise ValueError(f"request {r.req_id}: {len(r.blocks)} blocks hold no {n} tokens")
            p = n - 1
            f.sample_rows.append(len(f.ids))
            f.sample_ids.append(r.req_id)
            f.ids.append(toks[p])
            f.pos.append(p)
            f.slots.append(r.blocks[p // bs] * bs + p % bs)
            used = r.blocks[: -(-n // bs)]
            f.tables.append(used)
            f.lens.append(n)
            f.gpu_blocks.update(used)
        f.n_dec = len(f.ids)
        for c in plan.prefills:
            r = c.req
            toks = self.tokens.ids(r.req_id)
            if len(toks) < c.start + c.tokens:
                raise ValueError(f"request {r.req_id}: chunk {c.start}+{c.tokens} past its ids")
            ch = _Chunk(len(f.ids), c.tokens, c.start, r.req_id, list(r.blocks), c.to_cpu,
                        c.last)
            f.ids.extend(toks[c.start:c.start + c.tokens])
            f.pos.extend(range(c.start, c.start + c.tokens))
            if c.to_cpu:
                if self.migrator is None:
                    raise ValueError("a Prefill-to-CPU chunk needs a host pool and a migrator")
                f.slots.extend([-1] * c.tokens)
            else:
                f.slots.extend(slot_mapping(r.blocks, c.start, c.tokens, bs))
                f.gpu_blocks.update(r.blocks[: -(-(c.start + c.tokens) // bs)])
            if c.last:
                f.sample_rows.append(len(f.ids) - 1)
                f.sample_ids.append(r.req_id)
            f.chunks.append(ch)
        for r in external:  # no HBM slot: their K/V and attention live elsewhere
            p = r.prompt_tokens + r.generated - 1
            toks = self.tokens.ids(r.req_id)
            if len(toks) != p + 1:
                raise ValueError(f"request {r.req_id}: the token store holds {len(toks)} ids, "
                                 f"the core counts {p + 1}")
            f.sample_rows.append(len(f.ids))
            f.sample_ids.append(r.req_id)
            f.ids.append(toks[p])
            f.pos.append(p)
            f.slots.append(-1)
            f.n_ext += 1
        swapped = {id(r) for r in plan.swap_ins}
        f.swapped_in = any(id(r) in swapped for r in plan.decodes)
        return f

    def prepare(self, plan: GpuPlan, external: Sequence[Request] = ()) -> Batch:
        """Flatten a plan (after the core's commit) into tensors on the model's device.
        `external` decodes become rows after the plan's whose attention the caller computes
        (NEO's CPU decodes): `qkv` gives their q, k and v and stores nothing for them in HBM,
        `gpu_attention` leaves their output rows to the caller, and they are sampled."""
        return self._tensors(self._flatten(plan, external))

    def _tensors(self, f: _Flat) -> Batch:
        """The round's inputs on the model's device, as one pinned buffer copied without
        blocking. A `torch.tensor(..., device="cuda")` per input is a blocking copy that
        drains the stream: the host could not issue this round while the last one ran."""
        bs = self.pool.block_size
        width = max((len(t) for t in f.tables), default=1)
        table = [0] * (len(f.tables) * width)
        for i, t in enumerate(f.tables):
            table[i * width:i * width + len(t)] = t
        sampled = len(f.sample_rows) != len(f.ids)
        parts = [f.ids, f.pos, f.slots, f.lens, f.sample_rows if sampled else [], table]
        for c in f.chunks:
            length = c.start + c.n
            parts.append([] if c.to_cpu else c.blocks[: -(-length // bs)])
            parts.append([x for pair in ref_attn.flash_lengths(c.n, length) for x in pair])
        host = torch.tensor(list(chain.from_iterable(parts)), dtype=torch.int64)
        dev = host.pin_memory().to(self.device, non_blocking=True) if self.cuda else host
        views, at = [], 0
        for part in parts:
            views.append(dev[at:at + len(part)])
            at += len(part)
        ids, pos, slots, lens, rows, tab, *per_chunk = views
        for c, c_table, cu in zip(f.chunks, per_chunk[::2], per_chunk[1::2], strict=True):
            c.cu = cu.to(torch.int32).view(2, 2)
            if not c.to_cpu:
                c.table = c_table
        return Batch(
            ids=ids,
            positions=pos,
            slots=slots,
            n_dec=f.n_dec,
            block_tables=tab.to(torch.int32).view(len(f.tables), width),
            context_lens=lens.to(torch.int32),
            chunks=f.chunks,
            sample_rows=rows if sampled else None,
            sample_req_ids=f.sample_ids,
            gpu_blocks=f.gpu_blocks,
            swapped_in=f.swapped_in,
            n_ext=f.n_ext,
        )

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
                and len(f.ids) <= _TOKEN_BUCKETS[-1]:
            fw = self.chunked.forward(f, self._tensors(f))
            self.copies = fw.copies
        else:
            batch = self._tensors(f)
            state = ForwardState()
            copies = CopyGroup()
            fns = self._stage_fns(batch, state, copies)

            def finish(b=batch, st=state) -> dict[int, int]:
                return dict(zip(b.sample_req_ids, st.tokens.tolist(), strict=True))

            fw = Forward(fns, finish, state, copies, len(batch.sample_req_ids))
            self.copies = copies
        if handle is not None and self.cuda:
            self._hazards(f, handle, fw)
        return fw if self.sampler is None else self._sampled(fw)

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

    def _cpu_sampled(self, logits: torch.Tensor) -> torch.Tensor:
        """A Dense Assist's post-layer logits, perturbed for the CPU step's sampling rows."""
        rows = None if self.sampler is None else self.sampler.cpu_rows
        return logits if rows is None else perturb(logits, rows)

    def _hazards(self, batch: _Flat, handle: CopyHandle, fw: Forward) -> None:
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
        self.warm_kernels()
        graphs = self.warm_graphs(max_rows, max_context)
        if self.chunked is not None and max_tokens:
            self.chunked_buckets = self.chunked.warm(max_tokens)
        self.graph_captures = 0  # from here on, a capture is one a round paid for
        return time.perf_counter() - start, graphs

    def warm_graphs(self, max_rows: int, max_context: int) -> int:
        """Capture the decode graphs of `decode_graph_keys` while the GPU keeps
        `_WARM_FREE_BYTES` free (each graph holds its own activations and logits, up to
        a few hundred MB for 512 rows; serving needs room for its eager prefill rounds). Those
        left out are captured on first use, as before. Returns how many were captured."""
        if not (self.cuda_graphs and self.cuda):
            return 0
        keys = decode_graph_keys(max_rows, max_context, self.pool.block_size)
        captured = 0
        for key in keys:
            if torch.cuda.mem_get_info(self.device)[0] < _WARM_FREE_BYTES:
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
        self._graphs[key] = _DecodeGraph(self, *key)
        self.max_graphs = max(self.max_graphs, len(self._graphs))

    def warm_kernels(self) -> None:
        """Compile the paged decode kernel and its split merge for every split-count bucket."""
        if self.cuda and self.triton_decode:
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

    def copies_done(self) -> bool:
        """Whether the last layer of the last forward's Prefill-to-CPU copies landed."""
        return self.copies.done()

    def _stage_fns(self, b: Batch, st: ForwardState, copies: CopyGroup) -> list[Callable[[], None]]:
        fns: list[Callable[[], None]] = [lambda: self._pre_layer(b, st)]
        for layer in range(self.model.n_layers):
            fns.append(lambda layer=layer: self._layer(layer, b, st, copies))
        fns.append(lambda: self._post_layer(b, st))
        return fns

    # ============================================ a layer in parts (NEO's pipeline)

    def embed(self, b: Batch) -> torch.Tensor:
        """The pre-layer of a prepared batch: its hidden states [T, hidden]."""
        st = ForwardState()
        self._pre_layer(b, st)
        return st.hidden

    def qkv(self, layer: int, h: torch.Tensor, b: Batch
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A layer's pre-attention stage: q [T, heads, hd], k and v [T, kv_heads, hd], the
        K/V of the batch's GPU rows stored into the HBM pages."""
        return self._pre_attn(layer, h, b)

    def gpu_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      b: Batch, copies: CopyGroup) -> torch.Tensor:
        """A layer's attention of the batch's GPU rows ([T, heads, hd]; the external rows are
        left for the caller to fill), Prefill-to-CPU pages issued into `copies`."""
        return self._attention(layer, q, k, v, b, copies)

    def post_attention(self, layer: int, o: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """A layer's post-attention stage: the next hidden states."""
        return self._post_attn(layer, o.view(o.shape[0], -1), h)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """The post-layer of sampled rows' hidden states: their greedy token ids."""
        return greedy(self.model.post_layer(hidden))

    def _pre_layer(self, b: Batch, st: ForwardState) -> None:
        st.hidden = self.model.pre_layer(b.ids)
        if self.fused:
            b.cos, b.sin = self._rope_tables(b.positions)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin [T, hd/2] of the rows' positions (the fused kernels' input)."""
        freqs = positions.float()[:, None] * self.model.rope.inv_freq[None, :]
        return freqs.cos(), freqs.sin()

    def _post_layer(self, b: Batch, st: ForwardState) -> None:
        h = st.hidden if b.sample_rows is None else st.hidden.index_select(0, b.sample_rows)
        st.logits = self.model.post_layer(h)
        st.tokens = greedy(st.logits)

    def _layer(self, layer: int, b: Batch, st: ForwardState, copies: CopyGroup) -> None:
        h = st.hidden
        q, k, v = self._pre_attn(layer, h, b)
        o = self._attention(layer, q, k, v, b, copies)
        st.hidden = self._post_attn(layer, o.view(o.shape[0], -1), h)

    # ----------------------------------------------------------- stage kernels

    def _pre_attn(self, layer: int, h: torch.Tensor, b: Batch
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s, lw = self.shape, self.model.w.layers[layer]
        kc, vc = self.pool.layer(layer)
        if self.fused:
            from dualpace_hw.kernels import triton_ops

            x, _ = triton_ops.rms_norm(h, lw.input_norm, s.rms_norm_eps)
            qkv = lw.qkv(x)
            q, k = triton_ops.qkv_rope_store(
                qkv, b.cos, b.sin, b.slots, kc, vc, s.n_heads, s.n_kv_heads, s.head_dim,
                lw.q_norm, lw.k_norm, s.rms_norm_eps)
            v = qkv[:, s.q_dim + s.kv_dim:].view(-1, s.n_kv_heads, s.head_dim)
            return q, k, v
        q, k, v = self.model.pre_attn(layer, h, b.positions)
        if b.n_ext or b.padded or any(c.to_cpu for c in b.chunks):
            keep = b.slots >= 0
            self.pool.write(layer, b.slots[keep], k[keep], v[keep])
        else:
            self.pool.write(layer, b.slots, k, v)
        return q, k, v

    def _post_attn(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return self.model.post_attn(layer, attn, residual)
        from dualpace_hw.kernels import triton_ops

        lw, reduce = self.model.w.layers[layer], self.model.reduce  # reduce: tensor parallel
        x, h = triton_ops.rms_norm(reduce(lw.o(attn)), lw.post_norm, self.shape.rms_norm_eps,
                                   residual=residual)
        return h + reduce(lw.down(triton_ops.silu_mul(lw.gate_up(x))))

    def _attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   b: Batch, copies: CopyGroup, out: torch.Tensor | None = None
                   ) -> torch.Tensor:
        kc, vc = self.pool.layer(layer)
        o = torch.empty_like(q) if out is None else out
        d = b.n_dec
        if d:
            if self.triton_decode:
                from dualpace_hw.kernels import triton_decode

                triton_decode.paged_decode_attention(q[:d], kc, vc, b.block_tables,
                                                     b.context_lens, out=o[:d])
            else:
                o[:d] = ref_attn.paged_decode_attention(q[:d], kc, vc, b.block_tables,
                                                        b.context_lens)
        for c in b.chunks:
            rows = slice(c.row0, c.row0 + c.n)
            if not c.to_cpu:
                o[rows] = ref_attn.prefill_attention(q[rows], kc, vc, c.table, c.start, c.cu)
            else:
                o[rows] = self._to_cpu_chunk(layer, q[rows], k[rows], v[rows], c, copies)
        return o

    def _to_cpu_chunk(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      c: _Chunk, copies: CopyGroup) -> torch.Tensor:
        """Attention of a Prefill-to-CPU chunk over GPU staging, and its pages to the host."""
        bs = self.pool.block_size
        kvh, hd = self.shape.n_kv_heads, self.shape.head_dim
        if layer == 0:
            earlier = self._req_copies.pop(c.req_id, None)
            if earlier is not None and self.cuda:
                earlier.block()  # the previous chunk's pages must have landed (GPU-side wait)
            self._req_copies[c.req_id] = CopyGroup()
        if c.start:  # the prompt's earlier chunks, back from the host: [start, kvh, hd]
            n_prev = -(-c.start // bs)
            kp, vp = self._gather_host_layer(layer, c.blocks[:n_prev])  # [n, kvh, bs, hd]
            kp = kp.transpose(1, 2).reshape(-1, kvh, hd)[: c.start].to(k.dtype)
            vp = vp.transpose(1, 2).reshape(-1, kvh, hd)[: c.start].to(v.dtype)
            kf, vf = torch.cat([kp, k]), torch.cat([vp, v])
        else:
            kf, vf = k, v
        out = ref_attn.prefix_attention(q, kf, vf, c.cu)
        # whole pages from the first page this chunk touches to its last one, K and V stacked
        # and put in host-id order for few large DMAs
        first, last = c.start // bs, (c.start + c.n - 1) // bs
        lo, hi = first * bs, (last + 1) * bs
        kv = torch.stack([kf[lo:], vf[lo:]])  # [2, tokens, kvh, hd]
        pad = hi - (c.start + c.n)
        if pad:
            kv = F.pad(kv, (0, 0, 0, 0, 0, pad))
        kv = kv.view(2, last + 1 - first, bs, kvh, hd).transpose(2, 3)  # [2, n, kvh, bs, hd]
        plan = self.migrator.page_plan(c.blocks[first:last + 1])
        kv = self.migrator.sort_pages(plan, kv.to(self.host_pool.data.dtype), dim=1)
        handle = self.migrator.copy_layer_pages_to_host(layer, kv, plan)
        copies.add(handle)
        self._req_copies[c.req_id].add(handle)
        if c.last and layer == self.model.n_layers - 1:
            del self._req_copies[c.req_id]  # the prompt is complete: nothing reads it here
        return out

    def _gather_host_layer(self, layer: int, host_blocks: list[int]
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V pages of `host_blocks` on the model's device (compute stream)."""
        hd = self.host_pool.data
        if not self.cuda:
            ids = torch.tensor(host_blocks)
            return hd[layer, 0].index_select(0, ids), hd[layer, 1].index_select(0, ids)
        plan = self.migrator.page_plan(host_blocks)
        stage = torch.empty((2, len(host_blocks)) + hd.shape[3:], dtype=hd.dtype,
                            device=self.device)
        for p, b0, m in plan.runs:  # host-id order
            stage[0, p:p + m].copy_(hd[layer, 0, b0:b0 + m], non_blocking=True)
            stage[1, p:p + m].copy_(hd[layer, 1, b0:b0 + m], non_blocking=True)
        stage = plan.unsort(stage, dim=1)
        return stage[0], stage[1]

    # ================================================================ CUDA graphs

    def _graph_forward(self, flat: _Flat) -> Forward:
        need = max(len(t) for t in flat.tables)
        key = (_bucket(flat.n_dec, _BATCH_BUCKETS), _bucket(need, _TABLE_BUCKETS))
        graph = self._graphs.get(key)
        if graph is None:
            graph = _DecodeGraph(self, *key)
            self._graphs[key] = graph
            self.graph_captures += 1
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        self.copies = CopyGroup()
        return graph.forward(flat)

    # ============================================================== Dense Assist

    def _stage_in(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor to the model's device (through a pinned buffer on CUDA)."""
        dt = self.model.w.embed.dtype
        if not self.cuda:
            return t.to(self.device, dt)
        if t.is_pinned():
            return t.to(self.device, non_blocking=True).to(dt)
        buf = self._pinned_buffer(name, t.numel(), t.dtype)
        view = buf[: t.numel()].view(t.shape)
        view.copy_(t)
        return view.to(self.device, non_blocking=True).to(dt)

    def _pinned_buffer(self, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._pinned.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = torch.empty(max(n, 1 << 16), dtype=dtype, pin_memory=True)
            self._pinned[name] = buf
        return buf

    def _stage_out(self, name: str, t: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """A result back to the CPU: straight into `out` (pinned, e.g. the runtime's shared
        assist buffer: one DMA, no CPU copy), else through a pinned buffer and a clone."""
        if out is not None:
            out.copy_(t.reshape(out.shape), non_blocking=self.cuda and out.is_pinned())
            if self.cuda:
                self._assist_event.record()
                self._assist_event.synchronize()
            return out
        if not self.cuda:
            return t
        buf = self._pinned_buffer(name, t.numel(), t.dtype)
        view = buf[: t.numel()].view(t.shape)
        view.copy_(t, non_blocking=True)
        self._assist_event.record()
        self._assist_event.synchronize()
        return view.clone()

    def _own_heads(self, attn: torch.Tensor) -> torch.Tensor:
        """This rank's columns of an attention output of every head (tensor parallel)."""
        q = self.shape.q_dim
        return attn if attn.shape[1] == q else attn[:, self.rank * q:(self.rank + 1) * q]

    def assist_post_attn(self, layer: int, attn_out_cpu: torch.Tensor,
                         residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                         ) -> torch.Tensor:
        """Dense Assist g_p: one non-final post-attention stage of a CPU batch -> hidden (CPU)."""
        with torch.cuda.stream(self.assist_stream):
            attn = self._stage_in("attn", self._own_heads(attn_out_cpu))
            res = self._stage_in("residual", residual_cpu)
            return self._stage_out("hidden", self._post_attn(layer, attn, res), out)

    def join_assist(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> None:
        """A tensor-parallel rank's part of rank 0's Dense Assist: the post-attention stage on
        its heads' columns `attn` (its all-reduces are rank 0's too); rank 0 keeps the result."""
        dt = self.model.w.embed.dtype
        self._post_attn(layer, attn.to(self.device, dt), residual.to(self.device, dt))

    def assist_post_layer(self, hidden_cpu: torch.Tensor,
                          out: torch.Tensor | None = None) -> torch.Tensor:
        """Dense Assist g_lS (Split-Final): the post-layer of a CPU batch -> token ids (CPU)."""
        with torch.cuda.stream(self.assist_stream):
            h = self._stage_in("residual", hidden_cpu)
            return self._stage_out("tokens",
                                   greedy(self._cpu_sampled(self.model.post_layer(h))), out)

    def assist_fused_final(self, layer: int, attn_out_cpu: torch.Tensor,
                           residual_cpu: torch.Tensor, out: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """Dense Assist g_lA (Fused-Assist): the last post-attention stage and the post-layer."""
        with torch.cuda.stream(self.assist_stream):
            attn = self._stage_in("attn", self._own_heads(attn_out_cpu))
            res = self._stage_in("residual", residual_cpu)
            h = self._post_attn(layer, attn, res)
            return self._stage_out("tokens",
                                   greedy(self._cpu_sampled(self.model.post_layer(h))), out)


@contextmanager
def no_collection() -> Iterator[None]:
    """Python's garbage collector held off while CUDA graphs are captured. A collection that
    frees another graph mid-capture resets it, which CUDA forbids while a stream captures:
    on the H200 box that aborted the process (the tests' executors of earlier cases). Each
    capture collects first (`torch.cuda.graph` does), so nothing is left waiting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_stages(fns: Sequence[Callable[[], None]], device: torch.device, pool
                   ) -> list[torch.cuda.CUDAGraph]:
    """One CUDA graph per stage of `fns`, in the shared memory `pool`, after one eager run of
    them on a side stream (Triton compiles, cuBLAS picks its kernels). Replay them in order."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool), no_collection():
            f()
        graphs.append(g)
    return graphs


class _DecodeGraph:
    """Per-stage CUDA graphs of a decode-only batch of a fixed (rows, table width) bucket.

    Static inputs are padded: extra rows have context 0 (attention writes zeros) and slot -1
    (nothing stored); their sampled tokens are dropped."""

    def __init__(self, ex: GpuExecutor, rows: int, width: int) -> None:
        dev = ex.device
        self.ex = ex
        self.rows, self.width = rows, width
        self.ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros(rows, width, dtype=torch.int32, device=dev)
        self.lens = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.batch = Batch(self.ids, self.positions, self.slots, rows, self.tables, self.lens,
                           [], None, [])
        self.state = ForwardState()
        fns = ex._stage_fns(self.batch, self.state, CopyGroup())
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs = capture_stages(fns, dev, self.mempool)
        self.host = torch.empty(4 * rows + rows * width, dtype=torch.int64, pin_memory=True)
        self.h2d_done: torch.cuda.Event | None = None

    def release(self) -> None:
        for g in self.graphs:
            g.reset()
        self.graphs.clear()

    def forward(self, f: _Flat) -> Forward:
        rows, width, d = self.rows, self.width, f.n_dec
        if self.h2d_done is not None:
            self.h2d_done.synchronize()  # the previous forward's inputs left the buffer
        host = self.host
        host[:rows].zero_()
        host[rows:2 * rows].zero_()
        host[2 * rows:3 * rows].fill_(-1)
        host[3 * rows:].zero_()
        host[:d] = torch.tensor(f.ids, dtype=torch.int64)
        host[rows:rows + d] = torch.tensor(f.pos, dtype=torch.int64)
        host[2 * rows:2 * rows + d] = torch.tensor(f.slots, dtype=torch.int64)
        host[3 * rows:3 * rows + d] = torch.tensor(f.lens, dtype=torch.int64)
        tab = host[4 * rows:].view(rows, width)
        for i, t in enumerate(f.tables):
            tab[i, : len(t)] = torch.tensor(t, dtype=torch.int64)
        dev_in = host.to(self.ex.device, non_blocking=True)
        self.h2d_done = torch.cuda.Event()
        self.h2d_done.record()
        b = f

        def load_and_pre() -> None:
            self.ids.copy_(dev_in[:rows])
            self.positions.copy_(dev_in[rows:2 * rows])
            self.slots.copy_(dev_in[2 * rows:3 * rows])
            self.lens.copy_(dev_in[3 * rows:4 * rows])
            self.tables.copy_(dev_in[4 * rows:].view(rows, width))
            self.graphs[0].replay()

        stages: list[Callable[[], None]] = [load_and_pre]
        stages += [g.replay for g in self.graphs[1:]]

        def finish() -> dict[int, int]:
            return dict(zip(b.sample_ids, self.state.tokens[:d].tolist(), strict=True))

        return Forward(stages, finish, self.state, CopyGroup(), d)


class _ChunkedGraphs:
    """Per-layer CUDA graphs of the dense stages of rounds with prefill chunks, one set per
    bucket of the round's tokens (`_TOKEN_BUCKETS`). Attention runs eagerly between them: its
    work depends on every chunk's length and context.

    Run eagerly, such a round was host-bound on the H200 box: 19 ms of kernels in a 32.5 ms
    round of a 512-token chunk and 64 decodes (session 14), and 20 ms slower again beside a
    busy CPU engine, whose threads slow the host. A layer here is two replays and the
    attention kernels.

    Every bucket's graphs share one memory pool and one set of static buffers, sized for the
    largest bucket: each value that crosses a graph boundary (the hidden states, q, k, v, the
    attention output, RoPE's cos and sin) lives in those buffers, so the pool holds scratch
    only and the buckets' replays may come in any order. Pad rows have slot -1 (nothing
    stored) and are not sampled. capture=False calls the same stages without graphs (the CPU
    tests run the padding and the buffers that way)."""

    def __init__(self, ex: GpuExecutor, capture: bool = True) -> None:
        self.ex, self.capture = ex, capture
        self._n = 0  # rows the buffers hold, grown to the largest bucket used
        self.ids = self.positions = self.slots = self.hidden = torch.empty(0)
        self.q = self.k = self.v = self.o = self.cos = self.sin = torch.empty(0)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stages: dict[int, list[Callable[[], None]]] = {}
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._dtype, self._dev, self._shape = ex.model.w.embed.dtype, ex.device, ex.shape

    def _grow(self, rows: int) -> None:
        """Buffers for `rows` tokens; growing them drops the graphs captured over the old."""
        if rows <= self._n:
            return
        self.release()
        s, dev, dt = self._shape, self._dev, self._dtype
        self._n = rows
        self.ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        self.hidden = torch.zeros(rows, s.hidden_size, dtype=dt, device=dev)
        self.q = torch.zeros(rows, s.n_heads, s.head_dim, dtype=dt, device=dev)
        self.o = torch.zeros(rows, s.n_heads, s.head_dim, dtype=dt, device=dev)
        self.k = torch.zeros(rows, s.n_kv_heads, s.head_dim, dtype=dt, device=dev)
        self.v = torch.zeros(rows, s.n_kv_heads, s.head_dim, dtype=dt, device=dev)
        self.cos = torch.zeros(rows, s.head_dim // 2, dtype=torch.float32, device=dev)
        self.sin = torch.zeros(rows, s.head_dim // 2, dtype=torch.float32, device=dev)

    def release(self) -> None:
        """Drop every bucket's graphs. Their pool goes with the last of them, so the next
        captures take a fresh one (capturing into a released pool trips the CUDA caching
        allocator's use-count assertion: seen on the H200 box, a run's warm-up)."""
        for g in self._graphs:
            g.reset()
        self._graphs.clear()
        self.stages.clear()
        if self.capture:
            self.pool = torch.cuda.graph_pool_handle()

    def reserve(self, max_tokens: int) -> None:
        """Buffers for rounds of up to `max_tokens` tokens, before anything is captured over
        smaller ones (growing later drops and captures again)."""
        self._grow(_bucket(min(max_tokens, _TOKEN_BUCKETS[-1]), _TOKEN_BUCKETS))

    def warm(self, max_tokens: int) -> int:
        """Capture every bucket up to `max_tokens` (before the clock); returns how many."""
        self.reserve(max_tokens)
        keys = [b for b in _TOKEN_BUCKETS if b <= _bucket(max_tokens, _TOKEN_BUCKETS)]
        for tb in keys:
            self._stages(tb)
        return len(keys)

    def _dense(self, tb: int) -> list[Callable[[], None]]:
        """[embed, (qkv, post) per layer] over the first `tb` rows of the buffers."""
        ex = self.ex
        b = Batch(self.ids[:tb], self.positions[:tb], self.slots[:tb], 0,
                  torch.empty(0), torch.empty(0), [], None, [], padded=True,
                  cos=self.cos[:tb], sin=self.sin[:tb])
        h, q, k, v, o = (t[:tb] for t in (self.hidden, self.q, self.k, self.v, self.o))

        def embed() -> None:
            h.copy_(ex.model.pre_layer(b.ids))
            if ex.fused:
                for dst, src in zip((b.cos, b.sin), ex._rope_tables(b.positions), strict=True):
                    dst.copy_(src)

        fns: list[Callable[[], None]] = [embed]
        for layer in range(ex.model.n_layers):
            def qkv(layer: int = layer) -> None:
                for dst, src in zip((q, k, v), ex._pre_attn(layer, h, b), strict=True):
                    dst.copy_(src)

            def post(layer: int = layer) -> None:
                h.copy_(ex._post_attn(layer, o.view(tb, -1), h))

            fns += [qkv, post]
        return fns

    def _stages(self, tb: int) -> list[Callable[[], None]]:
        fns = self.stages.get(tb)
        if fns is not None:
            return fns
        self._grow(tb)
        fns = self._dense(tb)
        if self.capture:
            self.slots.fill_(-1)  # the capture's eager run must store nothing into the pages
            graphs = capture_stages(fns, self._dev, self.pool)
            self._graphs += graphs
            fns = [g.replay for g in graphs]
        self.stages[tb] = fns
        return fns

    def forward(self, f: _Flat, batch: Batch) -> Forward:
        """The round `f` (its eager inputs `batch`) as stage tasks."""
        ex, t = self.ex, len(f.ids)
        tb = _bucket(t, _TOKEN_BUCKETS)
        dense = self._stages(tb)
        q, k, v, o = (x[:t] for x in (self.q, self.k, self.v, self.o))
        st, copies = ForwardState(), CopyGroup()

        def load_and_embed() -> None:
            self.ids[:t].copy_(batch.ids)
            self.positions[:t].copy_(batch.positions)
            self.slots[:t].copy_(batch.slots)
            self.slots[t:tb].fill_(-1)
            dense[0]()

        def layer_stage(layer: int) -> Callable[[], None]:
            def run() -> None:
                dense[1 + 2 * layer]()
                ex._attention(layer, q, k, v, batch, copies, out=o)
                dense[2 + 2 * layer]()
            return run

        def post_layer() -> None:
            st.hidden = self.hidden[:t]
            ex._post_layer(batch, st)

        stages = [load_and_embed] + [layer_stage(i) for i in range(ex.model.n_layers)]
        stages.append(post_layer)

        def finish() -> dict[int, int]:
            return dict(zip(batch.sample_req_ids, st.tokens.tolist(), strict=True))

        return Forward(stages, finish, st, copies, len(batch.sample_req_ids))
