"""How fast the simulator runs: simulated requests per wall-second on one core.

Runs benchmarks/sim_speed/run.yaml several times (scenario loading excluded, it is not the hot path)
and reports the median wall and CPU time (CPU time is what to compare on a shared machine).
Target: the 2,000-request run in <= 2 s (>= 1,000 requests per second).

`--baseline DIR` also times the code of another checkout (say `git worktree add --detach
/tmp/base <commit>`) on the same scenario, alternating runs with this checkout's, each in a
fresh process, and prints the ratio of the medians: how a change compares with the code before
it, measured in one run on the same machine.

Last line: `wall_s=<median seconds> requests_per_s=<simulated requests per wall-second>
events_per_request=<SimPy events per request>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED_AZURE = REPO.parent / "shared" / "data" / "azure"


def one_run(scenario: Path, count_events: bool) -> dict:
    """Time one simulation of `scenario` with whichever dualpace_sim is on the path. Counting
    patches SimPy's scheduler, for code whose environment does not count its events."""
    import time

    import simpy

    try:
        from dualpace_sim.config.scenario import load_scenario
    except ImportError:  # a checkout from before the package layout (the baseline of issue 24)
        from dualpace_sim.scenario import load_scenario
    from dualpace_sim.sim import DualPaceNode

    counted = [0]
    if count_events:
        schedule = simpy.Environment.schedule

        def counting(env, event, priority=1, delay=0):
            counted[0] += 1
            schedule(env, event, priority, delay)

        simpy.Environment.schedule = counting
    loaded = load_scenario(scenario)
    node = DualPaceNode(loaded.requests, loaded.cost, loaded.config)
    start, cpu_start = time.perf_counter(), time.process_time()
    out = node.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    events = counted[0] if count_events else getattr(node.env, "events", None)
    return {"wall_s": wall, "cpu_s": cpu, "requests": len(out.requests), "events": events,
            "tokens": sum(r.generated for r in out.requests), "end_s": out.stats.end_s,
            "gpu_rounds": out.stats.gpu_rounds, "cpu_rounds": out.stats.cpu_rounds,
            "assists": out.stats.assist_calls}


def import_from(source: Path) -> None:
    """Make `source`'s packages win over an editable install of this project, whose import
    finder sits in `sys.meta_path` ahead of PYTHONPATH and would mix the two checkouts."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not getattr(f, "__module__", "").startswith("__editable__")]
    sys.path.insert(0, str(source))


def run_in(source: Path, scenario: Path, count_events: bool = False) -> dict:
    """One run in a fresh interpreter that imports dualpace_sim from `source`."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    cmd = [sys.executable, __file__, "--one-run", "--source", str(source),
           "--scenario", str(scenario)]
    if count_events:
        cmd.append("--count-events")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=source)
    return json.loads(done.stdout.splitlines()[-1])


def describe(r: dict) -> str:
    return (f"wall {r['wall_s']:.3f}s, cpu {r['cpu_s']:.3f}s, {r['requests']} requests, "
            f"{r['tokens']} tokens, "
            f"simulated {r['end_s']:.1f}s, gpu rounds {r['gpu_rounds']}, "
            f"cpu rounds {r['cpu_rounds']}, assists {r['assists']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scenario", type=Path, default=HERE / "run.yaml")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of the code to compare with, timed in the same run")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count-events", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "DUALPACE_AZURE_DIR" not in os.environ and SHARED_AZURE.is_dir():
        os.environ["DUALPACE_AZURE_DIR"] = str(SHARED_AZURE)
    scenario = args.scenario.resolve()
    if args.one_run:
        if args.source is not None:
            import_from(args.source)
        print(json.dumps(one_run(scenario, args.count_events)))
        return
    runs, base_runs = [], []
    for i in range(args.repeats):
        if args.baseline is not None:
            base_runs.append(run_in(args.baseline.resolve(), scenario))
            print(f"baseline run {i}: {describe(base_runs[-1])}")
        runs.append(run_in(REPO, scenario))
        print(f"run {i}: {describe(runs[-1])}")
    n = runs[0]["requests"]
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    events = runs[0]["events"] / n
    if args.baseline is not None:
        base_wall = statistics.median(r["wall_s"] for r in base_runs)
        base_cpu = statistics.median(r["cpu_s"] for r in base_runs)
        base_events = run_in(args.baseline.resolve(), scenario, count_events=True)["events"] / n
        print(f"baseline: wall_s={base_wall:.3f} cpu_s={base_cpu:.3f} "
              f"events_per_request={base_events:.1f}")
        print(f"ratio to baseline: wall {wall / base_wall:.2f}, cpu {cpu / base_cpu:.2f}, "
              f"events {events / base_events:.2f}")
    print(f"cpu_s={cpu:.3f} cpu_us_per_request={cpu / n * 1e6:.0f}")
    print(f"target: <= 2.0 s per run; ratio to target = {wall / 2.0:.2f}")
    print(f"wall_s={wall:.3f} requests_per_s={n / wall:.0f} events_per_request={events:.1f}")


if __name__ == "__main__":
    main()
