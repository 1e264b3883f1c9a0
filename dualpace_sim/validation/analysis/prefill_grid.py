"""How far the old, coarse prefill-attention grid is off, read from a profile measured on the
dense one: interpolate the old grid's subset of `gpu.prefill_attn` at every dense-grid point
it lacks, as the cost model does, and print the error against the measured value.

    python -m dualpace_sim.validation.analysis.prefill_grid calibration/h200x2-xeon32/qwen3-14b.yaml
"""

from __future__ import annotations

import sys

from dualpace_sim.costs.model import Interp2D
from dualpace_sim.costs.profile import Table2D, load_profile
from dualpace_sim.validation.analysis import run_analysis

OLD_CHUNKS = [16, 64, 256, 1024, 4096]
OLD_CONTEXTS = [16, 256, 2048, 8192, 32768]


def main(path: str) -> None:
    t = load_profile(path).gpu.prefill_attn
    xs, ys = [int(v) for v in t.x], [int(v) for v in t.y]
    old = Interp2D("gpu.prefill_attn (old grid)", Table2D(
        x=OLD_CHUNKS, y=OLD_CONTEXTS,
        z=[[t.z[xs.index(x)][ys.index(y)] for y in OLD_CONTEXTS] for x in OLD_CHUNKS]))
    errors = []
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            if (x in OLD_CHUNKS and y in OLD_CONTEXTS) or y < x or x < OLD_CHUNKS[0]:
                continue  # on the old grid, a chunk with less context than itself, or below
                # the old grid's first row (the dense grid's 1-token row is not interpolated)
            errors.append(old(x, y) / t.z[i][j] - 1)
            print(f"chunk {x:5d}, context {y:6d}: old grid {errors[-1]:+.0%}")
    print(f"largest error {max(errors, key=abs):+.0%} over {len(errors)} points")


if __name__ == "__main__":
    run_analysis(main, sys.argv[1])
