"""The phenomenon the paper is about (its Figure 1): under a decode-heavy load, NEO's
CPU-resident requests advance in bursts separated by stalls, because CPU attention runs only
inside GPU iterations that offer a long enough overlap window, while DualPace's independently
scheduled CPU engine keeps them advancing."""

from __future__ import annotations

from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results.metrics import longest_cpu_stall
from dualpace_sim.results.records import records_frame
from dualpace_sim.sim import make_node


def test_neo_stalls_cpu_resident_progress_while_dualpace_keeps_it_going(write_scenario, capsys):
    path = write_scenario(
        policies=["dualpace", "neo"],
        neo={"max_tokens_in_batch": 8192},
        workload={"num_requests": 800, "rate": 4.0, "seed": 3},
    )
    loaded = load_scenario(path)
    stalls, cpu_tokens = {}, {}
    for policy in loaded.spec.policies:
        node = make_node(policy, loaded.requests, loaded.cost, loaded.policy_config(policy))
        frame = records_frame(node.run().requests, policy)
        stalls[policy] = longest_cpu_stall(frame)
        cpu_tokens[policy] = frame["token_owners"].str.count("C").sum()
    with capsys.disabled():
        print(f"\nlongest CPU-resident stall: DualPace {stalls['dualpace']:.2f} s, "
              f"NEO {stalls['neo']:.2f} s; CPU-decoded tokens {cpu_tokens}")
    assert min(cpu_tokens.values()) > 5000, "both must actually use the CPU tier"
    assert stalls["dualpace"] < 1.0
    assert stalls["neo"] > 5.0
    assert stalls["neo"] > 10 * stalls["dualpace"]
