"""How fast the simulator runs: simulated requests per wall-second on one core.

Runs benchmarks/sim_speed.yaml several times (scenario loading excluded, it is not the hot path)
and reports the median. Target: the 2,000-request run in <= 2 s (>= 1,000 requests per second).
Last line: `wall_s=<median seconds> requests_per_s=<simulated requests per wall-second>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from dualpace_sim.scenario import load_scenario
from dualpace_sim.sim import DualPaceNode

HERE = Path(__file__).resolve().parent
SHARED_AZURE = HERE.parent.parent / "shared" / "data" / "azure"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scenario", type=Path, default=HERE / "sim_speed.yaml")
    args = parser.parse_args()
    if "DUALPACE_AZURE_DIR" not in os.environ and SHARED_AZURE.is_dir():
        os.environ["DUALPACE_AZURE_DIR"] = str(SHARED_AZURE)
    loaded = load_scenario(args.scenario)
    n = len(loaded.requests)
    walls = []
    for i in range(args.repeats):
        start = time.perf_counter()
        out = DualPaceNode(loaded.requests, loaded.cost, loaded.config).run()
        walls.append(time.perf_counter() - start)
        tokens = sum(len(r.token_times) for r in out.requests)
        print(f"run {i}: wall {walls[-1]:.3f}s, {n} requests, {tokens} tokens, "
              f"simulated {out.stats.end_s:.1f}s, gpu rounds {out.stats.gpu_rounds}, "
              f"cpu rounds {out.stats.cpu_rounds}, assists {out.stats.assist_calls}")
    wall = statistics.median(walls)
    print(f"target: <= 2.0 s per run; ratio to target = {wall / 2.0:.2f}")
    print(f"wall_s={wall:.3f} requests_per_s={n / wall:.0f}")


if __name__ == "__main__":
    main()
