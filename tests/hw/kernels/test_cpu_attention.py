"""The CPU paged decode attention (C++/OpenMP extension and its PyTorch fallback) against the
paged reference and a dense attention written here."""

from __future__ import annotations

import math

import pytest
import torch

from dualpace_hw.kernels import cpu_attention as ca
from dualpace_hw.kernels.attention import paged_decode_attention


def dense_attention(q, k_cache, v_cache, tables, lens):
    """Token by token: gather each request's K/V through its block table, softmax(qK^T/sqrt d)V
    with every query head reading its GQA kv head; all in float64."""
    b_, n_heads, hd = q.shape
    kv_heads, bs = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // kv_heads
    out = torch.zeros(b_, n_heads, hd, dtype=torch.float64)
    for b in range(b_):
        n = int(lens[b])
        pos = torch.arange(n)
        blocks = tables[b].long()[pos // bs]
        k = k_cache.double()[blocks, :, pos % bs]  # [n, kv_heads, hd]
        v = v_cache.double()[blocks, :, pos % bs]
        for h in range(n_heads):
            s = k[:, h // group] @ q[b, h].double() / math.sqrt(hd)
            out[b, h] = torch.softmax(s, 0) @ v[:, h // group]
    return out


def make_case(seed, n_heads, kv_heads, hd, bs, lens, dtype, n_blocks=None):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    n_blocks = n_blocks or sum(need) + 5
    k = torch.randn(n_blocks, kv_heads, bs, hd, generator=g).to(dtype)
    v = torch.randn(n_blocks, kv_heads, bs, hd, generator=g).to(dtype)
    q = torch.randn(len(lens), n_heads, hd, generator=g).to(dtype)
    perm = torch.randperm(n_blocks, generator=g).tolist()  # scattered, disjoint tables
    width = max(need) + 2
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)  # padding: never read
    at = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
        at += n
    return q, k, v, tables, torch.tensor(lens, dtype=torch.int32)


needs_ext = pytest.mark.skipif(not ca.extension_available(),
                               reason="the C++ extension did not build here")

# (n_heads, kv_heads, head_dim, block_size, context lengths)
CASES = [
    (4, 2, 16, 4, [1, 4, 5, 37]),  # tiny-llama heads, partial last blocks
    (4, 2, 32, 16, [3, 16, 17, 100]),  # tiny-qwen3 heads
    (8, 1, 64, 16, [50, 7]),  # MQA, group 8
    (12, 4, 128, 16, [129, 1, 64]),  # group 3 (the 2+1 head-group paths)
    (5, 5, 80, 8, [30, 9]),  # head_dim without a vector kernel: the scalar path
]


@pytest.mark.parametrize("case", CASES)
def test_fallbacks_equal_the_reference_and_dense_attention(case):
    n_heads, kv_heads, hd, bs, lens = case
    q, k, v, tables, ctx = make_case(0, n_heads, kv_heads, hd, bs, lens, torch.float32)
    dense = dense_attention(q, k, v, tables, ctx).float()
    ref = paged_decode_attention(q, k, v, tables.clamp(min=0).long(), ctx)
    torch.testing.assert_close(ref, dense, atol=2e-5, rtol=1e-5)
    got = ca.cpu_paged_decode_attention(q, k, v, tables, ctx, impl="torch")
    torch.testing.assert_close(got, dense, atol=2e-5, rtol=1e-5)


@needs_ext
@pytest.mark.parametrize("impl", ["ext", "scalar"])
@pytest.mark.parametrize("case", CASES)
def test_extension_equals_dense_attention_fp32(case, impl):
    n_heads, kv_heads, hd, bs, lens = case
    q, k, v, tables, ctx = make_case(1, n_heads, kv_heads, hd, bs, lens, torch.float32)
    dense = dense_attention(q, k, v, tables, ctx).float()
    for hpu in (0, 1):
        got = ca.cpu_paged_decode_attention(q, k, v, tables, ctx, impl=impl, heads_per_unit=hpu)
        torch.testing.assert_close(got, dense, atol=2e-5, rtol=1e-5)


@needs_ext
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_extension_bf16_and_fp16_within_output_rounding(case, dtype):
    n_heads, kv_heads, hd, bs, lens = case
    q, k, v, tables, ctx = make_case(2, n_heads, kv_heads, hd, bs, lens, dtype)
    dense = dense_attention(q, k, v, tables, ctx).float()  # from the same rounded inputs
    for impl, pv_bf16 in (("ext", True), ("ext", False), ("scalar", False)):
        got = ca.cpu_paged_decode_attention(q, k, v, tables, ctx, impl=impl, pv_bf16=pv_bf16)
        assert got.dtype == dtype and got.shape == q.shape
        # fp32 sums; the output is rounded to the 16-bit type (and, with pv_bf16, the
        # probabilities to bf16 before P.V)
        torch.testing.assert_close(got.float(), dense, atol=1e-2, rtol=1e-2)


@needs_ext
def test_split_k_for_few_long_requests_and_threads():
    # One request and two kv heads over 90 blocks: the kernel splits the blocks into
    # partitions and merges them; the result must not depend on the thread count.
    q, k, v, tables, ctx = make_case(3, 4, 2, 32, 4, [357], torch.float32)
    dense = dense_attention(q, k, v, tables, ctx).float()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            for pf in (0, 1, 3):
                for hpu in (0, 1):
                    got = ca.cpu_paged_decode_attention(q, k, v, tables, ctx, prefetch_blocks=pf,
                                                        heads_per_unit=hpu)
                    torch.testing.assert_close(got, dense, atol=2e-5, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


@needs_ext
def test_pool_layer_views_and_int64_tables_are_accepted():
    # The executor passes pool.layer(i) views (block stride != page size) and may pass int64.
    from dualpace_hw.memory.kv import PagedKVPool
    from dualpace_sim.costs.shapes import ModelShape

    shape = ModelShape.from_name("tiny-llama")
    pool = PagedKVPool(shape, 12, 4, dtype=torch.float32)
    pool.data.normal_(generator=torch.Generator().manual_seed(4))
    kc, vc = pool.layer(1)
    q = torch.randn(2, shape.n_heads, shape.head_dim)
    tables = torch.tensor([[7, 2, 9], [0, 11, 0]])
    ctx = torch.tensor([10, 6])
    dense = dense_attention(q, kc, vc, tables, ctx).float()
    got = ca.cpu_paged_decode_attention(q, kc, vc, tables, ctx)
    torch.testing.assert_close(got, dense, atol=2e-5, rtol=1e-5)


@needs_ext
def test_bad_block_ids_and_short_tables_are_refused():
    q, k, v, tables, ctx = make_case(5, 4, 2, 16, 4, [9], torch.float32)
    bad = tables.clone()
    bad[0, 1] = k.shape[0]
    # Checked in Python (ValueError): exceptions thrown by the C++ op crashed torch 2.11.
    n = k.shape[0]
    with pytest.raises(ValueError, match=f"block id {n} outside the pool's {n} blocks"):
        ca.cpu_paged_decode_attention(q, k, v, bad, ctx, impl="ext")
    with pytest.raises(ValueError, match="needs 3 blocks, its table has 2"):
        ca.cpu_paged_decode_attention(q, k, v, tables[:, :2], ctx, impl="ext")
    with pytest.raises(ValueError, match="differ in dtype"):
        ca.cpu_paged_decode_attention(q, k.double(), v, tables, ctx, impl="ext")


@needs_ext
def test_helpers():
    t = torch.arange(1000, dtype=torch.int64)
    assert ca.stream_read(t) == float(sum(range(1000)))
    assert ca.omp_threads() == torch.get_num_threads()
    h = ca.hugepage_empty((3, 5), torch.bfloat16)
    assert h.shape == (3, 5) and h.dtype == torch.bfloat16 and not h.float().any()
    assert ca.extension_info()["isa"] in ("avx512bf16", "avx512", "scalar")
