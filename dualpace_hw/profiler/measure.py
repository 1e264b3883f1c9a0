"""One measurement per profile table, with the runtime's own model stages and kernels.

Only one decoder layer plus the pre-layer and post-layer is built on the GPU, and on the CPU a
ring of a few layers (`cpu_layer_ring`): per-layer tables need no whole model (a 64 GB
Qwen3-32B is profiled from a few GB of weights). Inputs are random; times do not depend on
values.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import torch

from dualpace_hw import hostinfo
from dualpace_hw.executors.gpu import ForwardState
from dualpace_hw.executors.model import Dense, Model, ModelWeights, greedy
from dualpace_hw.kernels.attention import paged_decode_attention as torch_decode
from dualpace_hw.kernels.attention import prefill_attention
from dualpace_hw.memory.allocator import keep_freed_memory
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.timing import Timer
from dualpace_sim.core import PrefillChunk
from dualpace_sim.costs.shapes import ModelShape


def _gpu_decode_kernel(device: torch.device):
    if device.type == "cuda":
        from dualpace_hw.kernels import triton_decode

        if triton_decode.available():
            return triton_decode.paged_decode_attention
    return torch_decode


def _cpu_decode_kernel():
    from dualpace_hw.kernels.cpu_attention import cpu_paged_decode_attention

    return cpu_paged_decode_attention


def _pack(model: Model) -> tuple[Model, str]:
    """The CPU executor's prepacked (oneDNN/AMX) projections when available."""
    try:
        from dualpace_hw.executors.packed import pack_model
    except ImportError:
        return model, "torch.nn.functional.linear"
    return pack_model(model), "prepacked oneDNN bf16"


def small_mixed_plan(tokens, block_size: int, n_blocks: int):
    """A small batch with a prefill chunk, the kind bound by the host issuing each layer's
    kernels: one 64-token chunk and 8 decodes of 16 tokens (their ids in `tokens`). It can run
    again and again: the chunk stays a first chunk, the decodes stay at their length."""
    from dualpace_sim.core import GpuPlan, Request

    plan = GpuPlan()
    for i in range(8):
        r = Request.create(i, 0.0, 15, 16, block_size)
        r.blocks = [i % n_blocks]
        r.generated += 1  # a decoded token; its time is never recorded
        tokens.add(i, [1] * 16)
        plan.decodes.append(r)
    p = Request.create(8, 0.0, 64, 16, block_size)
    p.blocks = [(8 + j) % n_blocks for j in range(-(-64 // block_size))]
    tokens.add(8, [1] * 64)
    plan.prefills.append(PrefillChunk(p, 0, 64, False, True))
    plan.decode_context = 8 * 16
    return plan


def cache_span(cache_bytes: int) -> int:
    """The fewest bytes a timed CPU stage cycles through: twice the last-level cache (64 MiB
    assumed where sysfs is silent)."""
    return 2 * (cache_bytes or 64 * 2**20)


def timing_budget(available: int | None = None) -> int:
    """Host memory the CPU stages' layer ring and KV windows may each take: a quarter of what
    is available (1 GiB assumed where /proc is silent)."""
    available = hostinfo.available_memory_bytes() if available is None else available
    return (available or 4 * 2**30) // 4


def cpu_layer_ring(shape: ModelShape, cache_bytes: int, budget: int | None = None) -> int:
    """How many distinct layers the CPU dense stages are timed over: every layer of the model,
    as a decode step reads each once, where the timing budget holds them (packing holds a
    plain and a packed copy at its peak); and never fewer than span twice the last-level cache
    in the smallest stage's weights (QKV), up to 16. A ring spanning only
    twice the cache still read part of it from there: on the H200 box (a 300 MiB cache) a
    14-layer ring of Llama-3.1-8B's QKV timed pre-attention at 1-15 rows 1.2x faster than the
    served steps paid (docs/validation/README.md, session 19), and a ring of whole layers (3)
    had it at half (benchmarks/results/cpu_step/README.md)."""
    qkv = shape.hidden_size * (shape.q_dim + 2 * shape.kv_dim) * shape.dtype_bytes
    fewest = -(-cache_span(cache_bytes) // qkv) + 1
    held = (timing_budget() if budget is None else budget) // (2 * shape.weight_bytes_per_layer)
    return max(2, min(fewest, 16), min(shape.n_layers, held))


def ring_of(weights: ModelWeights, n: int) -> ModelWeights:
    """`n` layers in distinct memory, each a copy of the first: timings do not depend on the
    values, only on where they are, and copying is far quicker than drawing billions of
    random values on a CPU."""
    def copied(x: torch.Tensor | Dense | None) -> torch.Tensor | Dense | None:
        if isinstance(x, Dense):
            return Dense(x.weight.clone())
        return None if x is None else x.clone()

    layer = weights.layers[0]
    copies = [layer] + [dataclasses.replace(layer, **{
        f.name: copied(getattr(layer, f.name)) for f in dataclasses.fields(layer)})
        for _ in range(n - 1)]
    return dataclasses.replace(weights, layers=copies)


def cpu_kv_pool(shape: ModelShape, n_blocks: int, block_size: int, cache_bytes: int,
                budget: int | None = None) -> PagedKVPool:
    """One layer's CPU KV pool for the timed stages: `n_blocks` (the largest window the grids
    time) plus room for the windows decode attention cycles through (`kv_windows`): a window
    for each of the model's other layers, as far as the timing budget holds them, and never
    less than twice the last-level cache."""
    block_bytes = block_size * shape.kv_bytes_per_token_per_layer
    fewest = -(-cache_span(cache_bytes) // block_bytes)
    held = (timing_budget() if budget is None else budget) // block_bytes - n_blocks
    spare = max(fewest, min((shape.n_layers - 1) * n_blocks, held))
    return PagedKVPool(shape, n_blocks + spare, block_size, "cpu", n_layers=1)


def kv_windows(block_bytes: int, window_blocks: int, cache_bytes: int, n_layers: int) -> int:
    """How many disjoint block windows CPU decode attention is timed over, in turn: one for
    each of the model's layers, as a step reads each layer's KV once, and never fewer than
    span twice the last-level cache (the pool may hold fewer: `_decode_at` takes what fits).
    Over windows spanning only twice the cache, part of the KV still came from it: on the H200
    box the profiler's figure was 1.17-1.28x faster than the same batch read layer by layer
    from the runtime's pool in the same run (benchmarks/results/kernels/README.md)."""
    return max(n_layers, -(-cache_span(cache_bytes) // (block_bytes * window_blocks)))


class Measurer:
    """Holds the one-layer models, pools and timers of one profiling run."""

    def __init__(self, shape: ModelShape, gpu_device: torch.device, gpu_timer: Timer,
                 cpu_timer: Timer, grids: Grids, block_size: int, seed: int = 0,
                 gpu_model: Model | None = None, cpu: bool = True, gpu: bool = True,
                 budget: int | None = None) -> None:
        """gpu_model: the GPU-side layer to time, by default a random one of `shape`; a GPU
        tensor-parallel rank passes its shard (`shape` is then the shard's), whose `reduce`
        all-reduces, so its stages include their all-reduces. cpu, gpu: whether to build the
        CPU engine's layer and pool (a GPU rank times no CPU stage) and the GPU's (the CPU
        speed check times no GPU stage). budget: host memory the CPU layer ring and KV windows
        may each take (default `timing_budget`)."""
        self.shape, self.grids, self.bs = shape, grids, block_size
        self.gpu_device = gpu_device
        self.gpu_t, self.cpu_t = gpu_timer, cpu_timer
        cap = max(min(t, b * grids.max_request_context)
                  for b in grids.decode_batches for t in grids.decode_totals)
        cap = max(cap, max(grids.prefill_contexts + grids.prefill_chunks))
        n_blocks = -(-cap // block_size) + max(grids.decode_batches)
        if gpu:
            if gpu_model is None:
                gpu_model = Model(shape, ModelWeights.random(shape, seed, gpu_device,
                                                             n_layers=1))
            self.gpu = gpu_model
            self.gpu_decode = _gpu_decode_kernel(gpu_device)
            self.gpu_pool = PagedKVPool(shape, n_blocks, block_size, gpu_device, n_layers=1)
        self.cpu: Model | None = None
        self.cpu_ring = self.cache_bytes = 0
        self.cpu_linear = self.cpu_decode = self.cpu_pool = None
        if cpu:
            keep_freed_memory()  # time the CPU stages with the CPU engine's allocator settings
            self.cache_bytes = hostinfo.last_level_cache_bytes()
            self.cpu_ring = cpu_layer_ring(shape, self.cache_bytes, budget)
            one = ModelWeights.random(shape, seed, gpu_device, n_layers=1).map(
                lambda t: t.cpu())  # drawn on the GPU where there is one: quicker
            self.cpu, self.cpu_linear = _pack(Model(shape, ring_of(one, self.cpu_ring)))
            del one
            self.cpu_decode = _cpu_decode_kernel()
            self.cpu_pool = cpu_kv_pool(shape, n_blocks, block_size, self.cache_bytes, budget)
        self.kv_blocks = n_blocks  # the grids' blocks, without the windows' room
        self._assist = None

    # --- helpers --------------------------------------------------------------------------

    def _hidden(self, n: int, device) -> torch.Tensor:
        return torch.randn(n, self.shape.hidden_size, dtype=torch.bfloat16, device=device)

    def _attn(self, n: int, device) -> torch.Tensor:
        return torch.randn(n, self.shape.q_dim, dtype=torch.bfloat16, device=device)

    # --- GPU-main ---------------------------------------------------------------------------

    def _gpu_batch(self, n: int):
        """The GPU executor's own batch of `n` one-token rows (slots in the pool), so the
        stage timings below run the executor's kernels (fused on CUDA)."""
        from dualpace_hw.executors.gpu import GpuExecutor
        from dualpace_hw.memory.tokens import TokenStore
        from dualpace_sim.core import GpuPlan, Request

        tokens, plan = TokenStore(), GpuPlan()
        for i in range(n):
            r = Request.create(i, 0.0, 1, 1, self.bs)
            r.blocks = [i % self.gpu_pool.n_blocks]
            tokens.add(i, [1])
            plan.prefills.append(PrefillChunk(r, 0, 1, False, True))
        ex = GpuExecutor(self.gpu, self.gpu_pool, tokens, cuda_graphs=False)
        batch = ex.prepare(plan)
        state = ForwardState()
        ex.kernels.pre_layer(batch, state)
        return ex, batch, state

    def gpu_pre_attn(self, n: int) -> float:
        ex, batch, state = self._gpu_batch(n)
        return self.gpu_t.graphed(lambda: ex.kernels.pre_attn(0, state.hidden, batch))

    def gpu_post_attn(self, n: int) -> float:
        ex, _, _ = self._gpu_batch(1)
        a, r = self._attn(n, self.gpu_device), self._hidden(n, self.gpu_device)
        return self.gpu_t.graphed(lambda: ex.kernels.post_attn(0, a, r))

    def gpu_pre_layer(self, n: int) -> float:
        ids = torch.randint(0, self.shape.vocab_size, (n,), device=self.gpu_device)
        return self.gpu_t.graphed(lambda: self.gpu.pre_layer(ids))

    def gpu_post_layer(self, n: int) -> float:
        h = self._hidden(n, self.gpu_device)
        return self.gpu_t.graphed(lambda: greedy(self.gpu.post_layer(h)))

    def gpu_prefill_attn(self, chunk: int, context: int) -> float:
        context = max(context, chunk)
        s, dev = self.shape, self.gpu_device
        q = torch.randn(chunk, s.n_heads, s.head_dim, dtype=torch.bfloat16, device=dev)
        table = torch.arange(-(-context // self.bs), device=dev)
        kc, vc = self.gpu_pool.layer(0)
        return self.gpu_t(lambda: prefill_attention(q, kc, vc, table, context - chunk))

    def _decode(self, kernel, timer: Timer, pool: PagedKVPool, device, batch: int,
                total: int) -> float:
        return decode_time(self.shape, self.grids, kernel, timer, pool, device, batch, total)

    def gpu_decode_attn(self, batch: int, total: int) -> float:
        return self._decode(self.gpu_decode, self.gpu_t, self.gpu_pool, self.gpu_device, batch,
                            total)

    # --- CPU decode engine ------------------------------------------------------------------

    def cpu_pre_layer(self, b: int) -> float:
        ids = torch.randint(0, self.shape.vocab_size, (b,))
        return self.cpu_t(lambda: self.cpu.pre_layer(ids))

    def cpu_pre_attn(self, b: int) -> float:
        h, pos, layers = self._hidden(b, "cpu"), torch.arange(b), self._cpu_layers()
        return self.cpu_t(lambda: self.cpu.pre_attn(next(layers), h, pos))

    def cpu_post_attn(self, b: int) -> float:
        a, r, layers = self._attn(b, "cpu"), self._hidden(b, "cpu"), self._cpu_layers()
        return self.cpu_t(lambda: self.cpu.post_attn(next(layers), a, r))

    def _cpu_layers(self) -> Iterator[int]:
        """Each timed call takes the next layer of the ring, so its weights come from memory
        as in a decode step, which reads every layer's once."""
        return itertools.cycle(range(self.cpu_ring))

    def cpu_post_layer(self, b: int) -> float:
        h = self._hidden(b, "cpu")
        return self.cpu_t(lambda: greedy(self.cpu.post_layer(h)))

    def cpu_decode_attn(self, batch: int, total: int) -> float:
        return decode_time(self.shape, self.grids, self.cpu_decode, self.cpu_t, self.cpu_pool,
                           "cpu", batch, total, self.cache_bytes)

    def _buffer_copy(self, rows: int, width: int) -> float:
        """A copy into (or out of) a pinned Assist Buffer, as the CPU worker does."""
        pin = self.gpu_device.type == "cuda"
        buf = torch.empty(rows, width, dtype=torch.bfloat16, pin_memory=pin)
        src = torch.randn(rows, width, dtype=torch.bfloat16)
        return self.cpu_t(lambda: buf.copy_(src))

    def assist_write(self, b: int) -> float:  # a_w: residual and attention output
        return self._buffer_copy(b, self.shape.hidden_size + self.shape.q_dim)

    def assist_read(self, b: int) -> float:  # a_r: the GPU-produced hidden state
        return self._buffer_copy(b, self.shape.hidden_size)

    def hidden_write(self, b: int) -> float:  # h_w: the CPU-produced final hidden state
        return self._buffer_copy(b, self.shape.hidden_size)

    # --- Dense Assist on the GPU worker -------------------------------------------------------

    def assist_executor(self):
        if self._assist is None:
            from dualpace_hw.executors.gpu import GpuExecutor
            from dualpace_hw.memory.tokens import TokenStore

            self._assist = GpuExecutor(self.gpu, self.gpu_pool, TokenStore())
        return self._assist

    def assist(self, kind: str, b: int) -> tuple[float, float]:
        """(g_x(b), CPU-visible wall time of the same call): the complete CUDA path of one
        assist, activations in and results out, and what the caller waited for it."""
        ex = self.assist_executor()
        a, r = self._attn(b, "cpu"), self._hidden(b, "cpu")
        call = {
            "p": lambda: ex.assist_post_attn(0, a, r),
            "lA": lambda: ex.assist_fused_final(0, a, r),
            "lS": lambda: ex.assist_post_layer(r),
        }[kind]
        return self.gpu_t(call), self.cpu_t.wall(call)

    def poll_s(self) -> float:
        """One stage-boundary check: an event query plus a shared flag read."""
        flag = torch.zeros(1, dtype=torch.int32)
        if self.gpu_device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            return self.cpu_t(lambda: (event.query(), int(flag[0])))
        return self.cpu_t(lambda: int(flag[0]))

    # --- link ---------------------------------------------------------------------------------

    def link(self) -> dict[str, float]:
        """Pinned H2D / D2H bandwidth (256 MiB copies) and latency (a 4 KiB copy)."""
        if self.gpu_device.type != "cuda":
            # GPU path on the CPU (tests): a host memcpy stands for the link.
            big = torch.empty(64 << 20, dtype=torch.uint8)
            dst = torch.empty_like(big)
            t = self.cpu_t(lambda: dst.copy_(big))
            small = torch.empty(4096, dtype=torch.uint8)
            lat = self.cpu_t(lambda: small.clone())
            bw = big.numel() / max(t, 1e-9)
            return {"h2d_bytes_per_s": bw, "d2h_bytes_per_s": bw, "latency_s": lat}
        n = 256 << 20
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=self.gpu_device)
        h2d = self.gpu_t(lambda: dev.copy_(host, non_blocking=True))
        d2h = self.gpu_t(lambda: host.copy_(dev, non_blocking=True))
        hs = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
        ds = torch.empty(4096, dtype=torch.uint8, device=self.gpu_device)
        lat = self.gpu_t.wall(lambda: ds.copy_(hs, non_blocking=True))
        return {"h2d_bytes_per_s": n / h2d, "d2h_bytes_per_s": n / d2h, "latency_s": lat}

    def iteration_overhead(self) -> float:
        """Host-side work of one round: the GPU executor turning a 64-request decode plan
        into device tensors (the scheduler's own time is not in the profile)."""
        from dualpace_hw.executors.gpu import GpuExecutor
        from dualpace_hw.memory.tokens import TokenStore

        tokens = TokenStore()
        plan = decode_plan(tokens, 64, 256, self.bs)
        ex = GpuExecutor(self.gpu, self.gpu_pool, tokens)
        return self.cpu_t.wall(lambda: ex.prepare(plan))

    def eager_layer(self) -> float:
        """The floor of a layer of a batch with prefill chunks, as the runtime runs one: a
        small mixed batch (one 64-token chunk, 8 decodes) through the executor's layer stage,
        back to back, so where the GPU is faster than the host this is the host's time to
        issue the layer (the stage tables are graph replays and leave it out). On one CUDA
        GPU the stage replays the chunked rounds' layer graphs around eager attention;
        eagerly elsewhere. Measured eagerly on the H200 box it was 0.54 ms a layer, and
        served chunked rounds with the CPU engine idle came out 13 ms under that floor's
        price (session 15, dualpace_sim/validation/analysis/prefill_excess.py)."""
        return self._eager_layer_of(chunk=True, runtime=True)

    def eager_prefill_layer(self) -> float:
        """neo.eager_prefill_layer_s: the same batch through the layer eagerly, the floor of
        a layer of NEO's sub-batches with prefills (SwiftLLM captures no CUDA graphs)."""
        return self._eager_layer_of(chunk=True)

    def eager_decode_layer(self) -> float:
        """neo.eager_decode_layer_s: the same batch without its chunk (its 8 decodes), the floor
        of a layer of NEO's decode sub-batches: NEO runs every iteration eagerly (SwiftLLM
        captures no CUDA graphs), where vLLM's and DualPace's decode rounds replay graphs."""
        return self._eager_layer_of(chunk=False)

    def _eager_layer_of(self, chunk: bool, runtime: bool = False) -> float:
        from dualpace_hw.executors.gpu import GpuExecutor
        from dualpace_hw.memory.migrate import CopyGroup
        from dualpace_hw.memory.tokens import TokenStore

        tokens = TokenStore()
        plan = small_mixed_plan(tokens, self.bs, self.gpu_pool.n_blocks)
        if not chunk:
            plan.prefills.clear()
        # runtime: the executor as the runtime builds it, its chunked rounds' graphs where it
        # has them; else eagerly, as NEO runs
        ex = GpuExecutor(self.gpu, self.gpu_pool, tokens, cuda_graphs=None if runtime else False)
        if ex.chunked is not None:
            fw = ex.forward(ex.round_of(plan))
            fw.stages[0]()  # the inputs loaded, the pre-layer run
            return self.gpu_t(fw.stages[1])
        batch, state, copies = ex.prepare(plan), ForwardState(), CopyGroup()
        ex.kernels.pre_layer(batch, state)
        return self.gpu_t(lambda: ex.kernels.layer(0, batch, state, copies))

    def neo_launch_s(self) -> float:
        """NEO's lnch_T: the fixed cost of one CPU attention call (a one-token batch)."""
        return self.cpu_decode_attn(1, 1)


def decode_plan(tokens, rows: int, context: int, block_size: int):
    """A decode-only GPU round of `rows` requests with `context` tokens each, in blocks of
    their own (the tokens go into `tokens`, a TokenStore)."""
    from dualpace_sim.core import GpuPlan, Request

    plan, per = GpuPlan(), -(-context // block_size)
    for i in range(rows):
        r = Request.create(i, 0.0, context - 1, 16, block_size)
        r.blocks = list(range(i * per, (i + 1) * per))
        r.generated += 1  # a decoded token; its time is never recorded
        tokens.add(i, [1] * context)
        plan.decodes.append(r)
    return plan


def decode_time(shape: ModelShape, grids: Grids, kernel, timer: Timer, pool: PagedKVPool,
                device, batch: int, total: int, cache_bytes: int | None = None) -> float:
    """Paged decode attention of `batch` requests over `total` context tokens, each with its
    own blocks. Beyond the per-request cap the time is extended along the line through the cap
    and half the cap (attention is affine in the context it reads). With `cache_bytes` (the CPU)
    the calls take disjoint block windows in turn (`kv_windows`), as many as the pool holds."""
    per = max(1, total // batch)
    cap = grids.max_request_context
    if per <= cap:
        return _decode_at(shape, kernel, timer, pool, device, batch, per, cache_bytes)
    at_cap = _decode_at(shape, kernel, timer, pool, device, batch, cap, cache_bytes)
    at_half = _decode_at(shape, kernel, timer, pool, device, batch, cap // 2, cache_bytes)
    slope = max(at_cap - at_half, 0.0) / (cap - cap // 2)
    return at_cap + slope * (per - cap)


def _decode_at(shape: ModelShape, kernel, timer: Timer, pool: PagedKVPool, device, batch: int,
               context: int, cache_bytes: int | None = None) -> float:
    nb = -(-context // pool.block_size)
    window = batch * nb
    n = 1
    if cache_bytes is not None:
        block_bytes = pool.block_size * shape.kv_bytes_per_token_per_layer
        n = max(1, min(kv_windows(block_bytes, window, cache_bytes, shape.n_layers),
                       pool.n_blocks // window))
    tables = [torch.arange(k * window, (k + 1) * window, dtype=torch.int32,
                           device=device).view(batch, nb) for k in range(n)]
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, shape.n_heads, shape.head_dim, dtype=torch.bfloat16, device=device)
    kc, vc = pool.layer(0)
    if n == 1:
        return timer.graphed(lambda: kernel(q, kc, vc, tables[0], lens))
    ring = itertools.cycle(tables)
    return timer(lambda: kernel(q, kc, vc, next(ring), lens))
