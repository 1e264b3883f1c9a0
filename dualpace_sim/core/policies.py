"""The policies, registered behind one interface.

An entry names what the rest of the project needs of a policy: its schedulers over fresh state
with one driver per engine (:mod:`.rounds`), the scenario section of its limits and its GPU
batch budget there, the up-front check of what it can never serve, and its backends: the
simulator's node and the real runtime, as ``module:Class`` paths that each backend resolves
(`resolve`), so the core imports neither. Adding a policy is adding its scheduler module to the
core, its backends, and its entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import SchedulerConfig
from .cpu_round import CpuScheduler
from .gpu_round import GpuScheduler
from .journal import Journal
from .neo import NeoConfig, NeoPredictor, NeoScheduler
from .request import Request
from .rounds import CpuDriver, Driver, GpuDriver, NeoDriver, VllmDriver
from .servable import dualpace_refusal, neo_pool_refusal, neo_refusal, vllm_refusal
from .state import EngineState
from .vllm import VllmConfig, VllmScheduler

PolicyConfig = SchedulerConfig | VllmConfig | NeoConfig


@dataclass
class Schedulers:
    """One run of a policy's scheduling: its state, and a driver per engine."""

    state: EngineState | VllmScheduler | NeoScheduler  # arrivals enter it; it holds the finished
    drivers: dict[str, Driver]  # by the engine's name in the journal: "gpu", "cpu"

    def submit(self, r: Request) -> None:
        self.state.submit(r)

    @property
    def finished(self) -> list[Request]:
        return self.state.finished


def dualpace_schedulers(config: SchedulerConfig, predictor: NeoPredictor | None = None,
                        journal: Journal | None = None) -> Schedulers:
    """The GPU and CPU engines over one shared state (`predictor`: NEO's only)."""
    state = EngineState(config)
    return Schedulers(state, {"gpu": GpuDriver(GpuScheduler(state), journal),
                              "cpu": CpuDriver(CpuScheduler(state), journal)})


def vllm_schedulers(config: VllmConfig, predictor: NeoPredictor | None = None,
                    journal: Journal | None = None) -> Schedulers:
    sched = VllmScheduler(config)
    return Schedulers(sched, {"gpu": VllmDriver(sched, journal)})


def neo_schedulers(config: NeoConfig, predictor: NeoPredictor | None = None,
                   journal: Journal | None = None) -> Schedulers:
    """NEO decides with `predictor`, its tables (the costs' `NeoTables`)."""
    if predictor is None:
        raise ValueError("NEO decides with its predictor's tables: give one")
    sched = NeoScheduler(config, predictor)
    return Schedulers(sched, {"gpu": NeoDriver(sched, journal)})


def dualpace_config(pools: SchedulerConfig, tokens: int, rows: int, section: Any
                    ) -> SchedulerConfig:
    """DualPace's limits are the scheduler section itself, its GPU budget in it."""
    return pools


def vllm_config(pools: SchedulerConfig, tokens: int, rows: int, section: Any) -> VllmConfig:
    return VllmConfig(pools.gpu_kv_blocks, pools.block_size, tokens, rows)


def neo_config(pools: SchedulerConfig, tokens: int, rows: int, section: Any) -> NeoConfig:
    """`section`: the scenario's neo section (its staging pool, sub-batch threshold, swap-in
    fraction and launch term; None there: the profile's)."""
    return NeoConfig(pools.gpu_kv_blocks, pools.host_kv_blocks, pools.block_size, rows, tokens,
                     section.itm_blocks, section.linr_s_threshold, section.swap_in_fraction,
                     section.launch_s)


@dataclass(frozen=True)
class Policy:
    name: str
    schedulers: Callable[..., Schedulers]  # (config, predictor=None, journal=None)
    config: Callable[[SchedulerConfig, int, int, Any], PolicyConfig]  # (pools, tokens, rows,
    #   the section): its limits over the scenario's KV pools and its GPU budget
    section: str  # the scenario section of its limits
    budget: tuple[str, str]  # its GPU batch budget's keys in that section: tokens, rows
    refusal: Callable[[Any, int, int], str | None]  # (config, prompt, max_tokens): why never
    simulator: str  # its simulated node, module:Class
    runtime: str  # its real runtime, module:Class
    served: bool = False  # behind `dualpace-hw serve` too
    pool_refusal: Callable[[Any], str | None] | None = None  # pools that refuse every request

    @property
    def budget_keys(self) -> tuple[str, str]:
        """The budget's scenario keys, section.key."""
        return (f"{self.section}.{self.budget[0]}", f"{self.section}.{self.budget[1]}")


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("dualpace", dualpace_schedulers, dualpace_config, "scheduler",
           ("gpu_token_limit", "gpu_max_rows"), dualpace_refusal,
           "dualpace_sim.sim.dualpace:DualPaceNode",
           "dualpace_hw.runtime.dualpace:DualPaceRuntime", served=True),
    Policy("vllm", vllm_schedulers, vllm_config, "vllm",
           ("max_num_batched_tokens", "max_num_seqs"), vllm_refusal,
           "dualpace_sim.sim.vllm:VllmNode",
           "dualpace_hw.runtime.vllm:VllmRuntime", served=True),
    Policy("neo", neo_schedulers, neo_config, "neo", ("max_tokens_in_batch", "max_batch_size"),
           neo_refusal, "dualpace_sim.sim.neo:NeoNode", "dualpace_hw.runtime.neo:NeoRuntime",
           pool_refusal=neo_pool_refusal),
)}
POLICY_NAMES = tuple(POLICIES)


def policy_named(name: str) -> Policy:
    """The registered policy `name`; ValueError naming the registered ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"no policy {name!r}; the policies are "
                         f"{', '.join(POLICY_NAMES)}") from None


def resolve(path: str) -> Any:
    """The object a ``module:name`` path names, imported now (a backend resolves its own)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
