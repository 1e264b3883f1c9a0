"""The GPU batch budget of each policy: what one GPU batch may carry, and whether they agree.

A comparison of policies is fair only if their GPU batches are equally large: DualPace's profiled
``gpu_token_limit`` (paper §4.3) is often a fraction of vLLM's ``max_num_batched_tokens``, and a
smaller token budget alone cuts the inter-token gaps that prefill chunks cause. So ``run`` and
``sweep`` say, in one note, when the policies of a scenario run with different budgets, and the
scenario key ``shared_gpu_budget`` gives every policy one policy's budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dualpace_sim.core import SchedulerConfig
from dualpace_sim.core.policies import POLICIES

# policy -> (its token budget's scenario key, its row budget's)
BUDGET_KEYS = {name: p.budget_keys for name, p in POLICIES.items()}


@dataclass(frozen=True)
class GpuBudget:
    """What one GPU batch of a policy may carry."""

    tokens: int  # tokens in one GPU batch: decodes and prefill chunks together
    rows: int  # requests in one GPU batch


def dualpace_budget(config: SchedulerConfig) -> GpuBudget:
    """DualPace's: the tighter of its profiled and hard token limits, and its row limit."""
    return GpuBudget(config.gpu_batch_tokens, config.gpu_max_rows)


def with_budget(config: SchedulerConfig, budget: GpuBudget) -> SchedulerConfig:
    """``config`` carrying ``budget``; the hard token cap is raised to it where it is lower, so
    that the budget is the one DualPace runs with."""
    return replace(config, gpu_token_limit=budget.tokens, gpu_max_rows=budget.rows,
                   gpu_hard_token_limit=max(config.gpu_hard_token_limit, budget.tokens))


def unequal_budget_note(budgets: dict[str, GpuBudget]) -> str | None:
    """One line saying which policies run with which GPU batch budget, or None when they all
    have the same one (a single policy, or a shared budget)."""
    if len(set(budgets.values())) <= 1:
        return None
    each = "; ".join(f"{policy} {b.tokens} tokens and {b.rows} rows "
                     f"({', '.join(BUDGET_KEYS[policy])})" for policy, b in budgets.items())
    return (f"the policies run with different GPU batch budgets: {each}; their latencies differ "
            "by the budgets as well as by scheduling; set shared_gpu_budget: <policy> to give "
            "every policy that one's")
