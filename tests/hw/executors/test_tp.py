"""Tensor parallelism over Gloo: two processes, each with its shard of the weights and of the KV
pool (heads split), decode exactly the tokens of one process with the whole model, through the
CPU executor's path and through the GPU executor's (run on the CPU device here; on GPUs the same
code runs over NCCL)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

from dualpace_hw.executors.cpu_executor import CpuExecutor, CpuStep
from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.executors.tp import all_reduce, shard_shape, shard_weights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core import GpuPlan, PrefillChunk, Request
from dualpace_sim.core.routing import Route
from dualpace_sim.costs.shapes import ModelShape

BS = 4
PROMPTS = ([5, 17, 3, 99, 42, 7], [250, 1, 64, 8, 8, 31])
NEW_TOKENS = 8


def shard_model(name: str, rank: int, world: int) -> Model:
    """This rank's shard of the test model (float32: split sums round alike)."""
    shape = ModelShape.from_name(name)
    full = ModelWeights.random(shape, seed=11, dtype=torch.float32)
    return Model(shard_shape(shape, world), shard_weights(full, shape, rank, world),
                 all_reduce() if world > 1 else None)


def decode(name: str, rank: int, world: int) -> list[list[int]]:
    """Greedy decoding of PROMPTS on this rank's shard: the prompt goes through the CPU
    executor one position per step (writing its KV), then NEW_TOKENS are sampled."""
    model = shard_model(name, rank, world)
    local = model.shape
    per = -(-(len(PROMPTS[0]) + NEW_TOKENS) // BS)
    pool = PagedKVPool(local, per * len(PROMPTS), BS, dtype=torch.float32)
    ex = CpuExecutor(model, pool, tokens=None, threads=1)
    ids = [list(p) for p in PROMPTS]
    for pos in range(len(PROMPTS[0]) + NEW_TOKENS - 1):
        tables = [list(range(i * per, i * per + pos // BS + 1)) for i in range(len(ids))]
        step = CpuStep(Route.FULL_CPU, list(range(len(ids))), [row[pos] for row in ids],
                       [pos] * len(ids), tables)
        out = ex.run(step)
        for i, row in enumerate(ids):
            if pos + 1 >= len(row):
                row.append(out[i])
    return [row[len(p):] for row, p in zip(ids, PROMPTS, strict=True)]


def decode_on_the_gpu_executor(name: str, rank: int, world: int) -> list[list[int]]:
    """The same greedy decoding through the GPU executor's path (on the CPU device here): one
    batched prefill of both prompts, then decode rounds."""
    model = shard_model(name, rank, world)
    local = model.shape
    per = -(-(len(PROMPTS[0]) + NEW_TOKENS) // BS)
    tokens = TokenStore()
    ex = GpuExecutor(model, PagedKVPool(local, per * len(PROMPTS), BS, dtype=torch.float32),
                     tokens)
    reqs = []
    for i, prompt in enumerate(PROMPTS):
        r = Request.create(i, 0.0, len(prompt), NEW_TOKENS, BS)
        r.blocks = list(range(i * per, (i + 1) * per))
        tokens.add(i, list(prompt))
        reqs.append(r)
    plan = GpuPlan(prefills=[PrefillChunk(r, 0, r.prompt_tokens, False, True) for r in reqs])
    for _ in range(NEW_TOKENS):
        for req_id, tok in ex.execute(plan).items():
            tokens.append(req_id, tok)
            reqs[req_id].generated += 1
        plan = GpuPlan(decodes=reqs)
    return [tokens.generated(r.req_id) for r in reqs]


def _rank_main(name: str, rank: int, world: int, init: str, results) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        results.put((rank, decode(name, rank, world),
                     decode_on_the_gpu_executor(name, rank, world)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_two_cpu_ranks_over_gloo_decode_the_tokens_of_one(tmp_path, name):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank_main, args=(name, r, 2, init, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = {rank: (cpu, gpu) for rank, cpu, gpu in (results.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    whole = decode(name, 0, 1)
    assert len(whole[0]) == NEW_TOKENS
    assert got[0][0] == got[1][0] == whole  # the CPU executor's path
    assert got[0][1] == got[1][1] == decode_on_the_gpu_executor(name, 0, 1) == whole


def test_shards_must_divide_the_heads():
    shape = ModelShape.from_name("tiny-llama")
    assert shard_shape(shape, 2).n_kv_heads == 1
    with pytest.raises(ValueError, match="n_kv_heads=2 does not split over 4 ranks"):
        shard_shape(shape, 4)


def test_shards_hold_the_ranks_own_rows_and_columns():
    shape = ModelShape.from_name("tiny-llama")
    full = ModelWeights.random(shape, seed=2, dtype=torch.float32)
    parts = [shard_weights(full, shape, r, 2) for r in range(2)]
    lw = full.layers[0]
    # The output projection's column blocks and the down projection's, side by side, are the
    # whole matrices; the QKV rows of both ranks are the whole QKV, regrouped per rank.
    assert torch.equal(torch.cat([p.layers[0].o.weight for p in parts], 1), lw.o.weight)
    assert torch.equal(torch.cat([p.layers[0].down.weight for p in parts], 1), lw.down.weight)
    assert sum(p.layers[0].qkv.weight.shape[0] for p in parts) == lw.qkv.weight.shape[0]
    assert parts[0].layers[0].qkv.weight.shape[0] == shard_shape(shape, 2).q_dim + \
        2 * shard_shape(shape, 2).kv_dim
