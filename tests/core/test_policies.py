"""The policy registry: every entry builds its engines' drivers, names a scenario section that
holds its budget, and names backends that exist (the simulator's here; the runtime's, which
need torch, in tests/hw)."""

from __future__ import annotations

import pytest

from dualpace_sim.config.scenario import Scenario
from dualpace_sim.core.policies import POLICIES, POLICY_NAMES, policy_named, resolve
from dualpace_sim.core.rounds import Driver
from dualpace_sim.sim.node import Node


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_an_entry_names_a_section_with_its_budget_and_a_simulated_node(name):
    entry = POLICIES[name]
    section = Scenario.model_fields[entry.section].annotation
    fields = {f for model in (section, *getattr(section, "__args__", ()))
              for f in getattr(model, "model_fields", {})}
    assert set(entry.budget) <= fields, (entry.section, entry.budget)
    assert issubclass(resolve(entry.simulator), Node)
    module, _, cls = entry.runtime.partition(":")
    assert module.startswith("dualpace_hw.runtime.") and cls.endswith("Runtime")


def test_the_scenario_accepts_exactly_the_registered_policies():
    annotation = Scenario.model_fields["policies"].annotation
    assert annotation.__args__[0].__args__ == POLICY_NAMES


def test_schedulers_drive_every_engine_through_a_driver():
    from dualpace_sim.core import SchedulerConfig

    core = POLICIES["dualpace"].schedulers(SchedulerConfig(gpu_kv_blocks=8, host_kv_blocks=16,
                                                           route_p=0, route_f=0))
    assert set(core.drivers) == {"gpu", "cpu"}
    assert all(isinstance(d, Driver) for d in core.drivers.values())
    assert core.drivers["cpu"].engine == "cpu" and core.drivers["gpu"].engine == "gpu"


def test_neo_refuses_to_decide_without_its_predictor():
    from dualpace_sim.core.neo import NeoConfig

    with pytest.raises(ValueError, match="predictor"):
        POLICIES["neo"].schedulers(NeoConfig(gpu_kv_blocks=4, host_kv_blocks=8))


def test_an_unknown_policy_is_named_with_the_registered_ones():
    with pytest.raises(ValueError, match="no policy 'sglang'; the policies are dualpace, vllm"):
        policy_named("sglang")
