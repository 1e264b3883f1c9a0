"""NEO's executor over hand-built NeoPlans: pipelined and GPU-only iterations, CPU prefills and
a swap-out decoded on the CPU in the same iteration, every sampled token the dense forward's;
and the pipeline's overlap order."""

from __future__ import annotations

import threading

import torch

from dualpace_hw.executors.model import greedy
from dualpace_hw.executors.neo_executor import CpuAttention, NeoExecutor
from dualpace_hw.serving.serve import build_runtime
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core.neo import NeoPlan, SubBatch
from dualpace_sim.core.plans import BlockMoves
from dualpace_sim.core.request import Owner, blocks_for
from tests.hw.reference import dense_logits
from tests.hw.runtime.test_neo import neo_scenario

from .test_gpu_executor import BS, PROMPTS, Box


def grow(box: Box, reqs, host: bool) -> None:
    """The core's commit: each decode's next-token block in its tier."""
    pool = box.host if host else box.hbm
    for r in reqs:
        r.blocks.extend(pool.allocate(r.next_blocks(BS)))


def check_and_apply(box: Box, tokens: dict[int, int], t: float) -> None:
    """Each token is the dense forward's greedy next token; then it is the request's."""
    for req_id, tok in tokens.items():
        ids = box.tokens.ids(req_id)
        assert tok == int(greedy(dense_logits(box.model, ids)[-1:])[0]), req_id
        box.reqs[req_id].emit(t, Owner.GPU, box.rounds)
        box.tokens.append(req_id, tok)


def test_neo_iterations_sample_the_dense_forwards_tokens(device):
    box = Box("tiny-llama", device, torch.float32)
    ex = NeoExecutor(box.ex)
    r1, r2, r3, r4 = (box.add(i, p) for i, p in PROMPTS.items())
    r5 = box.add(5, [7, 6, 5, 4, 3, 2])
    # GPU-only: r1 to the GPU, r2 and r3 prefilled to the host (their pages land there)
    r1.blocks = box.hbm.allocate(blocks_for(r1.prompt_tokens, BS))
    for r in (r2, r3):
        r.blocks = box.host.allocate(blocks_for(r.prompt_tokens, BS))
    tokens, times = ex.iterate(NeoPlan([SubBatch(gpu_prefills=[r1], cpu_prefills=[r2, r3])]))
    assert times.sub_batches == [len(PROMPTS[1]) + len(PROMPTS[2]) + len(PROMPTS[3])]
    check_and_apply(box, tokens, 1.0)
    # pipelined: sub-batch 0 a GPU decode, a CPU decode, a GPU and a CPU prefill; 1 a CPU decode
    grow(box, [r1], host=False)
    grow(box, [r2, r3], host=True)
    r4.blocks = box.hbm.allocate(blocks_for(r4.prompt_tokens, BS))
    r5.blocks = box.host.allocate(blocks_for(r5.prompt_tokens, BS))
    b0 = SubBatch(gpu_prefills=[r4], cpu_prefills=[r5], gpu_decodes=[r1], cpu_decodes=[r2])
    tokens, times = ex.iterate(NeoPlan([b0, SubBatch(cpu_decodes=[r3])]))
    assert times.sub_batches == [1 + 1 + len(PROMPTS[4]) + 6, 1]
    assert sorted(tokens) == [1, 2, 3, 4, 5]
    check_and_apply(box, tokens, 2.0)
    # r1 swapped out and decoded with CPU attention in the same iteration
    old = r1.blocks
    r1.blocks = box.host.allocate(len(old))
    box.hbm.release(old)
    grow(box, [r4], host=False)
    grow(box, [r1, r2, r3, r5], host=True)
    plan = NeoPlan([SubBatch(gpu_decodes=[r4], cpu_decodes=[r2, r5]),
                    SubBatch(cpu_decodes=[r1, r3])], swap_outs=[r1],
                   moves=BlockMoves((old, r1.blocks[: len(old)])))
    tokens, _ = ex.iterate(plan)
    check_and_apply(box, tokens, 3.0)
    ex.close()
    assert not box.pool.data[:, :, -1].any(), "a CPU decode's K/V went into HBM (slot -1)"
    shape = box.shape
    rows = 2 + 4  # CPU decodes over the two pipelined iterations
    assert ex.link.to_host_bytes == rows * shape.n_layers * 4 * (shape.q_dim + 2 * shape.kv_dim)
    assert ex.link.to_gpu_bytes == rows * shape.n_layers * 4 * shape.q_dim  # float32


def test_one_sub_batchs_cpu_attention_runs_under_the_others_gpu_work(tmp_path, monkeypatch):
    """NEO's overlap, in order rather than timing: the CPU attention of sub-batch 1 at layer
    i waits until sub-batch 0's post-attention of layer i has been issued, and sub-batch 0's
    at layer i + 1 until sub-batch 1's of layer i has; an executor that waited for a CPU job
    before issuing the other sub-batch's GPU work would time out here."""
    lock = threading.Lock()
    issued: dict[tuple[int, int], threading.Event] = {}
    part_of: dict[int, int] = {}
    overlapped: list[bool] = []

    def event(key):
        with lock:
            return issued.setdefault(key, threading.Event())

    real_qkv, real_post, real_run = NeoExecutor._qkv, NeoExecutor._post, CpuAttention._run

    def qkv(self, layer, p, index, waits):
        if p.cpu is not None:
            part_of[id(p.cpu)] = index
        real_qkv(self, layer, p, index, waits)

    def post(self, layer, p, index):
        real_post(self, layer, p, index)
        event((layer, index)).set()

    def run(self, layer, rows, q, k, v, ready):
        other = (layer, 0) if part_of[id(rows)] == 1 else (layer - 1, 1)
        if other[0] >= 0:
            overlapped.append(event(other).wait(10.0))
        return real_run(self, layer, rows, q, k, v, ready)

    monkeypatch.setattr(NeoExecutor, "_qkv", qkv)
    monkeypatch.setattr(NeoExecutor, "_post", post)
    monkeypatch.setattr(CpuAttention, "_run", run)
    loaded = load_scenario(neo_scenario(tmp_path))
    runtime = build_runtime(loaded, "neo", "cpu", None)
    runtime.serve()
    assert runtime.stats.pipelined_iterations > 0
    assert overlapped and all(overlapped), f"{overlapped.count(False)} CPU jobs ran alone"
