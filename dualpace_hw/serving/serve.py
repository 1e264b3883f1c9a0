"""`dualpace-hw run`: replay a scenario's workload against the real runtime and write what
`dualpace-sim run` writes (requests.parquet, summary.json, timeline), so the simulator's
metrics, plots and `dualpace-sim validate` read both."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from dualpace_hw.executors.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from dualpace_hw.executors.model import ModelWeights
from dualpace_hw.executors.tp import shard_shape
from dualpace_hw.kernels.host_read import host_read_bytes_per_s
from dualpace_hw.runtime.engines import EngineFailure
from dualpace_hw.runtime.gpu_engine import GpuEngine
from dualpace_hw.runtime.processes import as_cpu_engine, cores_off, engine_cores, on_cores
from dualpace_sim.config.scenario import LoadedScenario
from dualpace_sim.core.journal import JOURNAL_FILE
from dualpace_sim.core.policies import POLICIES, policy_named, resolve
from dualpace_sim.costs.profile import Profile
from dualpace_sim.costs.shapes import ModelShape
from dualpace_sim.plots.runs import plot_timeline
from dualpace_sim.results.node_series import (
    NodeSeries,
    busy_shares,
    read_series,
    record_series_counters,
    write_series,
)
from dualpace_sim.results.outputs import write_json
from dualpace_sim.results.provenance import RUN_PROFILE, parquet_metadata, provenance, scenario_hash
from dualpace_sim.results.records import read_records, records_frame, write_records
from dualpace_sim.results.summary import policy_summary, stamp
from dualpace_sim.results.trace_events import TraceRecorder, write_trace

SERVED_POLICIES = tuple(p.name for p in POLICIES.values() if p.served)  # `dualpace-hw serve`


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a `timeout`, a scheduler's kill) stops the run as Ctrl-C does, so what ran is
    written before the process exits rather than lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def build_runtime(loaded: LoadedScenario, policy: str, device: str, cpu_cores: int | None,
                  seed: int = 0, cpu_tp: int = 1, dtype: torch.dtype = torch.bfloat16,
                  gpu_tp: int = 1, checkpoint: Checkpoint | None = None, specs=None):
    """Models with identical weights on the GPU and the CPU, pools sized like the scenario's.
    The weights are seeded random, or the `checkpoint`'s; the requests are the scenario's
    workload, or `specs` (none: a server submits them).
    For DualPace this starts the CPU engine's process; the runtime stops it when it is done.
    NEO decides with its tables over the scenario's profile (as the simulator's NEO does) and
    runs its CPU attention on `cpu_cores` threads of the GPU engine's process.
    With `gpu_tp` > 1 the GPU engine is that many ranks (one GPU each; processes on the CPU
    device, for tests), each holding its heads of the scenario's HBM pool.
    `dtype` is the weights' and the KV pools' (float32 lets tests compare tokens exactly)."""
    shape, config = loaded.profile.model, loaded.policy_config(policy)
    if checkpoint is not None:
        shape = checkpoint.shape
    if device.startswith("cuda") and gpu_tp > 1:
        device = "cuda:0"
    if checkpoint is None:
        weights = ModelWeights.random(shape, seed=seed, device=device, dtype=dtype)
    else:
        weights = checkpoint.weights(device, dtype)
    specs = loaded.requests if specs is None else specs
    gpu = GpuEngine(shape, weights, config.gpu_kv_blocks, config.block_size, dtype, gpu_tp)
    runtime = resolve(policy_named(policy).runtime)
    return runtime.for_run(specs, config, gpu, loaded.cost, engine_cores(cpu_cores), cpu_tp)


def open_checkpoint(path: Path, loaded: LoadedScenario) -> Checkpoint:
    """The checkpoint at `path`, refused (naming the flag and the fields) unless its shape is
    the scenario's model: the profile's costs and pool sizes are for that model."""
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as e:
        raise ValueError(f"--checkpoint {path}: {e}") from None
    differ = checkpoint.matches(loaded.profile.model)
    if differ:
        raise ValueError(f"--checkpoint {path}: its config.json is not the model of "
                         f"{loaded.path}'s profile ({'; '.join(differ)}); profile the checkpoint "
                         f"(dualpace-hw profile --checkpoint {path}) or use a roofline with "
                         f"model: {path / 'config.json'}")
    return checkpoint


def record_policy(out: Path, loaded: LoadedScenario, policy: str, runtime, requests,
                  rate: float | None, **run) -> tuple[pd.DataFrame, dict, NodeSeries]:
    """A finished run of `policy`: its journal written, its records, its summary (`run`:
    how it ran, e.g. device and tensor parallelism) and its series over time (also drawn on
    its timeline trace, when it has one)."""
    runtime.journal.write(out / JOURNAL_FILE.format(policy=policy))
    runtime.write_extras(out)  # DualPace: each Dense Assist and each CPU step
    frame = records_frame(requests, policy)
    series = runtime.series()
    if runtime.trace is not None:
        record_series_counters(runtime.trace, series)
    # The simulator's summary shape (`policy_summary`), with the real run's own counters; a
    # served run's arrivals are the clients' (rate None).
    summary = {**policy_summary(loaded, policy, frame), "rate": rate, **busy_shares(series),
               "real": True, **run, "engine": asdict(runtime.stats)}
    return frame, summary, series


def write_results(out: Path, frames: dict[str, pd.DataFrame], summaries: list[dict],
                  series: dict[str, NodeSeries], record: dict) -> None:
    """The records, series and summaries so far (the Parquet files with the provenance
    `record` as their metadata), each file replaced atomically (`dualpace_sim.results.outputs`): an
    interruption while a later policy writes keeps the earlier ones'."""
    metadata = parquet_metadata(record)
    write_records(pd.concat(frames.values(), ignore_index=True), out / "requests.parquet",
                  metadata)
    write_series(series, out, metadata)
    write_json(out / "summary.json", summaries)


def earlier_policies(out: Path, digest: str, policies: list[str]
                     ) -> tuple[dict[str, pd.DataFrame], list[dict], dict[str, NodeSeries]]:
    """The records, summaries and series `out` already holds of this scenario's other
    policies, to keep beside this run's: `run --policy` runs one policy at a time into one
    folder (a box's time limit splits them), and writing only the last would lose the others.
    Another scenario's run there (or an edited scenario's) is refused rather than mixed in."""
    path = out / "summary.json"
    if not path.is_file():
        return {}, [], {}
    try:
        earlier = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not readable ({e}); give a new --out") from None
    kept = [s for s in earlier if isinstance(s, dict) and s.get("policy") not in policies]
    if not kept:
        return {}, [], {}  # this run replaces all it holds
    names = [s["policy"] for s in kept]
    if any(s.get("scenario_hash") != digest for s in kept):
        raise ValueError(f"--out {out}: holds {', '.join(names)} of another scenario (or of "
                         "this one before an edit); give a new --out")
    try:
        records = read_records(out / "requests.parquet")
    except OSError as e:  # pyarrow's: a missing or truncated file
        raise ValueError(f"{out / 'requests.parquet'}: {', '.join(names)} have a summary but "
                         f"no readable records ({e}); give a new --out") from None
    frames = {p: records[records["policy"] == p].reset_index(drop=True) for p in names}
    series = {p: s for p, s in read_series(out).items() if p in names}
    return frames, kept, series


def host_read_on(cores: list[int] | None) -> float:
    """The host's memory read bandwidth on the CPU engine's cores (all of the process's where
    it has none), bytes/s, measured before anything is served: each run's summary records it
    beside the profile's, which another machine of the same kind may have measured
    (`dualpace-sim validate` notes a difference)."""
    with on_cores(cores):
        return host_read_bytes_per_s()


# (profile, the device that draws the check's weights) -> the check's record: the profiler's
# `cpu_speed_check`, which `dualpace-hw run` hands in (the profiler is a layer above this one).
SpeedCheck = Callable[[Profile, str], dict | None]


def cpu_speed_on(check: SpeedCheck | None, loaded: LoadedScenario, policy: str,
                 cores: list[int] | None, device: str, cpu_tp: int) -> dict | None:
    """The CPU engine's speed against the profile's CPU tables, timed by `check` in a process
    with the CPU engine's cores and thread placement (`as_cpu_engine`) where `policy` runs
    stages on the host: before it serves and after. None
    without a check, for a GPU-only policy, under CPU tensor parallelism (the tables are
    then a rank's shard) and for a roofline profile (no host measured to compare with)."""
    if check is None or cpu_tp != 1 or not resolve(policy_named(policy).runtime).uses_cpu_tier:
        return None
    return as_cpu_engine(check, (loaded.profile, "cuda" if device.startswith("cuda") else "cpu"),
                         cores, "dualpace-cpu-speed-check")


def check_split(shape: ModelShape, device: str, cpu_tp: int, gpu_tp: int) -> None:
    """Refuse a tensor-parallel split the model or the box cannot take, before anything
    starts, naming the flag."""
    for flag, n in (("--cpu-tp", cpu_tp), ("--gpu-tp", gpu_tp)):
        if n > 1:
            try:
                shard_shape(shape, n)
            except ValueError as e:
                raise ValueError(f"{flag} {n}: {e}; choose a divisor of the head counts") \
                    from None
    if device.startswith("cuda") and gpu_tp > torch.cuda.device_count():
        raise ValueError(f"--gpu-tp {gpu_tp}: this box has {torch.cuda.device_count()} GPU(s)")


def stop_reason(e: BaseException) -> str:
    """How a run that did not finish was stopped, for its summary."""
    if isinstance(e, KeyboardInterrupt):
        return f"interrupted ({e.args[0] if e.args else 'SIGINT'})"
    return str(e)


def run_real(loaded: LoadedScenario, out: Path, device: str = "cuda",
             cpu_cores: int | None = None, trace_events: Path | None = None,
             cpu_tp: int = 1, gpu_tp: int = 1, policies: list[str] | None = None,
             checkpoint: Checkpoint | None = None,
             speed_check: SpeedCheck | None = None) -> list[dict]:
    """Run every policy the runtime has for real, or those of `policies` in that order (the
    scenario's by default); write results after each one (and the timeline trace, one process
    per policy, when `trace_events` names a file). With `speed_check`, each policy with a CPU
    engine has its cores' speed against the profile checked before and after it serves (its
    summary's `cpu_speed`). A policy stopped by SIGINT, SIGTERM or an
    engine failure still writes what it did (every request's tokens so far, its journal) with
    `"partial": true` and `stopped_by` in its summary, and the stop is raised again. The
    policies share the process: one run second finds the kernels the first compiled, so the
    order can matter to a comparison. What `out` holds of the scenario's other policies is kept
    (`earlier_policies`), so policies run one call at a time land in one folder."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("no CUDA device: run on a GPU box, or pass --device cpu (tests)")
    check_split(loaded.profile.model, device, cpu_tp, gpu_tp)
    if policies:
        unknown = [p for p in policies if p not in loaded.spec.policies]
        if unknown:
            raise ValueError(f"--policy {', '.join(unknown)}: not in the scenario's policies "
                             f"({', '.join(loaded.spec.policies)}); name some of those")
    out.mkdir(parents=True, exist_ok=True)
    loaded.profile.save(out / RUN_PROFILE)  # what `dualpace-sim validate` compares it with
    record, digest = provenance(loaded), scenario_hash(loaded.path)
    read = host_read_on(engine_cores(cpu_cores))
    policies = policies or loaded.spec.policies
    frames, summaries, series = earlier_policies(out, digest, policies)
    traces: list[TraceRecorder] = []
    for policy in policies:
        start = cpu_speed_on(speed_check, loaded, policy, engine_cores(cpu_cores), device,
                             cpu_tp)
        runtime = build_runtime(loaded, policy, device, cpu_cores, cpu_tp=cpu_tp, gpu_tp=gpu_tp,
                                checkpoint=checkpoint)
        engines = runtime.describe_engines()
        if engines is not None:
            print(f"{policy}: {engines}", flush=True)
        if gpu_tp > 1:
            print(f"{policy}: GPU engine on {gpu_tp} tensor-parallel ranks (rank 0 here, ranks "
                  f"1.. in processes {runtime.gpu.peers.pids})", flush=True)
        if trace_events is not None:
            runtime.trace = TraceRecorder(f"{loaded.spec.name}: {policy} (real)")
            traces.append(runtime.trace)
        stopped: BaseException | None = None
        try:
            with sigterm_as_interrupt():
                runtime.serve()
        except (KeyboardInterrupt, EngineFailure) as e:
            stopped = e  # what ran is written below, then the stop goes on to the caller
        frames[policy], summary, series[policy] = record_policy(
            out, loaded, policy, runtime, runtime.requests, loaded.spec.workload.rate,
            device=device, cpu_tp=cpu_tp, gpu_tp=gpu_tp, host_read_bytes_per_s=read,
            partial=stopped is not None,
            **({"stopped_by": stop_reason(stopped)} if stopped is not None else {}),
            **({"cpu_speed": {"start": start}} if start is not None else {}))
        summaries.append(stamp(summary, digest, record))
        write_results(out, frames, summaries, series, record)
        if start is not None and stopped is None:  # after the results: a stop here loses none
            del runtime
            summaries[-1]["cpu_speed"]["end"] = cpu_speed_on(
                speed_check, loaded, policy, engine_cores(cpu_cores), device, cpu_tp)
            write_json(out / "summary.json", summaries)
        if trace_events is not None:
            write_trace(trace_events, traces)
        if stopped is not None:
            raise stopped
    if frames:
        plot_timeline(frames, out / "timeline")
    return summaries


SERVED_ARRIVALS, SERVED_SCENARIO = "arrivals.csv", "served.yaml"


def served_scenario(scenario: Path, out: Path, requests, policy: str) -> Path:
    """`scenario` with the workload a server saw: every request's arrival, prompt length and
    tokens generated (a Vidur-format trace beside it, replayed at its own timestamps), so
    `dualpace-sim validate OUT/served.yaml --real OUT` compares the served run with the
    simulator fed the same arrivals. Its profile is the one the run used (OUT/profile.yaml,
    named relatively, so the folder validates wherever it is moved); without that file, paths
    the scenario names are made absolute."""
    import yaml

    from dualpace_sim.workload.traces import VIDUR_ARRIVAL, VIDUR_OUTPUT, VIDUR_PROMPT

    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(requests, key=lambda r: r.req_id)
    pd.DataFrame({VIDUR_ARRIVAL: [r.arrival_s for r in rows],
                  VIDUR_PROMPT: [r.prompt_tokens for r in rows],
                  VIDUR_OUTPUT: [r.max_tokens for r in rows]}).to_csv(out / SERVED_ARRIVALS,
                                                                     index=False)
    spec = yaml.safe_load(scenario.read_text())
    base = scenario.resolve().parent

    def absolute(value: str) -> str:
        return str(base / value) if (base / value).exists() else value

    if (out / RUN_PROFILE).is_file():  # the profile the run used, so the folder moves whole
        spec.pop("roofline", None)
        spec["profile"] = RUN_PROFILE
    else:
        if isinstance(spec.get("profile"), str):
            spec["profile"] = absolute(spec["profile"])
        for key in ("hardware", "model"):
            if isinstance(spec.get("roofline", {}).get(key), str):
                spec["roofline"][key] = absolute(spec["roofline"][key])
    spec["policies"] = [policy]
    spec["workload"] = {"source": "vidur", "path": SERVED_ARRIVALS, "arrival": "trace",
                        "num_requests": len(rows)}
    path = out / SERVED_SCENARIO
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def check_port(host: str, port: int) -> None:
    """Refuse a port that cannot be bound before the runtime starts (minutes on a big model)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({e.strerror}); "
                             "choose another port") from None


def serve_real(loaded: LoadedScenario, checkpoint_path: Path, out: Path, policy: str,
               host: str, port: int, device: str = "cuda", cpu_cores: int | None = None,
               cpu_tp: int = 1, dtype: torch.dtype = torch.bfloat16,
               model_name: str | None = None, default_max_tokens: int = 256) -> dict | None:
    """`dualpace-hw serve`: the runtime over the checkpoint, behind the OpenAI-compatible
    HTTP server until SIGTERM; then the served run's results in `out` as `run` writes them,
    with `served.yaml`, the scenario of the arrivals the server saw, for `validate`.
    Returns the summary (None when no request came)."""
    from dualpace_hw.serving.http_server import create_app, run_server
    from dualpace_hw.serving.service import EngineService

    if policy not in SERVED_POLICIES:
        raise ValueError(f"--policy {policy}: the real runtime serves "
                         f"{' or '.join(SERVED_POLICIES)}")
    if policy not in loaded.spec.policies:
        raise ValueError(f"--policy {policy}: not in {loaded.path}'s policies "
                         f"({', '.join(loaded.spec.policies)}); add it there")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("no CUDA device: run on a GPU box, or pass --device cpu (tests)")
    check_split(loaded.profile.model, device, cpu_tp, 1)
    checkpoint = open_checkpoint(checkpoint_path, loaded)
    check_port(host, port)
    config = loaded.policy_config(policy)
    max_context = config.max_request_blocks * config.block_size  # its finish-peak must fit
    out.mkdir(parents=True, exist_ok=True)
    loaded.profile.save(out / RUN_PROFILE)
    read = host_read_on(engine_cores(cpu_cores))
    runtime = build_runtime(loaded, policy, device, cpu_cores, cpu_tp=cpu_tp, dtype=dtype,
                            checkpoint=checkpoint, specs=[])
    svc = EngineService(runtime, checkpoint.tokenizer, checkpoint.eos_ids,
                        min(config.gpu_kv_blocks, 256), max_context)
    name = model_name or checkpoint.path.name
    engines = runtime.describe_engines()
    engine = f" ({engines})" if engines is not None else ""
    # The HTTP loop and the token pump keep off the CPU engine's cores, as the GPU engine's
    # thread does: a thread on one of them stalls the engine's OpenMP team at every step.
    with on_cores(cores_off(engine_cores(cpu_cores))):
        svc.start()
        print(f"serving {name} with {policy}{engine} on http://{host}:{port}/v1", flush=True)
        try:
            run_server(svc, create_app(svc, name, max_context, checkpoint.shape.vocab_size,
                                            default_max_tokens), host, port)
        finally:
            requests = svc.close()
    if svc.failure is not None:
        raise svc.failure
    if not requests:
        print("no requests were served: nothing written but the profile", flush=True)
        return None
    frame, summary, series = record_policy(out, loaded, policy, runtime, requests, None,
                                           device=device, cpu_tp=cpu_tp, gpu_tp=1,
                                           host_read_bytes_per_s=read, served=True,
                                           finished=dict(svc.finished))
    record = provenance(loaded)
    summary = stamp(summary, scenario_hash(loaded.path), record)
    write_results(out, {policy: frame}, [summary], {policy: series}, record)
    served_scenario(loaded.path, out, requests, policy)
    plot_timeline({policy: frame}, out / "timeline")
    return summary
