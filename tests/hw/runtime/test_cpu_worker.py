"""The CPU engine's process: what it shares with the parent, and what it gives back."""

from __future__ import annotations

import torch

from dualpace_hw.executors.cpu_executor import CpuStep
from dualpace_hw.executors.model import ModelWeights
from dualpace_hw.executors.packed import dense_isas
from dualpace_hw.runtime.cpu_worker import CpuEngineProcess
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape

SHAPE = ModelShape(name="small-llama", n_layers=2, hidden_size=256, n_heads=4, n_kv_heads=2,
                   head_dim=64, intermediate_size=1024, vocab_size=512)


def test_the_cpu_engine_keeps_one_copy_of_the_weights_in_host_memory():
    """Once the CPU engine has repacked the projections, their shared plain copy is given back
    to the OS (a 32B model would not fit twice); where the dense kernel cannot run (a CPU with
    neither AMX nor AVX512-BF16) the engine decodes from the shared copy itself, which it
    keeps whole. Either way the engine still decodes."""
    weights = ModelWeights.random(SHAPE, seed=4, dtype=torch.bfloat16)
    total = sum(t.numel() * t.element_size() for t in weights.tensors())
    projections = sum(d.weight.numel() * d.weight.element_size()
                      for lw in weights.layers for d in (lw.qkv, lw.o, lw.gate_up, lw.down))
    engine = CpuEngineProcess(weights, SHAPE, host_blocks=8, block_size=16, max_rows=2, threads=1)
    try:
        kept = engine._warena.allocated_bytes()
        if any(i != "portable" for i in dense_isas()):  # repacked in the engine's process
            assert kept <= total - projections + 64 * 4096, (kept, total, projections)
        else:
            assert total <= kept <= total + 64 * 4096, (kept, total)
        done = engine.step(CpuStep(Route.FULL_CPU, [0], [3], [0], [[1]]), lambda: False)
        assert set(done.tokens) == {0} and done.busy_s > 0
        # and where the step went, from the engine's process (a Full-CPU step: no assists)
        ph = done.phases
        assert ph.attention_s > 0 and ph.post_s > 0 and ph.assists_s == 0
        assert ph.setup_s + ph.pre_layer_s + ph.pre_attn_s + ph.kv_write_s + ph.attention_s \
            + ph.post_s <= done.busy_s
    finally:
        engine.close()
