"""How the simulator scales with the number of requests: wall seconds, CPU µs per request and
peak RSS for each policy at 2k, 20k and 200k requests, below and above saturation.

Each point runs in a fresh process: scenarios/paper/llama8b-rtx4090-conv.yaml (Llama-3.1-8B,
RTX 4090 roofline profile, the paper's vLLM and NEO settings) with Azure-Conversation-shaped
requests from the embedded default distribution instead of the trace (which has too few for
200k), Poisson arrivals, seed 0: first the simulation, then the
output a `dualpace-sim run` writes (records, summary metrics, Parquet, the state and
utilisation series, timeline plot). Peak
RSS is read after each, so `rss_sim_mib` is the simulation's and `rss_mib` includes the output.
Target: the 200k-request DualPace run at <= 1 GiB peak RSS, output included.
Last line: `points=<n> max_rss_mib=<largest peak RSS>`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIO = HERE.parents[1] / "scenarios/paper/llama8b-rtx4090-conv.yaml"
# Offered rates (req/s) below and above every policy's saturation knee on this box
# (scenarios/paper/llama8b-rtx4090-conv.yaml: vLLM saturates near 2, DualPace and NEO near 4.5).
RATES = {"below": 1.5, "above": 6.0}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one_point(policy: str, rate: float, n: int) -> dict:
    """Simulate one point and write its output into a temporary folder."""
    import yaml

    from dualpace_sim.config.scenario import load_scenario
    from dualpace_sim.plots.runs import plot_timeline
    from dualpace_sim.results.metrics import summarize
    from dualpace_sim.results.node_series import write_series
    from dualpace_sim.results.records import PolicyRecords, write_policy_records
    from dualpace_sim.sim import make_node

    with tempfile.TemporaryDirectory() as tmp:
        doc = yaml.safe_load(SCENARIO.read_text())
        doc.pop("sweep")
        doc["profile"] = str((SCENARIO.parent / doc["profile"]).resolve())
        doc["policies"] = [policy]
        doc["workload"] = {"source": "default", "trace": "conv", "num_requests": n,
                           "arrival": "poisson", "rate": rate, "seed": 0}
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump(doc))
        loaded = load_scenario(path)
        rss_loaded = peak_rss_mib()
        node = make_node(policy, loaded.requests, loaded.cost, loaded.policy_config(policy))
        start, cpu_start = time.perf_counter(), time.process_time()
        out = node.run()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        rss_sim = peak_rss_mib()
        rounds = out.stats.gpu_rounds + out.stats.cpu_rounds
        out_start = time.perf_counter()
        records = PolicyRecords.from_requests(out.requests, policy, out.series)
        del node, out
        summarize(records.requests, tokens=records.tokens)
        write_policy_records([records], Path(tmp) / "requests.parquet")
        write_series({policy: records.series}, Path(tmp))
        plot_timeline({policy: records.requests}, Path(tmp) / "timeline",
                      tokens={policy: records.tokens})
        output_wall = time.perf_counter() - out_start
    return {"policy": policy, "rate": rate, "requests": n, "wall_s": wall, "cpu_s": cpu,
            "cpu_us_per_request": cpu / n * 1e6, "rounds": rounds,
            "output_wall_s": output_wall, "rss_loaded_mib": rss_loaded,
            "rss_sim_mib": rss_sim, "rss_mib": peak_rss_mib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="dualpace,vllm,neo")
    parser.add_argument("--sizes", default="2000,20000,200000")
    parser.add_argument("--loads", default="below,above", help="of: " + ", ".join(RATES))
    parser.add_argument("--point", nargs=3, metavar=("POLICY", "RATE", "N"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        policy, rate, n = args.point
        print(json.dumps(one_point(policy, float(rate), int(n))))
        return
    rows = []
    print(f"{'policy':9} {'load':6} {'rate':>5} {'requests':>9} {'wall_s':>8} {'us/req':>7} "
          f"{'us/round':>8} {'out_s':>6} {'rss_sim':>8} {'rss_MiB':>8}")
    for policy in args.policies.split(","):
        for load in args.loads.split(","):
            for n in (int(s) for s in args.sizes.split(",")):
                cmd = [sys.executable, __file__, "--point", policy, str(RATES[load]), str(n)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                r = json.loads(done.stdout.splitlines()[-1])
                rows.append(r)
                print(f"{policy:9} {load:6} {r['rate']:5.1f} {n:9d} {r['wall_s']:8.2f} "
                      f"{r['cpu_us_per_request']:7.0f} {r['cpu_s'] / r['rounds'] * 1e6:8.1f} "
                      f"{r['output_wall_s']:6.1f} {r['rss_sim_mib']:8.0f} {r['rss_mib']:8.0f}",
                      flush=True)
    print(f"points={len(rows)} max_rss_mib={max(r['rss_mib'] for r in rows):.0f}")


if __name__ == "__main__":
    main()
