"""SimPy backend: executes the core's plans against the cost model's times."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.trace_events import TraceRecorder

from ..core.policies import PolicyConfig, policy_named, resolve
from ..costs import CostModel
from .dualpace import DualPaceNode
from .neo import NeoNode
from .node import Node, SimOutput, SimStats, SimulationStalled
from .vllm import VllmNode


def make_node(
    policy: str,
    specs: Sequence,
    cost: CostModel,
    config: PolicyConfig,
    on_finish: Callable[[int], None] | None = None,
    trace: TraceRecorder | None = None,
) -> Node:
    """The simulated node of the registered `policy`, over its `config`; `trace` records its
    timeline."""
    node = resolve(policy_named(policy).simulator)
    return node(specs, cost, config, on_finish, trace)


__all__ = ["DualPaceNode", "NeoNode", "Node", "SimOutput", "SimStats", "SimulationStalled",
           "VllmNode", "make_node"]
