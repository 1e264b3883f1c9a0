"""What every simulated node shares: recording a trace only observes the run."""

from __future__ import annotations

from dataclasses import asdict

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results.trace_events import TraceRecorder
from dualpace_sim.sim import make_node


def test_a_trace_recorder_changes_nothing_in_the_simulation(write_scenario):
    loaded = load_scenario(write_scenario(
        policies=["dualpace", "vllm", "neo"],
        vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256},
        neo={"max_tokens_in_batch": 8192},
        workload={"num_requests": 200},
    ))
    for policy in loaded.spec.policies:
        runs = []
        for trace in (None, TraceRecorder(policy)):
            node = make_node(policy, loaded.requests, loaded.cost, loaded.policy_config(policy),
                             trace=trace)
            runs.append(node.run())
        plain, traced = runs
        assert asdict(traced.stats) == asdict(plain.stats), policy
        assert [r.token_times for r in traced.requests] == [r.token_times for r in
                                                             plain.requests], policy
        assert trace.events(1), policy  # it did record


def test_only_dualpace_takes_the_eager_floor_measured_beside_a_cpu_engine(write_scenario):
    """A profile whose floor beside the CPU engine is far above its plain floor slows DualPace's
    prefill rounds (its GPU engine shares the box with the CPU engine) and no one else's."""
    from dualpace_sim.costs import CostModel

    loaded = load_scenario(write_scenario(
        policies=["dualpace", "vllm"], workload={"num_requests": 60},
        vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256}))
    profile = loaded.cost.profile.model_copy(deep=True)
    profile.gpu.eager_layer_s = 1e-4
    plain = CostModel(profile)
    profile.gpu.eager_layer_beside_cpu_s = 5e-3
    beside = CostModel(profile)

    def run(policy: str, cost: CostModel):
        node = make_node(policy, loaded.requests, cost, loaded.policy_config(policy))
        return node.run()

    assert run("dualpace", beside).stats.gpu_busy_s > 1.1 * run("dualpace", plain).stats.gpu_busy_s
    vllm = run("vllm", beside), run("vllm", plain)
    assert asdict(vllm[0].stats) == asdict(vllm[1].stats)


def test_every_policys_rounds_pay_the_rank_groups_work(write_scenario):
    """A profile with `gpu.rank_round` (GPU tensor parallelism) makes every policy's GPU rounds
    dearer by it, round by round."""
    from dualpace_sim.costs import CostModel
    from dualpace_sim.costs.profile import Table1D

    loaded = load_scenario(write_scenario(
        policies=["dualpace", "vllm", "neo"],
        workload={"num_requests": 40, "max_prompt_tokens": 2048},
        vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256}))
    profile = loaded.cost.profile.model_copy(deep=True)
    one = CostModel(profile)
    profile.gpu.rank_round = Table1D(x=[1, 256], y=[2e-3, 2e-3])
    tp = CostModel(profile)

    def run(policy: str, cost: CostModel):
        node = make_node(policy, loaded.requests, cost, loaded.policy_config(policy))
        return node.run().stats

    for policy in ("dualpace", "vllm", "neo"):
        plain, dearer = run(policy, one), run(policy, tp)
        forward = plain.gpu_rounds - plain.migration_only_rounds
        assert dearer.gpu_busy_s > plain.gpu_busy_s + 1e-3 * forward, policy
