"""A plain dense reference forward, independent of paging, for the hw tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dualpace_hw.executors.model import Model


def dense_logits(model: Model, tokens: list[int]) -> torch.Tensor:
    """Logits [T, V] of a full causal forward over the whole sequence."""
    s = model.shape
    n = len(tokens)
    h = model.pre_layer(torch.tensor(tokens, device=model.device))
    positions = torch.arange(n, device=model.device)
    group = s.n_heads // s.n_kv_heads
    for layer in range(model.n_layers):
        q, k, v = model.pre_attn(layer, h, positions)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                           v.transpose(0, 1), is_causal=True)
        h = model.post_attn(layer, o.transpose(0, 1).reshape(n, -1), h)
    return model.post_layer(h)
