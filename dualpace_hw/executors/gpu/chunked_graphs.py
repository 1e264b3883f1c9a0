"""CUDA graphs of the dense stages of rounds with prefill chunks.

Rounds with prefill chunks replay per-layer graphs of their dense stages, one set per token
bucket, with attention run eagerly between them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dualpace_hw.executors.gpu.batch import Batch, FlatBatch
from dualpace_hw.executors.gpu.forward import Forward, ForwardState
from dualpace_hw.executors.gpu.graphs import bucket, capture_stages
from dualpace_hw.executors.gpu.stages import StageKernels
from dualpace_hw.memory.migrate import CopyGroup

# A chunked round's tokens, padded up to one of these: every 32 to 1,024, every 64 to 2,048,
# every 256 to 8,192 (the scheduler's hard cap), so a pad adds at most 6 % of dense work.
TOKEN_BUCKETS = (tuple(range(32, 1025, 32)) + tuple(range(1088, 2049, 64))
                 + tuple(range(2304, 8193, 256)))


class ChunkedGraphs:
    """Per-layer CUDA graphs of the dense stages of rounds with prefill chunks, one set per
    bucket of the round's tokens (`TOKEN_BUCKETS`). Attention runs eagerly between them: its
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

    def __init__(self, kernels: StageKernels, capture: bool = True) -> None:
        self.kernels, self.capture = kernels, capture
        self._n = 0  # rows the buffers hold, grown to the largest bucket used
        self.ids = self.positions = self.slots = self.hidden = torch.empty(0)
        self.q = self.k = self.v = self.o = self.cos = self.sin = torch.empty(0)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stages: dict[int, list[Callable[[], None]]] = {}
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._dtype, self._dev = kernels.model.w.embed.dtype, kernels.device
        self._shape = kernels.shape

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
        self._grow(bucket(min(max_tokens, TOKEN_BUCKETS[-1]), TOKEN_BUCKETS))

    def warm(self, max_tokens: int) -> int:
        """Capture every bucket up to `max_tokens` (before the clock); returns how many."""
        self.reserve(max_tokens)
        keys = [b for b in TOKEN_BUCKETS if b <= bucket(max_tokens, TOKEN_BUCKETS)]
        for tb in keys:
            self._stages(tb)
        return len(keys)

    def _dense(self, tb: int) -> list[Callable[[], None]]:
        """[embed, (qkv, post) per layer] over the first `tb` rows of the buffers."""
        kn = self.kernels
        b = Batch(self.ids[:tb], self.positions[:tb], self.slots[:tb], 0,
                  torch.empty(0), torch.empty(0), [], None, [], padded=True,
                  cos=self.cos[:tb], sin=self.sin[:tb])
        h, q, k, v, o = (t[:tb] for t in (self.hidden, self.q, self.k, self.v, self.o))

        def embed() -> None:
            h.copy_(kn.model.pre_layer(b.ids))
            if kn.fused:
                for dst, src in zip((b.cos, b.sin), kn.rope_tables(b.positions), strict=True):
                    dst.copy_(src)

        fns: list[Callable[[], None]] = [embed]
        for layer in range(kn.model.n_layers):
            def qkv(layer: int = layer) -> None:
                for dst, src in zip((q, k, v), kn.pre_attn(layer, h, b), strict=True):
                    dst.copy_(src)

            def post(layer: int = layer) -> None:
                h.copy_(kn.post_attn(layer, o.view(tb, -1), h))

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

    def forward(self, f: FlatBatch, batch: Batch) -> Forward:
        """The round `f` (its eager inputs `batch`) as stage tasks."""
        kn, t = self.kernels, len(f.ids)
        tb = bucket(t, TOKEN_BUCKETS)
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
                kn.attention(layer, q, k, v, batch, copies, out=o)
                dense[2 + 2 * layer]()
            return run

        def post_layer() -> None:
            st.hidden = self.hidden[:t]
            kn.post_layer(batch, st)

        stages = [load_and_embed] + [layer_stage(i) for i in range(kn.model.n_layers)]
        stages.append(post_layer)

        def finish() -> dict[int, int]:
            return dict(zip(batch.sample_req_ids, st.tokens.tolist(), strict=True))

        return Forward(stages, finish, st, copies, len(batch.sample_req_ids))
