"""The GPU executor over hand-built GpuPlans, against the dense reference forward.

Runs on the CPU device in CI (float32, exact comparisons) and on CUDA with
DUALPACE_TEST_DEVICE=cuda (bf16 too, compared with a relative tolerance and tokens checked
where the reference's top-2 margin is clear of it).
"""

from __future__ import annotations

import pytest
import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights, greedy
from dualpace_hw.executors.tp import shard_shape
from dualpace_hw.kernels.attention import gather_kv, paged_decode_attention
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.migrate import Migrator
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.blocks import BlockPool
from dualpace_sim.core.plans import BlockMoves, GpuPlan, PrefillChunk
from dualpace_sim.core.request import Owner, Request, RoundLog, blocks_for
from dualpace_sim.costs.shapes import ModelShape
from tests.hw.reference import dense_logits

BS = 4


def dtypes(device: str) -> list[torch.dtype]:
    return [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def tol(dtype: torch.dtype, device: str) -> float:
    if device == "cpu":
        return 1e-5
    return 2e-2 if dtype == torch.bfloat16 else 1e-4


class Box:
    """What the core and the runtime would hold: block pools, pools, a token store."""

    def __init__(self, name: str, device: str, dtype: torch.dtype, graphs: bool | None = None,
                 gpu_blocks: int = 48, host_blocks: int = 48, seed: int = 1,
                 chunked: bool | None = None) -> None:
        self.shape = ModelShape.from_name(name)
        self.device = device
        self.model = Model(self.shape, ModelWeights.random(self.shape, seed=seed, device=device,
                                                           dtype=dtype))
        self.pool = PagedKVPool(self.shape, gpu_blocks, BS, device=device, dtype=dtype)
        self.host_pool = PagedKVPool(self.shape, host_blocks, BS, device="cpu", dtype=dtype,
                                     pin_memory=device != "cpu")
        self.hbm = BlockPool("HBM", gpu_blocks)
        self.host = BlockPool("host", host_blocks)
        self.tokens = TokenStore()
        self.ex = GpuExecutor(self.model, self.pool, self.tokens, self.host_pool,
                              cuda_graphs=graphs, chunked_graphs=chunked)
        self.reqs: dict[int, Request] = {}
        self.logits: dict[int, list[torch.Tensor]] = {}
        self.t = 0.0
        self.rounds = RoundLog()  # the rounds the requests' tokens are booked in

    def add(self, req_id: int, prompt: list[int], max_tokens: int = 8) -> Request:
        r = Request.create(req_id, 0.0, len(prompt), max_tokens, BS)
        self.tokens.add(req_id, prompt)
        self.reqs[req_id] = r
        self.logits[req_id] = []
        return r

    def chunk(self, r: Request, tokens: int, to_cpu: bool = False) -> PrefillChunk:
        if not r.blocks:  # the core's commit: persistent blocks for the whole prompt
            pool = self.host if to_cpu else self.hbm
            r.blocks = pool.allocate(blocks_for(r.prompt_tokens, BS))
            r.to_cpu = to_cpu
        start = r.prefilled
        return PrefillChunk(r, start, tokens, to_cpu, start + tokens == r.prompt_tokens)

    def plan(self, decodes: list[Request] = (), chunks: list[PrefillChunk] = ()) -> GpuPlan:
        for r in decodes:  # the core's commit: next-token blocks
            r.blocks.extend(self.hbm.allocate(r.next_blocks(BS)))
        return GpuPlan(decodes=list(decodes), prefills=list(chunks))

    def run(self, plan: GpuPlan, staged: bool = False, moves: BlockMoves | None = None
            ) -> dict[int, int]:
        if staged or moves is not None:
            fw = self.ex.stages(plan, moves)
            for stage in fw:
                stage()
            out = fw.result()
        else:
            out = self.ex.execute(plan)
            fw = self.ex.last_forward
        order = [r.req_id for r in plan.decodes] + [c.req.req_id for c in plan.prefills if c.last]
        assert list(out) == order
        for i, req_id in enumerate(order):
            self.logits[req_id].append(fw.logits[i].detach().float().cpu())
        self.apply(plan, out)
        return out

    def swap_out(self, r: Request) -> list[int]:
        """Swap a decode out to the host as the core's commit does (host blocks in place of
        its HBM ones), then copy its moves. Returns the HBM blocks it left."""
        gpu_ids = list(r.blocks)
        r.blocks = self.host.allocate(len(gpu_ids))
        self.hbm.release(gpu_ids)
        self.ex.migrate(BlockMoves((gpu_ids, list(r.blocks)))).wait()
        return gpu_ids

    def apply(self, plan: GpuPlan, out: dict[int, int]) -> None:
        self.t += 1.0
        for c in plan.prefills:
            c.req.prefilled += c.tokens
        for req_id, tok in out.items():
            self.reqs[req_id].emit(self.t, Owner.GPU, self.rounds)
            self.tokens.append(req_id, tok)


def swap_in_moves(r: Request) -> BlockMoves:
    """The moves the core's commit returns for swapping `r` in (its host blocks to the first
    of its new HBM ones)."""
    return BlockMoves(swap_in=(r.source_blocks, r.blocks[: len(r.source_blocks)]))


PROMPTS = {
    1: [3, 17, 42, 5, 99, 7, 1, 250, 13, 64, 8],
    2: [11, 12, 13, 14, 15, 16, 17],
    3: [200, 1, 2, 3, 4],
    4: [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 10, 20, 30],
}


def mixed_schedule(box: Box, staged: bool = False) -> None:
    """Chunked prefills mixed with decodes over several steps."""
    r1, r2, r3, r4 = (box.add(i, p) for i, p in PROMPTS.items())
    box.run(box.plan([], [box.chunk(r1, 6), box.chunk(r2, 7)]), staged)  # r1 part, r2 whole
    box.run(box.plan([r2], [box.chunk(r1, 5)]), staged)  # r1 completes
    box.run(box.plan([r1, r2], [box.chunk(r4, 4)]), staged)
    box.run(box.plan([r2, r1], [box.chunk(r4, 5), box.chunk(r3, 5)]), staged)
    box.run(box.plan([r1, r2, r3], [box.chunk(r4, 4)]), staged)
    for _ in range(3):
        box.run(box.plan([r4, r1, r2, r3]), staged)


def check_against_reference(box: Box, dtype: torch.dtype) -> None:
    """Each sampled token's logits equal the dense forward over the request's actual ids."""
    for req_id, got in box.logits.items():
        if not got:
            continue
        ids = box.tokens.ids(req_id)
        p = box.tokens.prompt_len(req_id)
        ref = dense_logits(box.model, ids[:-1]).float().cpu()[p - 1:]
        got_t = torch.stack(got)
        assert got_t.shape == ref.shape
        err = rel_err(got_t, ref)
        assert err < tol(dtype, box.device), f"request {req_id}: relative error {err}"
        sampled = torch.tensor(box.tokens.generated(req_id))
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 4 * tol(dtype, box.device) * ref.abs().max()
        assert torch.equal(sampled[clear], ref.argmax(-1)[clear]), f"request {req_id}"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_mixed_prefill_and_decode_steps_equal_the_dense_reference(name, device):
    for dtype in dtypes(device):
        box = Box(name, device, dtype)
        mixed_schedule(box)
        check_against_reference(box, dtype)
        assert len(box.tokens.generated(4)) == 4


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_whole_forward_equals_stage_by_stage(name, device):
    for dtype in dtypes(device):
        a, b = Box(name, device, dtype), Box(name, device, dtype)
        mixed_schedule(a, staged=False)
        mixed_schedule(b, staged=True)
        for req_id in PROMPTS:
            assert a.tokens.ids(req_id) == b.tokens.ids(req_id)
            assert all(torch.equal(x, y) for x, y in zip(a.logits[req_id], b.logits[req_id],
                                                         strict=True))


def test_cuda_graph_decodes_equal_eager_decodes(device):
    if device == "cpu":
        pytest.skip("CUDA graphs are a CUDA path")
    a = Box("tiny-llama", device, torch.float32, graphs=True)
    b = Box("tiny-llama", device, torch.float32, graphs=False)
    mixed_schedule(a)
    mixed_schedule(b)
    assert a.ex._graphs, "the decode-only steps should have replayed graphs"
    for req_id in PROMPTS:
        assert a.tokens.ids(req_id) == b.tokens.ids(req_id)
        got, ref = torch.stack(a.logits[req_id]), torch.stack(b.logits[req_id])
        assert rel_err(got, ref) < 1e-4


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_chunked_rounds_through_the_layer_graphs_equal_eager_rounds(name, device):
    """Rounds with prefill chunks run padded to a token bucket over the static buffers (their
    dense stages captured as graphs on CUDA, called as they are on the CPU): the same tokens
    and logits as the eager rounds, and the dense reference's."""
    for dtype in dtypes(device):
        a = Box(name, device, dtype, chunked=True)
        b = Box(name, device, dtype, graphs=False, chunked=False)
        mixed_schedule(a)
        mixed_schedule(b)
        assert a.ex.chunked is not None and sorted(a.ex.chunked.stages) == [32]
        assert b.ex.chunked is None
        check_against_reference(a, dtype)
        for req_id in PROMPTS:
            assert a.tokens.ids(req_id) == b.tokens.ids(req_id)
            got, ref = torch.stack(a.logits[req_id]), torch.stack(b.logits[req_id])
            assert rel_err(got, ref) <= tol(dtype, device)


def test_a_chunked_rounds_pad_rows_store_nothing_into_the_pages(device):
    """A 7-token round padded to 32 rows writes the K/V of its 7 slots and no other."""
    box = Box("tiny-llama", device, torch.float32, chunked=True)
    r = box.add(1, PROMPTS[2])
    plan = box.plan([], [box.chunk(r, 7)])
    before = box.pool.data.clone()
    box.run(plan)
    changed = (box.pool.data != before).flatten(3).any(-1)  # [layers, K|V, block, kv head]
    written = {b for b in r.blocks}
    for blk in range(box.pool.n_blocks):
        assert bool(changed[:, :, blk].any()) == (blk in written), f"block {blk}"
    # the next chunked round, 5 tokens after 7 padded rows, reads nothing stale
    r2 = box.add(2, PROMPTS[3])
    box.run(box.plan([r], [box.chunk(r2, 5)]))
    check_against_reference(box, torch.float32)


def test_the_chunked_buffers_grow_to_the_largest_bucket_and_keep_their_rounds_exact(device):
    """A round past the first bucket grows the static buffers (the graphs over the old ones
    are dropped and captured again), and every round still equals the eager one."""
    a = Box("tiny-llama", device, torch.float32, chunked=True, gpu_blocks=64)
    b = Box("tiny-llama", device, torch.float32, graphs=False, chunked=False, gpu_blocks=64)
    for box in (a, b):
        small, big = box.add(1, list(range(1, 12))), box.add(2, list(range(40, 80)))
        box.run(box.plan([], [box.chunk(small, 11)]))  # bucket 32
        box.run(box.plan([small], [box.chunk(big, 40)]))  # 41 rows: bucket 64
        box.run(box.plan([small, big], [box.chunk(box.add(3, [5, 6, 7]), 3)]))  # 32 again
    assert sorted(a.ex.chunked.stages) == [32, 64]
    for req_id in (1, 2, 3):
        assert a.tokens.ids(req_id) == b.tokens.ids(req_id)
        assert rel_err(torch.stack(a.logits[req_id]), torch.stack(b.logits[req_id])) <= 1e-5


def test_the_warm_up_captures_the_chunked_buckets_a_run_reaches_and_rounds_stay_exact(device):
    """`warm_up(max_tokens=...)` sizes the buffers first and captures every bucket up to the
    run's round size (its own prefill included), and a later round, a capture on first use
    past them and a regrowth keep the eager rounds' tokens."""
    a = Box("tiny-llama", device, torch.float32, chunked=True, gpu_blocks=64)
    b = Box("tiny-llama", device, torch.float32, graphs=False, chunked=False, gpu_blocks=64)
    a.ex.warm_up(2, 64, max_tokens=64)
    assert a.ex.chunked_buckets == 2 and sorted(a.ex.chunked.stages) == [32, 64]
    for box in (a, b):
        small, big = box.add(1, list(range(1, 12))), box.add(2, list(range(40, 110)))
        box.run(box.plan([], [box.chunk(small, 11)]))
        box.run(box.plan([small], [box.chunk(big, 70)]))  # 71 rows: past the warmed buckets
    assert 96 in a.ex.chunked.stages
    for req_id in (1, 2):
        assert a.tokens.ids(req_id) == b.tokens.ids(req_id)


def test_a_prefill_round_issues_its_stages_without_waiting_for_the_gpu(device):
    """No stage of a round with a chunk (chunked graphs or eager) synchronizes with the GPU:
    its inputs go up as one pinned, non-blocking copy and the flash kernel's lengths with
    them. A blocking upload a layer kept the host from running ahead of the GPU (128 stream
    synchronizations in four prefill rounds on the H200 box)."""
    if device == "cpu":
        pytest.skip("stream synchronization is CUDA's")
    for chunked in (True, False):
        box = Box("tiny-llama", device, torch.bfloat16, chunked=chunked)
        r, other = box.add(1, PROMPTS[4]), box.add(2, PROMPTS[2])
        box.run(box.plan([], [box.chunk(other, 7)]))
        box.run(box.plan([other], [box.chunk(r, 6)]))  # captures the bucket, off the check
        r3 = box.add(3, PROMPTS[1])
        plan = box.plan([other, r], [box.chunk(r3, 8)])
        fw = box.ex.stages(plan)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for stage in fw:
                stage()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        box.apply(plan, fw.result())


@pytest.mark.parametrize("name,scatter", [("tiny-llama", False), ("tiny-qwen3", False),
                                          ("tiny-llama", True)])
def test_prefill_to_cpu_lands_the_kv_a_gpu_bound_prefill_writes(name, scatter, device):
    """The same schedule twice, the prompt GPU-bound in one run and Prefill-to-CPU in the
    other (same rows, so the same arithmetic): the host pages equal the HBM pages. Host ids
    as a fresh pool hands them out (one descending run) or scattered after churn."""
    for dtype in dtypes(device):
        runs = []
        for to_cpu in (False, True):
            box = Box(name, device, dtype)
            if scatter:
                box.host.allocate(8)
                box.host.release([3, 0, 5, 1])  # the next 4-block allocation: [3, 0, 5, 1]
            r = box.add(10, PROMPTS[4])
            other = box.add(12, PROMPTS[2])
            box.run(box.plan([], [box.chunk(other, 7)]))
            for n in (5, 5, 3):  # the prompt in three chunks beside a decode
                box.run(box.plan([other], [box.chunk(r, n, to_cpu=to_cpu)]))
                if to_cpu:
                    box.ex.copies.wait()
                    assert box.ex.copies_done()
            runs.append((box, r))
        (gbox, gr), (cbox, cr) = runs
        assert not cbox.hbm.used - gbox.hbm.used + len(gr.blocks)  # no HBM for the CPU prompt
        assert gbox.tokens.ids(10) == cbox.tokens.ids(10)
        n = len(PROMPTS[4])
        for layer in range(gbox.shape.n_layers):
            gk, gv = gather_kv(*gbox.pool.layer(layer), torch.tensor(gr.blocks, device=device), n)
            hk, hv = gather_kv(*cbox.host_pool.layer(layer), torch.tensor(cr.blocks), n)
            t = tol(dtype, device)
            assert rel_err(hk, gk.cpu()) <= t and rel_err(hv, gv.cpu()) <= t
            if device == "cpu":
                assert torch.equal(hk, gk) and torch.equal(hv, gv)
        assert rel_err(cbox.logits[10][0], gbox.logits[10][0]) <= tol(dtype, device)


def test_prefill_to_cpu_then_cpu_side_decode_continues_the_sequence(device):
    """After Prefill-to-CPU, decoding over the host pages (reference attention, host model)
    gives the dense reference's next logits: the landed pages are complete."""
    box = Box("tiny-llama", device, torch.float32)
    prompt = PROMPTS[1]
    r = box.add(20, prompt)
    box.run(box.plan([], [box.chunk(r, 6, to_cpu=True)]))
    box.run(box.plan([], [box.chunk(r, 5, to_cpu=True)]))
    box.ex.copies.wait()
    host_model = Model(box.shape, box.model.w.to("cpu"))  # the same weights (seeded draws
    # differ between devices)
    ids = box.tokens.ids(20)
    p = len(ids) - 1
    r.blocks.extend(box.host.allocate(r.next_blocks(BS)))
    slot = r.blocks[p // BS] * BS + p % BS
    h = host_model.pre_layer(torch.tensor([ids[-1]]))
    for layer in range(host_model.n_layers):
        q, k, v = host_model.pre_attn(layer, h, torch.tensor([p]))
        box.host_pool.write(layer, torch.tensor([slot]), k, v)
        o = paged_decode_attention(q, *box.host_pool.layer(layer), torch.tensor([r.blocks]),
                                   torch.tensor([p + 1]))
        h = host_model.post_attn(layer, o.reshape(1, -1), h)
    got = host_model.post_layer(h)
    ref = dense_logits(host_model, ids)[-1:]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_swapped_out_and_back_request_decodes_the_same_tokens(device):
    """A decode swapped out to the host and back into other HBM blocks continues exactly."""
    dtype = torch.float32
    a, b = Box("tiny-llama", device, dtype), Box("tiny-llama", device, dtype)
    for box in (a, b):
        r = box.add(1, PROMPTS[1])
        box.run(box.plan([], [box.chunk(r, 11)]))
        box.run(box.plan([r]))
    ra = a.reqs[1]
    gpu_ids = a.swap_out(ra)  # a: swap out, then back
    a.pool.data[:, :, gpu_ids] = 0  # the HBM copy is gone
    in_plan = GpuPlan(swap_ins=[ra], decodes=[ra])
    ra.source_blocks = ra.blocks
    a.hbm.allocate(3)  # so the swap-in lands in other blocks
    ra.blocks = a.hbm.allocate(len(ra.source_blocks) + ra.next_blocks(BS))
    assert not set(ra.blocks) & set(gpu_ids)
    out_a = a.run(in_plan, moves=swap_in_moves(ra))
    a.ex.swap_handle.wait()
    out_b = b.run(b.plan([b.reqs[1]]))
    assert out_a == out_b
    for _ in range(2):
        assert a.run(a.plan([ra])) == b.run(b.plan([b.reqs[1]]))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_dense_assist_equals_the_models_own_stages_on_the_cpu(name, device):
    shape = ModelShape.from_name(name)
    dtype = torch.float32
    model = Model(shape, ModelWeights.random(shape, seed=3, device=device, dtype=dtype))
    cpu = Model(shape, model.w.to("cpu"))  # the same weights: seeded draws differ by device
    pool = PagedKVPool(shape, 4, BS, device=device, dtype=dtype)
    ex = GpuExecutor(model, pool, TokenStore())
    g = torch.Generator().manual_seed(0)
    t = tol(dtype, device)
    for b in (1, 5, 33):
        attn = torch.randn(b, shape.q_dim, generator=g)
        res = torch.randn(b, shape.hidden_size, generator=g)
        for layer in range(shape.n_layers):
            got = ex.assist_post_attn(layer, attn, res)
            assert got.device.type == "cpu"
            ref = cpu.post_attn(layer, attn, res)
            assert rel_err(got, ref) < t
        h = cpu.post_attn(0, attn, res)
        logits = cpu.post_layer(h)
        clear = (logits.topk(2, -1).values.diff(dim=-1).abs()[:, 0] > 1e-3)
        toks = ex.assist_post_layer(h)
        assert toks.device.type == "cpu"
        assert torch.equal(toks[clear], greedy(logits)[clear])
        last = shape.n_layers - 1
        logits = cpu.post_layer(cpu.post_attn(last, attn, res))
        clear = (logits.topk(2, -1).values.diff(dim=-1).abs()[:, 0] > 1e-3)
        toks = ex.assist_fused_final(last, attn, res)
        assert torch.equal(toks[clear], greedy(logits)[clear])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="streams are CUDA's")
def test_a_dense_assist_does_not_queue_behind_the_round_in_flight():
    """On the compute stream an assist waits for whatever the host has issued there (a whole
    stage of an eager prefill round) and drains it; on the assist stream it does not."""
    shape = ModelShape.from_name("tiny-llama")
    model = Model(shape, ModelWeights.random(shape, seed=3, device="cuda"))
    ex = GpuExecutor(model, PagedKVPool(shape, 4, BS, device="cuda"), TokenStore())
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(8, shape.q_dim, generator=g)
    res = torch.randn(8, shape.hidden_size, generator=g)
    out = torch.empty(8, shape.hidden_size, pin_memory=True)
    ex.assist_post_attn(0, attn, res, out=out)  # warm-up
    torch.cuda.synchronize()
    ref = out.clone()
    out.zero_()
    busy = torch.cuda.Event()
    torch.cuda._sleep(1 << 31)  # a long kernel on the compute stream, about a second
    busy.record()
    ex.assist_post_attn(0, attn, res, out=out)
    assert not busy.query(), "the assist waited for the compute stream"
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.parametrize("rank", [None, 1], ids=["whole-pool", "tp-rank-1-heads"])
def test_swap_out_then_swap_in_round_trips_exactly_into_other_blocks(device, rank):
    """Also for GPU tensor-parallel rank 1, whose host pool is its heads' slice of each page
    of the shared pool: its swaps land in its heads and leave the other rank's alone."""
    full = ModelShape.from_name("tiny-qwen3")
    shape = full if rank is None else shard_shape(full, 2)
    gpu = PagedKVPool(shape, 32, BS, device=device, dtype=torch.bfloat16)
    shared = PagedKVPool(full, 32, BS, device="cpu", dtype=torch.bfloat16,
                         pin_memory=device != "cpu")
    host = shared if rank is None else shared.heads(shape, rank)
    gpu.data.copy_(torch.randn(gpu.data.shape, dtype=torch.float32).to(torch.bfloat16))
    before = gpu.data.clone()
    methods = ["auto"] if device == "cpu" else ["dma", "kernel", "auto"]
    cases = [
        ([3, 7, 2, 9, 10, 11], [5, 6, 0, 1, 2, 3], [20, 21, 22, 23, 24, 25]),  # mixed runs
        ([12, 13, 14, 15], [31, 30, 29, 28], [4, 5, 6, 8]),  # a descending host run (LIFO)
        ([16, 1, 17], [8, 20, 14], [26, 19, 27]),  # scattered
        ([4, 5, 6, 7], [8, 9, 10, 11], [16, 17, 18, 19]),  # runs on both sides: direct DMAs
    ]
    variants = [(m, True) for m in methods] + ([("dma", False)] if device != "cpu" else [])
    for method, use_2d in variants:
        m = Migrator(gpu, host, method=method, use_2d=use_2d)
        for src, mid, dst in cases:
            shared.data.zero_()
            m.swap_out(src, mid).wait()
            for i, hb in enumerate(mid):
                assert torch.equal(host.data[:, :, hb], before[:, :, src[i]].cpu())
            assert shared.data.count_nonzero() == host.data.count_nonzero()  # nothing else
            gpu.data[:, :, dst] = 0
            m.swap_in(mid, dst).wait()
            assert torch.equal(gpu.data[:, :, dst], before[:, :, src])
            gpu.data.copy_(before)


def test_layer_pages_land_in_a_tensor_parallel_ranks_heads(device):
    """Prefill-to-CPU page copies of GPU rank 1 (a head-sliced host pool), scattered blocks."""
    full = ModelShape.from_name("tiny-llama")
    shape = shard_shape(full, 2)
    gpu = PagedKVPool(shape, 8, BS, device=device, dtype=torch.float32)
    shared = PagedKVPool(full, 16, BS, device="cpu", dtype=torch.float32,
                         pin_memory=device != "cpu")
    host = shared.heads(shape, 1)
    m = Migrator(gpu, host)
    blocks = [9, 3, 4, 12]
    kp = torch.randn(4, shape.n_kv_heads, BS, shape.head_dim, device=device)
    vp = torch.randn(4, shape.n_kv_heads, BS, shape.head_dim, device=device)
    m.copy_layer_blocks_to_host(1, kp, vp, blocks).wait()
    assert torch.equal(host.data[1, 0, blocks], kp.cpu())
    assert torch.equal(host.data[1, 1, blocks], vp.cpu())
    assert shared.data[:, :, :, : shape.n_kv_heads].count_nonzero() == 0


def test_layer_copy_to_host_slots(device):
    shape = ModelShape.from_name("tiny-llama")
    gpu = PagedKVPool(shape, 8, BS, device=device, dtype=torch.float32)
    host = PagedKVPool(shape, 8, BS, device="cpu", dtype=torch.float32,
                       pin_memory=device != "cpu")
    m = Migrator(gpu, host)
    k = torch.randn(6, shape.n_kv_heads, shape.head_dim, device=device)
    v = torch.randn(6, shape.n_kv_heads, shape.head_dim, device=device)
    slots = [2, 3, 20, 21, 22, 5]
    m.copy_layer_to_host(1, k, v, slots).wait()
    ref = PagedKVPool(shape, 8, BS, device="cpu", dtype=torch.float32)
    ref.write(1, torch.tensor(slots), k.cpu(), v.cpu())
    assert torch.equal(host.data, ref.data)


def test_triton_paged_decode_equals_the_reference(device):
    if device == "cpu":
        pytest.skip("the Triton kernel runs on CUDA")
    from dualpace_hw.kernels import triton_decode

    g = torch.Generator(device="cpu").manual_seed(0)
    for h, kvh, hd, bs, dtype in [(32, 8, 128, 16, torch.bfloat16), (4, 2, 16, 4, torch.float32),
                                  (16, 2, 64, 16, torch.bfloat16)]:
        nb = 128
        kc = torch.randn(nb, kvh, bs, hd, generator=g).to(device, dtype)
        vc = torch.randn(nb, kvh, bs, hd, generator=g).to(device, dtype)
        lens = torch.tensor([1, 5, 3 * bs + 2, 37, 20 * bs], dtype=torch.int32)
        tables = torch.stack([torch.randperm(nb, generator=g)[:24] for _ in lens])
        q = torch.randn(len(lens), h, hd, generator=g).to(device, dtype)
        ref = paged_decode_attention(q.float(), kc.float(), vc.float(), tables.to(device),
                                     lens.to(device))
        for splits in (1, 3, None):
            out = triton_decode.paged_decode_attention(
                q, kc, vc, tables.to(device, torch.int32), lens.to(device), splits=splits)
            assert rel_err(out, ref) < (1e-2 if dtype == torch.bfloat16 else 1e-5), splits


def test_token_store():
    s = TokenStore()
    s.add(7, [1, 2, 3])
    s.append(7, 9)
    s.extend({7: 4})
    assert s.ids(7) == [1, 2, 3, 9, 4] and s.last(7) == 4 and s.generated(7) == [9, 4]
    with pytest.raises(KeyError):
        s.add(7, [1])
    s.remove(7)
    assert 7 not in s


def test_swapped_out_decoded_on_the_cpu_executor_and_back_gives_the_same_tokens(device):
    """A request swapped out to the host, decoded there by the CPU executor, and swapped back
    produces exactly the greedy tokens of the same request staying on the GPU."""
    from dualpace_hw.executors.cpu_executor import CpuExecutor
    from dualpace_sim.core.plans import CpuPlan
    from dualpace_sim.core.routing import Route

    dtype = torch.float32
    moved, stay = Box("tiny-llama", device, dtype), Box("tiny-llama", device, dtype)
    for box in (moved, stay):
        r = box.add(1, PROMPTS[1], max_tokens=12)
        box.run(box.plan([], [box.chunk(r, 11)]))
        box.run(box.plan([r]))
    r = moved.reqs[1]
    moved.swap_out(r)
    # three decode steps on the CPU executor, over the host pool, with a CPU copy of the model
    cpu_model = Model(moved.shape, moved.model.w.to("cpu"))  # seeded draws differ by device
    cpu = CpuExecutor(cpu_model, moved.host_pool, moved.tokens, threads=1)
    for _ in range(3):
        r.blocks.extend(moved.host.allocate(r.next_blocks(BS)))
        out = cpu.execute(CpuPlan(batch=[r], route=Route.FULL_CPU))
        moved.t += 1.0
        r.emit(moved.t, Owner.CPU, moved.rounds)
        moved.tokens.append(1, out[1])
    # and back: the swap-in lands in other HBM blocks, then the GPU decodes on
    in_plan = GpuPlan(swap_ins=[r], decodes=[r])
    r.source_blocks = r.blocks
    r.blocks = moved.hbm.allocate(len(r.source_blocks) + r.next_blocks(BS))
    moved.run(in_plan, moves=swap_in_moves(r))
    moved.ex.swap_handle.wait()
    for _ in range(2):
        moved.run(moved.plan([r]))
    for _ in range(6):
        stay.run(stay.plan([stay.reqs[1]]))
    assert moved.tokens.ids(1) == stay.tokens.ids(1)
    assert bytes(r.token_owners).count(Owner.CPU) == 3


def test_warm_graph_keys_cover_every_decode_round_a_run_can_reach():
    """Warm-up captures the graphs a run will use, so no decode round pays for a capture on the
    clock (on the H200 box each first use of a bucket took 45-160 ms)."""
    from dualpace_hw.executors.gpu.graphs import (
        BATCH_BUCKETS,
        TABLE_BUCKETS,
        bucket,
        decode_graph_keys,
    )

    keys = decode_graph_keys(150, 2048 + 128, 16)
    assert len(keys) == len(set(keys)) == 12 * 5  # batch buckets to 160, widths to 256 blocks
    for rows in range(1, 151):
        for blocks in range(1, 137):
            assert (bucket(rows, BATCH_BUCKETS), bucket(blocks, TABLE_BUCKETS)) in keys
    capped = decode_graph_keys(4096, 32768, 16, most=20)
    assert len(capped) == 20 and capped[0] == (1, 16)  # small batches first
    assert decode_graph_keys(1, 0, 16) == [(1, 16)]


def test_warm_graphs_stop_while_the_gpu_still_has_room(monkeypatch):
    """Each warmed graph keeps its activations: warm-up captures only while 4 GiB stay free
    and leaves the rest to first use (stand-ins for CUDA: the capture and the free memory)."""
    ex = Box("tiny-llama", "cpu", torch.float32).ex
    assert ex.warm_graphs(8, 64) == 0  # no CUDA graphs on the CPU
    ex.cuda = ex.cuda_graphs = True
    captured: list[tuple[int, int]] = []
    free = iter([9 << 30, 7 << 30, 5 << 30, 3 << 30, 1 << 30])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (next(free), 80 << 30))
    monkeypatch.setattr(ex, "capture_graph", captured.append)
    assert ex.warm_graphs(150, 2048) == 3
    assert captured == [(1, 16), (1, 32), (1, 64)]


def test_graph_captures_on_the_clock_are_counted_and_warmed_buckets_are_not(monkeypatch):
    """The run's summary says how many rounds paid for a capture (`graph_captures`): zero when
    the warm-up covered every bucket the run reached (stand-ins for the CUDA graphs)."""
    from types import SimpleNamespace

    from dualpace_hw.executors.gpu import executor

    made: list[tuple[int, int]] = []

    class Graph:
        def __init__(self, ex, rows: int, width: int) -> None:
            made.append((rows, width))

        def forward(self, flat):
            return flat

    monkeypatch.setattr(executor, "DecodeGraph", Graph)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 << 30, 80 << 30))
    ex = Box("tiny-llama", "cpu", torch.float32).ex
    ex.cuda = ex.cuda_graphs = True
    ex.max_graphs = 1
    assert ex.warm_graphs(2, 16) == 2 and made == [(1, 16), (2, 16)]
    assert ex.max_graphs == 2  # warmed graphs are kept: no rank evicts what another keeps
    ex._graph_forward(SimpleNamespace(n_dec=2, tables=[[0], [1]]))  # warmed: no capture
    assert ex.graph_captures == 0
    ex._graph_forward(SimpleNamespace(n_dec=3, tables=[[0], [1], [2]]))  # bucket (4, 16)
    assert ex.graph_captures == 1 and made[-1] == (4, 16)
