"""Per-layer time of the small prefill rounds of the real runs (fewer than 256 tokens: bound by
the host issuing each layer's kernels), by policy and by whether a CPU step was in flight when
the round was scheduled. Read from the runtime's journals, each round's time less the cost
model's pre-layer, post-layer and overhead; the first three rounds are left out.

    DUALPACE_AZURE_DIR=... python docs/validation/analysis/small_prefill_floors.py 4 8 12
"""

from __future__ import annotations

import statistics
import sys

from dualpace_sim.core import Request
from dualpace_sim.core.journal import JOURNAL_FILE, Journal
from dualpace_sim.replay import _DualPaceCalls, _VllmCalls
from dualpace_sim.scenario import load_scenario


def floors(rate: str, policy: str) -> dict[bool, list[float]]:
    loaded = load_scenario(f"scenarios/h200/validation/llama-3.1-8b-r{rate}.yaml")
    cost, bs = loaded.cost, loaded.policy_config(policy).block_size
    requests = [Request.create(i, s.arrival_s, s.prompt_tokens, s.max_tokens, bs)
                for i, s in enumerate(loaded.requests)]
    calls = (_DualPaceCalls if policy == "dualpace" else _VllmCalls)(loaded, requests)
    journal = Journal.read(f"docs/validation/r{rate}/real/{JOURNAL_FILE.format(policy=policy)}")
    out: dict[bool, list[float]] = {True: [], False: []}
    pending, rounds, cpu_step = None, 0, False
    for e in journal.entries:
        calls(e)
        if e.engine == "cpu":
            if e.call == "schedule":
                cpu_step = calls.cpu_plan is not None and not calls.cpu_plan.is_empty
            elif e.call == "apply":
                cpu_step = False
        elif e.engine == "gpu" and e.call == "schedule":
            plan = calls.gpu_plan if policy == "dualpace" else calls.plan
            if plan is not None and plan.has_forward and e.data.get("committed", True):
                fixed = (cost.gpu_pre_layer(plan.n_tokens) + cost.gpu_post_layer(plan.n_sampled)
                         + cost.gpu_iteration_overhead)
                pending = (e.t, plan.n_tokens, bool(plan.prefills), fixed, cpu_step)
        elif e.engine == "gpu" and e.call == "apply" and pending is not None:
            rounds += 1
            start, tokens, prefill, fixed, busy = pending
            if rounds > 3 and prefill and tokens < 256:
                out[busy].append((e.t - start - fixed) / cost.n_layers)
            pending = None
    return out


def main(rates: list[str]) -> None:
    for rate in rates:
        for policy in ("dualpace", "vllm"):
            for busy, values in floors(rate, policy).items():
                if values:
                    print(f"{rate} req/s {policy:8s} CPU step in flight: {str(busy):5s} "
                          f"n={len(values):3d} median {statistics.median(values) * 1e3:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
