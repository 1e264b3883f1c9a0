"""Per-layer time of the small prefill rounds of the real runs (fewer than 256 tokens: bound by
the host issuing each layer's kernels), by policy and by whether a CPU step was in flight when
the round was scheduled. Read from the runtime's journals, each round's time less the cost
model's pre-layer, post-layer and overhead; the first three rounds are left out.

    DUALPACE_AZURE_DIR=... python docs/validation/analysis/small_prefill_floors.py 4 8 12
"""

from __future__ import annotations

import statistics
import sys

from rounds import gpu_rounds, h200_run


def floors(rate: str, policy: str) -> dict[bool, list[float]]:
    out: dict[bool, list[float]] = {True: [], False: []}
    for r in gpu_rounds(*h200_run(rate), policy):
        if r.index >= 3 and r.prefill and r.n_tokens < 256:
            out[r.cpu_step_in_flight].append((r.real_s - r.fixed_s) / r.n_layers)
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
