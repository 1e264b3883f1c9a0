"""DualPace's real CPU engine steps against the simulator's price for the same plans, by batch
size: steps, and the median and range of real / model. The model's step has the assists at
their profiled cost and no waits for the GPU engine's stage boundaries, so a ratio above 1 is
the CPU engine's own work, the assist handshake and those waits together.

    DUALPACE_AZURE_DIR=... python -m dualpace_sim.validation.analysis.cpu_steps 8 12
"""

from __future__ import annotations

import statistics
import sys

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rounds import cpu_steps, h200_run

BUCKETS = ((1, 3), (4, 15), (16, 63), (64, 1 << 30))


def main(rates: list[str]) -> None:
    print(f"{'rate':>4}  {'route':13}{'batch':>8}{'n':>5}{'median real/model':>19}{'range':>13}")
    for rate in rates:
        steps = list(cpu_steps(*h200_run(rate)))
        for route in sorted({s.route for s in steps}, key=lambda r: r.value):
            for lo, hi in BUCKETS:
                ratios = [s.real_s / s.model_s for s in steps
                          if s.route == route and lo <= s.batch <= hi]
                if ratios:
                    size = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
                    print(f"{rate:>4}  {route.value:13}{size:>8}{len(ratios):>5}"
                          f"{statistics.median(ratios):>19.2f}"
                          f"{min(ratios):>7.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    run_analysis(main, sys.argv[1:])
