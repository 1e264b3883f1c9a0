"""The staged model and the paged attention reference against a dense forward."""

from __future__ import annotations

import pytest
import torch

from dualpace_hw.executors.model import Model, ModelWeights, rope_inv_freq
from dualpace_hw.kernels.attention import paged_decode_attention, prefill_attention
from dualpace_hw.memory.kv import PagedKVPool, slot_mapping
from dualpace_sim.costs.shapes import ModelShape
from tests.hw.reference import dense_logits

TOKENS = [3, 17, 42, 5, 99, 7, 1, 250, 13, 64, 8]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_chunked_prefill_then_paged_decode_equals_the_dense_forward(name, device):
    shape = ModelShape.from_name(name)
    model = Model(shape, ModelWeights.random(shape, seed=1, device=device, dtype=torch.float32))
    pool = PagedKVPool(shape, 16, 4, device=device, dtype=torch.float32)
    table = [5, 2, 9]  # scattered block ids, as a block pool hands them out

    def step(tokens: list[int], start: int) -> torch.Tensor:
        n = len(tokens)
        h = model.pre_layer(torch.tensor(tokens, device=device))
        positions = torch.arange(start, start + n, device=device)
        slots = torch.tensor(slot_mapping(table, start, n, 4), device=device)
        bt = torch.tensor(table, device=device)
        for layer in range(model.n_layers):
            q, k, v = model.pre_attn(layer, h, positions)
            pool.write(layer, slots, k, v)
            kc, vc = pool.layer(layer)
            if n > 1:
                o = prefill_attention(q, kc, vc, bt, start)
            else:
                o = paged_decode_attention(q, kc, vc, bt[None], torch.tensor([start + 1]))
            h = model.post_attn(layer, o.reshape(n, -1), h)
        return model.post_layer(h)

    got = [step(TOKENS[:4], 0), step(TOKENS[4:7], 4)]  # a prompt in two chunks
    got += [step(TOKENS[i:i + 1], i) for i in range(7, len(TOKENS))]  # then decodes
    ref = dense_logits(model, TOKENS)
    torch.testing.assert_close(torch.cat(got), ref, atol=1e-4, rtol=1e-4)


def test_llama31_rope_scaling_keeps_high_and_divides_low_frequencies():
    shape = ModelShape.from_name("llama-3.1-8b")
    plain = 1.0 / (shape.rope_theta ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    scaled = rope_inv_freq(shape).double()
    wavelen = 2 * torch.pi / plain
    high = wavelen < shape.rope_original_max_position / shape.rope_high_freq_factor
    low = wavelen > shape.rope_original_max_position / shape.rope_low_freq_factor
    torch.testing.assert_close(scaled[high], plain[high], rtol=1e-6, atol=0)
    torch.testing.assert_close(scaled[low], plain[low] / 8, rtol=1e-6, atol=0)
    assert ((scaled <= plain * (1 + 1e-6)) & (scaled >= plain / 8 * (1 - 1e-6))).all()


def test_random_weights_are_seeded_and_can_build_fewer_layers():
    shape = ModelShape.from_name("tiny-llama")
    a = ModelWeights.random(shape, seed=7)
    b = ModelWeights.random(shape, seed=7)
    assert torch.equal(a.layers[1].qkv.weight, b.layers[1].qkv.weight)
    assert len(ModelWeights.random(shape, n_layers=1).layers) == 1
    assert a.embed.dtype == torch.bfloat16


def test_kv_pool_sized_from_a_budget():
    shape = ModelShape.from_name("tiny-llama")
    pool = PagedKVPool.from_budget(shape, 10 * 2 * 2 * 2 * 16 * 16 * 2, block_size=16)
    assert pool.n_blocks == 10 and pool.block_bytes == 2 * 2 * 2 * 16 * 16 * 2
    with pytest.raises(ValueError, match="holds no"):
        PagedKVPool.from_budget(shape, 100)
