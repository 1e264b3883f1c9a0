"""What every output file holds: each column and key with its unit and meaning.

The docs' output reference (docs/gen/output_reference.py) is made from these tables, and
tests/test_output_reference.py checks them against real outputs in both directions (every
column or key a run writes is described here, and everything described is written), so the
page cannot drift from the files. A name containing ``<P>`` or ``<latency>`` stands for a
family: ``<P>`` each of the scenario's ``metrics.percentiles`` as vLLM spells it (``99``,
``99.9``), ``<latency>`` each of ``ttft``, ``tpot``, ``itl`` and ``e2el``.
"""

from __future__ import annotations

import re

from dualpace_sim.results.node_series import UTILISATION_BINS

# (name, unit, meaning)
Row = tuple[str, str, str]

RECORDS: list[Row] = [
    ("policy", "", "the policy that served the request: dualpace, vllm or neo"),
    ("request_id", "", "the request's index in arrival order, from 0"),
    ("arrival_s", "s", "when the request arrived, from the run's start"),
    ("prompt_tokens", "tokens", "prompt length"),
    ("max_tokens", "tokens", "output length the request asks for"),
    ("n_tokens", "tokens", "output tokens it produced; equal to max_tokens when it completed"),
    ("first_token_s", "s", "time of its first output token; NaN when it produced none"),
    ("finish_s", "s", "time of its last output token; NaN when it produced none"),
    ("token_times_s", "s", "the time of every output token, as the client sees it"),
    ("token_owners", "", "one letter per output token: G (GPU engine) or C (CPU engine)"),
    ("migration_times_s", "s", "the time of each migration of the request's KV"),
    ("migration_kinds", "", "the kind of each migration: swap_out, swap_in, prefill_to_cpu, "
                            "preempt_recompute"),
]

LATENCY_NAMES = {"ttft": "time to first token (every request with a token)",
                 "tpot": "time per output token after the first, (e2e - TTFT) / (n - 1) "
                         "(completed requests with n > 1)",
                 "itl": "every gap between consecutive tokens of a request",
                 "e2el": "end-to-end latency, last token - arrival (completed requests)"}

SUMMARY: list[Row] = [
    ("scenario", "", "the scenario's name"),
    ("policy", "", "the policy of this entry"),
    ("rate", "req/s", "offered rate (null for trace arrivals)"),
    ("submitted", "requests", "requests in the workload"),
    ("completed", "requests", "requests that produced all their tokens"),
    ("normalized_latency_s", "s/token", "mean over completed requests of e2e latency / output "
                                        "tokens (the paper's metric)"),
    ("mean_ttft_s", "s", "mean TTFT"),
    ("p50_ttft_s", "s", "median TTFT"),
    ("p99_ttft_s", "s", "99th percentile TTFT"),
    ("p99_itl_s", "s", "99th percentile ITL"),
    ("p99_tpot_s", "s", "99th percentile TPOT"),
    ("throughput_tok_s", "tokens/s", "output tokens over the makespan"),
    ("cpu_token_fraction", "", "share of output tokens the CPU engine produced"),
    ("makespan_s", "s", "first arrival to last token: the window of the throughputs"),
    ("request_throughput_req_s", "req/s", "completed requests over the makespan"),
    ("output_throughput_tok_s", "tokens/s", "output tokens over the makespan (= "
                                            "throughput_tok_s)"),
    ("total_token_throughput_tok_s", "tokens/s", "prompt tokens of every request that was "
                                                 "prefilled, plus output tokens, over the "
                                                 "makespan"),
    ("good_requests", "requests", "completed requests meeting the scenario's TTFT, TPOT and "
                                  "normalized-latency targets on their own values"),
    ("goodput_req_s", "req/s", "good_requests over the makespan (vLLM's request_goodput)"),
    ("mean_<latency>_s", "s", "mean of the latency"),
    ("median_<latency>_s", "s", "median of the latency"),
    ("std_<latency>_s", "s", "standard deviation of the latency (population, as numpy's)"),
    ("p<P>_<latency>_s", "s", "the P-th percentile of the latency (numpy's linear one)"),
    ("gpu_utilisation", "", "share of the run (0-1) the GPU worker was busy: batches and "
                            "Dense Assist services (utilisation.parquet's gpu, over the run)"),
    ("cpu_utilisation", "", "share of the run the CPU engine was busy"),
    ("pcie_h2d_utilisation", "", "host-to-GPU bytes over what the profile's bandwidth moves in "
                                 "the run's time"),
    ("pcie_d2h_utilisation", "", "GPU-to-host bytes, likewise"),
    ("longest_cpu_stall_s", "s", "longest stretch with a CPU-resident request and no CPU "
                                 "token (NaN without CPU-resident requests)"),
    ("controls", "", "each control the policy ran with: {value, source}"),
    ("capacities", "", "gpu_kv_blocks, host_kv_blocks and block_size of the KV pools"),
    ("profile", "", "the profile's source and method (measured or roofline)"),
    ("engine", "", "the engines' counters; see the table below"),

    ("scenario_hash", "", "sha256 of the scenario file, the files it names and any --set"),
    ("provenance", "", "how the result was made; see the table below"),
]

ENGINE: list[Row] = [
    ("gpu_rounds", "rounds", "GPU rounds run"),
    ("migration_only_rounds", "rounds", "GPU rounds that only moved KV"),
    ("cpu_rounds", "rounds", "CPU rounds (DualPace) or CPU attention iterations (NEO)"),
    ("routes", "", "CPU rounds per route (Full-CPU, Split-Final, Fused-Assist)"),
    ("swap_outs", "requests", "requests swapped out to the host"),
    ("swap_ins", "requests", "requests swapped back in to HBM"),
    ("prefills_to_cpu", "requests", "requests prefilled on the GPU for CPU decode"),
    ("preemptions", "requests", "vLLM recompute preemptions"),
    ("pipelined_iterations", "iterations", "NEO iterations that ran two sub-batches"),
    ("assist_calls", "calls", "Dense Assists the GPU served for the CPU engine"),
    ("gpu_busy_s", "s", "time the GPU worker was busy (batches and assists)"),
    ("gpu_assist_s", "s", "of which Dense Assists"),
    ("cpu_busy_s", "s", "time the CPU engine was busy"),
    ("h2d_bytes", "bytes", "bytes copied host to GPU"),
    ("d2h_bytes", "bytes", "bytes copied GPU to host"),
    ("stage_mode", "", "whether the GPU ran stage by stage (so assists interleave)"),
    ("end_s", "s", "simulated time at the end of the run"),
]

# A real run's summary (`dualpace-hw run` and `serve`): the keys above but `engine`'s, with the
# utilisations from its utilisation.parquet (the runtime counts no PCIe bytes to price), and these.
REAL_SUMMARY: list[Row] = [
    ("real", "", "true: a run of the real runtime"),
    ("device", "", "the GPU engine's device (cuda, or cpu in the tests)"),
    ("cpu_tp", "ranks", "the CPU engine's tensor-parallel ranks"),
    ("gpu_tp", "ranks", "the GPU engine's tensor-parallel ranks"),
    ("host_read_bytes_per_s", "bytes/s",
     "the host's memory read bandwidth on the CPU engine's cores, measured before serving (as "
     "the profile's `provenance.host_read_bytes_per_s`; `validate` notes a difference)"),
    ("cpu_speed", "",
     "`run`, a policy with a CPU engine: its CPU speed check before (`start`) and after "
     "(`end`) serving, each the profiler's CPU pre-attention and decode attention timed at "
     "profile grid points on the engine's cores: `pre_attn` and `decode_attn` (median "
     "measured/profiled) and the `points`; null where skipped (`--no-cpu-check`, a roofline "
     "profile, a stopped run's end). `validate --cpu-speed run` prices the CPU stages at it"),
    ("partial", "", "`run`: true when the run was stopped before every request finished"),
    ("stopped_by", "", "`run`, a stopped run only: SIGINT, SIGTERM or the engine failure"),
    ("served", "", "`serve`: true (the arrivals were the clients'; rate is null)"),
    ("finished", "", "`serve`: requests by how they ended (stop, length, abort)"),
]

REAL_ENGINE: list[Row] = [
    ("gpu_rounds", "rounds", "GPU engine rounds (NEO: iterations)"),
    ("cpu_rounds", "rounds", "CPU engine rounds (DualPace)"),
    ("assist_calls", "calls", "Dense Assists the GPU engine served"),
    ("assist_wait_s", "s", "their waits, CPU-Ready to GPU-Running (stage boundaries)"),
    ("assist_service_s", "s", "their service, GPU-Running to GPU-Done"),
    ("assist_gpu_s", "s", "of which their own GPU work (CUDA events; 0 on the CPU)"),
    ("cpu_assist_s", "s", "the CPU engine's process waiting on its assists, end to end"),
    ("cpu_busy_s", "s", "time the CPU engine was busy"),
    ("gpu_busy_s", "s", "time the GPU engine was busy"),
    ("wall_s", "s", "the run's length on the engines' clock"),
    ("warm_up_s", "s", "warm-up before the clock started (graph captures, kernels)"),
    ("graphs_warmed", "graphs", "decode CUDA graphs captured in the warm-up"),
    ("chunked_buckets_warmed", "buckets",
     "token buckets of the chunked rounds' layer graphs captured in the warm-up"),
    ("graph_captures", "graphs", "decode CUDA graphs captured on first use, on the clock"),
    ("routes", "", "CPU rounds per route (Full-CPU, Split-Final, Fused-Assist)"),
    ("gc_collections", "collections", "the GPU engine's process's garbage collections while "
     "serving, per generation (full ones, the third, are skipped while serving)"),
    ("gc_pause_s", "s", "what those collections paused the process for, in all"),
    ("gc_longest_pause_s", "s", "the longest of them"),
    ("launch_s", "s", "NEO: the per-layer launch term its predictor decided with"),
    ("pipelined_iterations", "iterations", "NEO: iterations of two sub-batches"),
    ("swap_outs", "requests", "NEO: requests moved GPU to host"),
    ("swap_ins", "requests", "NEO: requests moved host to GPU"),
    ("prefills_to_cpu", "requests", "NEO: prompts computed on the GPU, their KV to the host"),
    ("cpu_decode_tokens", "tokens", "NEO: tokens decoded with CPU attention"),
    ("activations_to_host_bytes", "bytes", "NEO: CPU decodes' q, k, v, every layer"),
    ("activations_to_gpu_bytes", "bytes", "NEO: their attention outputs back"),
    ("swap_issue_s", "s", "NEO: time issuing swaps"),
    ("copies_wait_s", "s", "NEO: after the forward, until CPU prefills' pages landed"),
]

PROVENANCE: list[Row] = [
    ("package", "", "the distribution's name, dualpace"),
    ("version", "", "its version"),
    ("source_sha256", "", "sha256 of the simulator package's sources: with version, the key "
                          "a sweep's resume checks"),
    ("git_commit", "", "the commit of the checkout it ran from (null outside git)"),
    ("git_dirty", "", "whether that checkout had uncommitted changes to tracked files"),
    ("scenario_path", "", "the scenario file"),
    ("scenario", "", "the resolved scenario: every field after defaults, --set and the rate, "
                     "scheduler holding the resolved pools and controls"),
    ("profile", "", "the profile's source, sha256, model, box and its own provenance block"),
    ("trace", "", "path and sha256 of the trace file the workload replays (its path, or the "
                  "local copy of a registered trace); nulls for the default sampler"),
    ("requests_sha256", "", "sha256 of the request list (arrival, prompt, output length)"),
    ("seeds", "", "the seeds: workload (arrivals and sampled lengths)"),
]

SWEEP_JSON: list[Row] = [
    ("scenario", "", "the scenario file"),
    ("name", "", "the scenario's name"),
    ("scenario_hash", "", "as in summary.json"),
    ("hashed_files", "", "the files besides the scenario that the hash covers"),
    ("policies", "", "the policies swept"),
    ("rates", "req/s", "the offered rates"),
    ("targets", "", "the latency targets"),
    ("grid", "", "the grid keys and their values (with seeds, workload.seed)"),
    ("changes", "", "the --set changes, nested like the file"),
    ("code_version", "", "version and source_sha256 of the simulator that made it"),
    ("provenance", "", "the provenance of the first point's scenario"),
]

SWEEP_CSV: list[Row] = [
    ("policy", "", "the point's policy"),
    ("rate", "req/s", "the point's offered rate"),
    ("<grid key>", "", "one column per grid key (a dotted scenario key), and workload.seed "
                       "with seeds"),
    ("<summary metric>", "", "every number of the point's summary.json entry, named and in "
                             "the units of the table above, longest_cpu_stall_s included"),
]

SUSTAINABLE_CSV: list[Row] = [
    ("policy", "", "the policy"),
    ("<grid key>", "", "one column per grid key (not workload.seed)"),
    ("metric", "", "the target metric"),
    ("target", "", "its target, in the metric's unit"),
    ("rate", "req/s", "the sustainable rate: the interpolated crossing of the target, or "
                      "above_sweep / below_sweep"),
    ("rate_ci_low", "req/s", "with seeds: lower end of the 95% bootstrap interval (beyond the "
                             "sweep counts as its edge)"),
    ("rate_ci_high", "req/s", "with seeds: upper end"),
]

SWEEP_CI_CSV: list[Row] = [
    ("policy, rate, <grid key>", "", "the point, without its seed"),
    ("metric", "", "a column of sweep.csv"),
    ("mean", "", "its mean over the seeds"),
    ("ci_low", "", "lower end of the 95% percentile-bootstrap interval of the mean"),
    ("ci_high", "", "upper end"),
    ("n_seeds", "", "seeds with a value"),
]

CAPACITY_CSV: list[Row] = [
    ("policy", "", "the policy"),
    ("rate", "req/s", "the highest rate found to meet every target"),
    ("bound", "", "= (the answer is within tol above rate), >= (every target held at --high) "
                  "or < (a target failed at --low)"),
    ("upper", "req/s", "the lowest rate found to miss a target"),
    ("limited_by", "", "the targets missed at upper (or stalled)"),
    ("evaluations", "", "simulations the search ran"),
]

VALIDATION_CSV: list[Row] = [
    ("policy", "", "the policy"),
    ("metric", "", "a metric of summary.json"),
    ("simulated", "", "its value in the simulation, from the records"),
    ("real", "", "its value in the real run, from the records"),
    ("relative_error", "", "(simulated - real) / real"),
]

STATE: list[Row] = [
    ("policy", "", "the policy"),
    ("time_s", "s", "when the row's state began: it holds until the next row's time (a row "
                    "where a core call changed it; the last call of an instant wins)"),
    ("waiting", "requests", "arrived and not admitted: DualPace's and vLLM's GPU waiting "
                            "queue, NEO's waiting queue"),
    ("prefilling", "requests", "admitted, no token yet: DualPace's prefills under way, "
                               "vLLM's running requests without a token; 0 for NEO"),
    ("gpu_decoding", "requests", "decoding on the GPU: DualPace's GPU running set, vLLM's "
                                 "running requests with a token, NEO's GPU decoding queue"),
    ("cpu_waiting", "requests", "DualPace's CPU waiting queue (migrations to the host in "
                                "flight included); 0 for the others"),
    ("cpu_decoding", "requests", "decoding on the CPU: DualPace's CPU running batch, NEO's "
                                 "CPU decoding queue; 0 for vLLM"),
    ("hbm_kv_blocks", "blocks", "HBM KV pool blocks in use (at most the pool)"),
    ("host_kv_blocks", "blocks", "host KV pool blocks in use"),
    ("host_kv_growth_blocks", "blocks", "DualPace: the growth the host envelope reserves, "
                                        "B_growth of every host-bound request (b-hat - b); "
                                        "0 for the others"),
    ("host_kv_migration_blocks", "blocks", "DualPace: B_migration, the host room reserved "
                                           "for swap-outs; used + growth + migration never "
                                           "exceeds the pool (Eq. 2)"),
]

UTILISATION: list[Row] = [
    ("policy", "", "the policy"),
    ("start_s", "s", f"start of the bin (the run is cut into {UTILISATION_BINS} equal bins)"),
    ("end_s", "s", "end of the bin"),
    ("gpu", "", "share (0-1) of the bin the GPU worked: batches and Dense Assist services "
                "(a real run: forwards and assists as timed on the host)"),
    ("cpu", "", "share the CPU engine worked: its rounds (NEO: each iteration's CPU "
                "attention time, from the start of its layers)"),
    ("pcie_h2d", "", "share the host-to-GPU direction moved data: swap-ins and assist or NEO "
                     "activations at the profile's bandwidth (a real run: swap-ins as the "
                     "engine waited on them)"),
    ("pcie_d2h", "", "share the GPU-to-host direction moved data: swap-outs, Prefill-to-CPU "
                     "layer copies, activations (a real run: swap-outs)"),
]

TRACE_TRACKS: list[Row] = [
    ("GPU engine", "slices", "GPU rounds: forwards, migration waits"),
    ("Dense Assist", "slices", "assists the GPU worker serves for the CPU engine"),
    ("CPU engine", "slices", "CPU rounds (DualPace) or CPU attention (NEO), and CPU waits"),
    ("PCIe H2D", "slices", "host to GPU copies: swap-ins"),
    ("PCIe D2H", "slices", "GPU to host copies: swap-outs, Prefill-to-CPU layer copies"),
    ("migration", "arrows", "flow from a transfer to the round that next computes the request"),
    ("requests", "counter", "the queue columns of state.parquet (waiting, prefilling, "
                            "gpu_decoding, cpu_waiting, cpu_decoding), a sample per row"),
    ("KV blocks", "counter", "its KV columns (hbm_kv_blocks, host_kv_blocks, "
                             "host_kv_growth_blocks, host_kv_migration_blocks)"),
    ("utilisation", "counter", "utilisation.parquet's gpu, cpu, pcie_h2d and pcie_d2h at the "
                               "start of each bin, 0 at the end"),
]


def pattern(name: str) -> re.Pattern[str]:
    """A documented name as a regular expression over real names (families expanded)."""
    text = re.escape(name)
    text = text.replace(re.escape("<latency>"), "(ttft|tpot|itl|e2el)")
    text = text.replace(re.escape("<P>"), r"[0-9]+(\.[0-9]+)?")
    return re.compile(f"^{text}$")


def documented(name: str, rows: list[Row]) -> bool:
    return any(pattern(row[0]).match(name) for row in rows)
