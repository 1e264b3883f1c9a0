"""SimPy backend: executes the core's plans against the cost model's times."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dualpace_sim.results.trace_events import TraceRecorder

from ..core import SchedulerConfig
from ..core.neo import NeoConfig
from ..core.vllm import VllmConfig
from ..costs import CostModel
from .dualpace import DualPaceNode
from .neo import NeoNode
from .node import Node, SimOutput, SimStats, SimulationStalled
from .vllm import VllmNode


def make_node(
    specs: Sequence,
    cost: CostModel,
    config: SchedulerConfig | VllmConfig | NeoConfig,
    neo_launch_s: float | None = None,
    on_finish: Callable[[int], None] | None = None,
    trace: TraceRecorder | None = None,
) -> Node:
    """The node that runs the policy the config belongs to; `trace` records its timeline."""
    if isinstance(config, SchedulerConfig):
        return DualPaceNode(specs, cost, config, on_finish, trace)
    if isinstance(config, VllmConfig):
        return VllmNode(specs, cost, config, on_finish, trace)
    if isinstance(config, NeoConfig):
        return NeoNode(specs, cost, config, neo_launch_s, on_finish, trace)
    raise TypeError(f"no simulated node for {type(config).__name__}")


__all__ = ["DualPaceNode", "NeoNode", "Node", "SimOutput", "SimStats", "SimulationStalled",
           "VllmNode", "make_node"]
