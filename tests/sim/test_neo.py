"""NEO's node decides with its predictor's tables and pays its iterations as they run: eagerly,
so no layer of an iteration is shorter than the host's floor for issuing its sub-batches."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.core import Request
from dualpace_sim.core.neo import NeoPlan, SubBatch, layer_time
from dualpace_sim.costs import CostModel, ModelShape, load_spec, synthesize
from dualpace_sim.costs.neo_tables import NeoTables
from dualpace_sim.sim import make_node
from dualpace_sim.sim.neo import executed_layer_s

MIXED, DECODE = 4e-3, 2e-3  # floors far above a tiny model's layer


@pytest.fixture(scope="module")
def costs() -> tuple[CostModel, CostModel]:
    """(no floors, NEO's floors): the same roofline profile of a tiny model."""
    profile = synthesize(load_spec("h200-spr16"), ModelShape.from_name("tiny-llama"))
    floored = profile.model_copy(deep=True)
    floored.gpu.eager_layer_s = MIXED
    floored.neo.eager_decode_layer_s = DECODE
    return CostModel(profile), CostModel(floored)


def decodes(n: int, first: int = 0) -> list[Request]:
    return [Request.create(first + i, 0.0, 100, 8, 16) for i in range(n)]


def test_each_sub_batch_holds_a_layer_to_its_eager_floor(costs):
    plain, floored = costs
    tables = NeoTables(floored)
    gpu_only = NeoPlan([SubBatch.with_gpu_decodes(decodes(4))])
    mixed = SubBatch.with_gpu_decodes(decodes(4))
    mixed.add_prefill(Request.create(9, 0.0, 64, 8, 16), False, tables)
    b1 = SubBatch()
    for r in decodes(2, first=10):
        b1.add_cpu_decode(r)
    pipelined = NeoPlan([mixed, b1])
    assert executed_layer_s(gpu_only, tables, floored) == DECODE
    assert executed_layer_s(NeoPlan([mixed]), tables, floored) == MIXED
    assert executed_layer_s(pipelined, tables, floored) == MIXED + DECODE  # both issued
    # what NEO decides with stays its tables' time, below the floors: the gap is kept
    assert max(layer_time(p, tables) for p in (gpu_only, pipelined)) < DECODE
    # a profile without the floors pays what the predictor says
    untouched = NeoTables(plain)
    for plan in (gpu_only, NeoPlan([mixed]), pipelined):
        assert executed_layer_s(plan, untouched, plain) == layer_time(plan, untouched)


def test_neo_sub_batches_with_prefills_pay_neos_own_eager_floor(costs):
    """Where the runtime's chunked rounds replay layer graphs, gpu.eager_layer_s is their
    floor; NEO, which runs eagerly, pays neo.eager_prefill_layer_s (and the runtime's floor
    where a profile has no NEO one)."""
    _, floored = costs
    profile = floored.profile.model_copy(deep=True)
    profile.neo.eager_prefill_layer_s = 3 * MIXED
    cost = CostModel(profile)
    tables = NeoTables(cost)
    mixed = SubBatch.with_gpu_decodes(decodes(4))
    mixed.add_prefill(Request.create(9, 0.0, 64, 8, 16), False, tables)
    assert executed_layer_s(NeoPlan([mixed]), tables, cost) == 3 * MIXED
    assert cost.gpu_eager_floor() == MIXED  # DualPace's and vLLM's chunked rounds
    assert floored.neo_eager_floor(prefills=True) == MIXED  # no NEO floor: the runtime's


def test_neo_pays_the_decode_floor_and_the_graph_replaying_policies_do_not(write_scenario,
                                                                          costs):
    """Every NEO iteration with a forward takes at least its layers' floors; vLLM's decode
    rounds replay CUDA graphs, so the NEO decode floor leaves them as they were."""
    loaded = load_scenario(write_scenario(
        policies=["vllm", "neo"], workload={"num_requests": 40}, neo={"max_tokens_in_batch": 8192},
        vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256}))
    profile = loaded.cost.profile.model_copy(deep=True)
    plain = CostModel(profile)
    profile.neo.eager_decode_layer_s = DECODE
    floored = CostModel(profile)

    def run(policy: str, cost: CostModel):
        return make_node(policy, loaded.requests, cost, loaded.policy_config(policy)).run().stats

    neo = run("neo", floored)
    assert neo.gpu_busy_s >= neo.gpu_rounds * floored.n_layers * DECODE
    assert neo.gpu_busy_s > 1.5 * run("neo", plain).gpu_busy_s
    assert asdict(run("vllm", floored)) == asdict(run("vllm", plain))


def test_neo_tables_answer_as_their_lookups_in_any_order_of_queries(costs):
    """NeoTables memoises its lookups (gdec_T its last pair): repeated, alternating and new
    arguments all get the table's own value. Its decode-attention tables keep the log-log
    reading NEO's runs decided with, where the cost model reads them linearly in the context
    (between grid points the two differ)."""
    from dualpace_sim.costs.model import Interp2D

    cost, _ = costs
    tables = NeoTables(cost)
    gdec = Interp2D("g", cost.profile.gpu.decode_attn)
    cdec = Interp2D("c", cost.profile.cpu.decode_attn)
    for n, context in ((4, 400), (4, 400), (5, 400), (4, 400), (4, 401), (0, 0), (4, 401)):
        assert tables.gdec_T(n, context) == (gdec(n, context) if n else 0.0)
        assert tables.cdec_T(n, context) == (cdec(n, context) if n else 0.0)
        assert tables.linr_T(n) == cost.gpu_linear(n)
    assert tables.gdec_T(4, 400) != cost.gpu_decode_attn(4, 400)
