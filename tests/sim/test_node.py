"""What every simulated node shares: recording a trace only observes the run."""

from __future__ import annotations

from dataclasses import asdict

from dualpace_sim.scenario import load_scenario
from dualpace_sim.sim import make_node
from dualpace_sim.trace_events import TraceRecorder


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
            node = make_node(loaded.requests, loaded.cost, loaded.policy_config(policy),
                             loaded.neo_launch_s, trace=trace)
            runs.append(node.run())
        plain, traced = runs
        assert asdict(traced.stats) == asdict(plain.stats), policy
        assert [r.token_times for r in traced.requests] == [r.token_times for r in
                                                             plain.requests], policy
        assert trace.events(1), policy  # it did record
