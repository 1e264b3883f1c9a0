"""The output reference page, made from dualpace_sim/results/output_reference.py at docs build time.

The tables there are checked against real outputs by the tests, so this page, made from them,
names every column and key the simulator writes, in its units.
"""

from __future__ import annotations

from mdtext import cell

from dualpace_sim.results import output_reference as ref
from dualpace_sim.results.provenance import PARQUET_KEY

INTRO = """\
What `dualpace-sim run`, `sweep`, `capacity` and `validate` write, column by column and key by
key, generated from `dualpace_sim/results/output_reference.py` when the docs are built. Times are in
seconds, rates in requests per second, throughputs in tokens per second. A name with `<P>`
stands for each of the scenario's `metrics.percentiles` (default 50, 90, 95, 99; `99.9` is
written `p99.9`), and `<latency>` for each of `ttft`, `tpot`, `itl` and `e2el`. For vLLM's
benchmark layout of the same numbers (milliseconds), see
[Comparing with vLLM's benchmark](../vllm-benchmark.md)."""

SECTIONS = [
    ("requests.parquet", "One row per request and policy (`run`, each sweep point, "
     "`validate`'s `sim/`). The file's key-value metadata holds the provenance below as JSON "
     f"under `{PARQUET_KEY}` (`dualpace_sim.results.records.read_metadata`).", ref.RECORDS),
    ("state.parquet", "What the node held over time, one policy after another (`run`, each "
     "sweep point, `dualpace-hw run` and `serve`), with the same metadata. Recorded from the "
     "scheduler's own state after each core call: the simulator samples it as it runs; the "
     "real runtime samples it at each journaled call, so it equals what replaying the journal "
     "gives (`dualpace_sim.results.replay.replay_states`). `dualpace-sim plot` draws it "
     "(`state_over_time`).", ref.STATE),
    ("utilisation.parquet", "How busy each engine was over time: the share of each bin it "
     "worked, within 0-1 (busy time is kept in 65,536 fine bins per engine, which double in "
     "width as the run grows, and spread evenly inside one; summed over the bins, the "
     "simulated GPU's is its batch and assist time, its CPU's the CPU busy time).",
     ref.UTILISATION),
    ("summary.json", "A list with one entry per policy, in the same shape for `run`, each "
     "sweep point (a list of one) and `validate`'s `sim/`.", ref.SUMMARY),
    ("summary.json: engine", "The engines' counters of one policy's run.", ref.ENGINE),
    ("summary.json: a real run", "`dualpace-hw run` and `serve` write the keys above, in the "
     "same order, with the utilisations from the run's `utilisation.parquet` (the runtime "
     "counts busy time, not PCIe bytes), then these; `engine` holds the runtime's counters "
     "(next table).", ref.REAL_SUMMARY),
    ("summary.json: a real run's engine", "The real runtime's counters of one policy's run.",
     ref.REAL_ENGINE),
    ("summary.json: provenance", "How the result was made; identical runs give identical "
     "values (no clock is read).", ref.PROVENANCE),
    ("sweep.json", "What a sweep ran; a rerun resumes only when the scenario hash and the "
     "code version match.", ref.SWEEP_JSON),
    ("sweep.csv", "One row per finished point, sorted by policy, grid setting and rate.",
     ref.SWEEP_CSV),
    ("sustainable.csv", "The sustainable request rate per policy (and grid setting) and "
     "target.", ref.SUSTAINABLE_CSV),
    ("sweep_ci.csv", "Only with `sweep.seeds`: every metric's mean over the seeds and its "
     "interval.", ref.SWEEP_CI_CSV),
    ("capacity.csv", "`dualpace-sim capacity --out DIR`: one row per policy.", ref.CAPACITY_CSV),
    ("validation.csv", "`dualpace-sim validate`: one row per policy and metric.",
     ref.VALIDATION_CSV),
    ("Trace tracks", "`--trace-events FILE` (Chrome/Perfetto JSON, gzip when FILE ends in "
     "`.gz`): one process per policy, one thread per track, and the counter tracks of "
     "`state.parquet` and `utilisation.parquet` (`dualpace-sim run` and `dualpace-hw run`).",
     ref.TRACE_TRACKS),
]


def output_reference() -> str:
    out = ["# Output reference", "", INTRO]
    for title, text, rows in SECTIONS:
        out += ["", f"## {title}", "", text, "", "| name | unit | meaning |", "|---|---|---|"]
        out += [f"| `{name}` | {unit} | {cell(meaning)} |" for name, unit, meaning in rows]
    return "\n".join(out) + "\n"
