"""The shared scheduling core: every decision, no backend. Imports neither simpy nor torch."""

from .blocks import BlockPool
from .config import SchedulerConfig
from .cpu_round import CpuScheduler
from .envelope import envelope_fits, extend_reserve, migration_reserve
from .gpu_round import GpuScheduler
from .plans import BlockMoves, CpuPlan, CpuResult, GpuPlan, GpuResult, PrefillChunk
from .request import Owner, Request, RoundLog, blocks_for
from .routing import Route, assist_reachable, check_thresholds, route_for
from .state import EngineState

__all__ = [
    "BlockMoves", "BlockPool", "CpuPlan", "CpuResult", "CpuScheduler", "EngineState", "GpuPlan",
    "GpuResult", "GpuScheduler", "Owner", "PrefillChunk", "Request", "Route", "RoundLog",
    "SchedulerConfig",
    "assist_reachable", "blocks_for", "check_thresholds", "envelope_fits", "extend_reserve",
    "migration_reserve", "route_for",
]
