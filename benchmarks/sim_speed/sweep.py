"""How fast a whole sweep runs: benchmarks/sim_speed/sweep.yaml through the `dualpace-sim sweep`
code path (:func:`dualpace_sim.experiments.sweep.run_sweep`, in-process call, worker processes as
usual).

Target: 3 policies x >= 8 rates x 2,000 requests in under 120 s on a 2-core machine. Until the
vLLM and NEO policies exist the scenario lists DualPace only, so compare ``wall_s`` per point.
Results go to a temporary directory (kept with --keep). Prints each point's time and, as last
line, `wall_s=<total> points=<n> target_s=120 ratio=<wall/120>`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from dualpace_sim.experiments.sweep import format_sustainable, run_sweep

HERE = Path(__file__).resolve().parent
SHARED_AZURE = HERE.parents[2] / "shared" / "data" / "azure"
TARGET_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=HERE / "sweep.yaml")
    parser.add_argument("--workers", type=int, default=None, help="default: CPU count")
    parser.add_argument("--keep", action="store_true", help="keep and print the output folder")
    args = parser.parse_args()
    if "DUALPACE_AZURE_DIR" not in os.environ and SHARED_AZURE.is_dir():
        os.environ["DUALPACE_AZURE_DIR"] = str(SHARED_AZURE)
    out = Path(tempfile.mkdtemp(prefix="dualpace-sweep-speed-"))
    try:
        result = run_sweep(args.scenario, out, workers=args.workers, progress=False)
        for p in sorted(result.points, key=lambda p: (p.policy, p.rate)):
            wall = f"{p.wall_s:.2f}s" if p.wall_s is not None else "-"
            extra = f"  FAILED: {p.error}" if p.error else ""
            print(f"point {p.name:<18} {wall:>8}{extra}")
        print(format_sustainable(result.sustainable, result.table["rate"]))
        workers = args.workers or os.cpu_count()
        print(f"workers={workers} sum of point times="
              f"{sum(p.wall_s or 0 for p in result.points):.1f}s")
        if args.keep:
            print(f"results in {out}")
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    wall = result.wall_s
    print(f"wall_s={wall:.2f} points={len(result.points)} target_s={TARGET_S:.0f} "
          f"ratio={wall / TARGET_S:.3f}")


if __name__ == "__main__":
    main()
