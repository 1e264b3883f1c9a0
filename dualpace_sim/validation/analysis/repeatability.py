"""How far apart real runs of one scenario are, metric by metric: the yardstick to read a single
run's validation error against.

On the H200 box two DualPace runs of the same CPU-busy case, code and profile differed by more
than the validation targets (docs/validation/README.md, session 24): a simulator within 20 % of
one run's P99 may be outside it for the next. Given the run directories of one workload (each
`dualpace-hw run`'s, or joined ones), this prints, per policy and headline metric, each run's
value and their spread, (max - min) / median, beside the metric's target.

    python -m dualpace_sim.validation.analysis.repeatability RUN_DIR RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dualpace_sim.validation.analysis import run_analysis
from dualpace_sim.validation.analysis.rankings import TARGETS


def summaries(run: Path) -> dict[str, dict]:
    """policy -> its summary in `run`'s summary.json; ValueError naming the file if unreadable."""
    path = run / "summary.json"
    try:
        rows = json.loads(path.read_text())
        return {row["policy"]: row for row in rows}
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: not a run's summary ({e}); give run directories") from None


def spread(values: list[float]) -> float:
    """(max - min) / median; 0 for runs that agree (or a zero median)."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def report(runs: list[Path]) -> list[str]:
    """The table's lines. Runs of other workloads (their requests' digest differs) are refused;
    a run stopped before its last request finished is left out of its policy's spread, and
    one run found in several folders (joined runs share a policy's run) counts once."""
    per_run = [summaries(r) for r in runs]
    digests = {s.get("requests_sha256") for run in per_run for s in run.values()} - {None}
    if len(digests) > 1:
        raise ValueError(f"{', '.join(map(str, runs))}: runs of different workloads (their "
                         "requests_sha256 differ); give runs of one scenario")
    lines = [f"{'policy':<9}{'metric':<22}{'runs':>5}  {'spread':>8}  target  values"]
    for policy in sorted({p for run in per_run for p in run}):
        done = list({json.dumps(run[policy], sort_keys=True): run[policy] for run in per_run
                     if policy in run
                     and run[policy].get("completed") == run[policy].get("submitted")}.values())
        if len(done) < 2:
            lines.append(f"{policy:<9}fewer than two distinct complete runs: no spread")
            continue
        for metric, target in TARGETS.items():
            values = [float(s[metric]) for s in done if isinstance(s.get(metric), int | float)]
            if len(values) < 2 or (metric == "cpu_token_fraction" and not any(values)):
                continue
            width = spread(values)
            lines.append(f"{policy:<9}{metric:<22}{len(values):>5}  {width * 100:>6.1f} %  "
                         f"{target * 100:>4.0f} %  {' '.join(f'{v:.4g}' for v in values)}"
                         + ("  wider than the target" if width > target else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real run directories")
    args = parser.parse_args()
    if len(args.runs) < 2:
        raise ValueError("give at least two run directories of one scenario")
    print("\n".join(report(args.runs)))


if __name__ == "__main__":
    run_analysis(main)
