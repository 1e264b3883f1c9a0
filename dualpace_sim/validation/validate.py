"""`dualpace-sim validate`: the simulator checked against a real run of the same scenario.

A real run directory (what ``dualpace-hw run SCENARIO --out DIR`` writes, the same files as
``dualpace-sim run``: ``requests.parquet`` and ``summary.json``) is compared with a simulation
of the same scenario (same workload, seed, rate and calibration profile) for each policy the
real run has. Both sides' metrics are computed from their per-request records by the same
:func:`dualpace_sim.results.metrics.summarize`, so a difference is the simulator's, never a
difference
in metric definitions; ``summary.json`` gives the policies and is checked against the records.

Outputs, under OUTDIR (default ``DIR/validation``):

* ``validation.csv`` — one row per (policy, metric): simulated, real and the relative error
  (simulated − real) / real;
* ``sim/requests.parquet`` and ``sim/summary.json`` — the simulated run, as ``dualpace-sim run``
  writes it (``dualpace-sim plot OUTDIR/sim`` draws it);
* ``replay.txt`` — where the real run left its journals (``journal-POLICY.jsonl``), the replay
  check of :mod:`dualpace_sim.results.replay`: the runtime's decisions reproduced by the core,
  or not;
* ``timeline_overlay`` and ``latency_cdf_overlay`` (PNG and PDF) — cumulative generated and
  CPU-decoded tokens, and TTFT / ITL CDFs, real solid vs simulated dashed, per policy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from dualpace_sim.config.scenario import LoadedScenario, load_scenario
from dualpace_sim.core.journal import JournalError
from dualpace_sim.costs.cpu_speed import CpuSpeedError, at_cpu_speed, cpu_speed
from dualpace_sim.costs.profile import Controls, Profile, load_profile
from dualpace_sim.experiments.runner import simulate
from dualpace_sim.plots.runs import plot_latency_cdf_overlay, plot_timeline_overlay
from dualpace_sim.results.metrics import summarize
from dualpace_sim.results.outputs import write_json
from dualpace_sim.results.provenance import RUN_PROFILE, parquet_metadata, provenance, scenario_hash
from dualpace_sim.results.records import read_records, write_records
from dualpace_sim.results.replay import ReplayReport, replay_run
from dualpace_sim.results.served_rounds import (
    STALL_RATIO,
    STALL_S,
    NotGpuPlans,
    served_rounds,
    stalls,
)
from dualpace_sim.results.summary import stamp

METRICS = (
    "normalized_latency_s",
    "mean_ttft_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "p99_itl_s",
    "p99_tpot_s",
    "throughput_tok_s",
    "cpu_token_fraction",
    "makespan_s",
)
COLUMNS = ("policy", "metric", "simulated", "real", "relative_error")


# A summary.json value further than this (relative) from what its own records give is reported.
SUMMARY_RTOL = 1e-6
# A run served on a host whose read bandwidth is further than this (relative) from the profile's
# is noted: the CPU engine's memory-bound stages run that much off their tables.
HOST_READ_RTOL = 0.05


class ValidateError(ValueError):
    """Inputs that cannot be validated; the message is one line naming the file and the fix."""


@dataclass
class RealRun:
    """A real (or any ``run``-format) result directory, split by policy in the run's order."""

    path: Path
    summaries: dict[str, dict]
    frames: dict[str, pd.DataFrame]


@dataclass
class ValidationResult:
    """What :func:`validate` computed and wrote."""

    table: pd.DataFrame  # columns COLUMNS, rows in (policy, METRICS) order
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # warnings and facts worth printing
    replays: list[ReplayReport] = field(default_factory=list)  # the replay check, per journal


def read_real_run(path: Path | str) -> RealRun:
    """Read DIR/summary.json and DIR/requests.parquet; ValidateError (one line) if either is
    missing or unreadable, or if they disagree on the policies run."""
    path = Path(path)
    if not path.is_dir():
        raise ValidateError(f"{path}: no such directory; give the --out directory of "
                            "`dualpace-hw run` (or `dualpace-sim run`)")
    summary_path, records_path = path / "summary.json", path / "requests.parquet"
    for f in (summary_path, records_path):
        if not f.is_file():
            raise ValidateError(f"{path}: no {f.name}; give the --out directory of "
                                "`dualpace-hw run` (it writes requests.parquet and summary.json)")
    try:
        raw = json.loads(summary_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValidateError(f"{summary_path}: not valid JSON ({e})") from None
    if (not isinstance(raw, list) or not raw
            or not all(isinstance(s, dict) and isinstance(s.get("policy"), str) for s in raw)):
        raise ValidateError(f"{summary_path}: expected a non-empty JSON list of objects with a "
                            "'policy', as `dualpace-sim run` writes")
    summaries: dict[str, dict] = {}
    for s in raw:
        if s["policy"] in summaries:
            raise ValidateError(f"{summary_path}: policy {s['policy']!r} appears twice")
        summaries[s["policy"]] = s
    try:
        records = read_records(records_path)
    except (ValueError, OSError, pa.ArrowException) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValidateError(first if str(records_path) in first
                            else f"{records_path}: {first}") from None
    frames = {str(p): df.reset_index(drop=True)
              for p, df in records.groupby("policy", sort=False)}
    for policy in summaries:
        if policy not in frames:
            raise ValidateError(f"{path}: summary.json has policy {policy!r} but "
                                f"requests.parquet has no rows for it")
    for policy in frames:
        if policy not in summaries:
            raise ValidateError(f"{path}: requests.parquet has rows of policy {policy!r} but "
                                f"summary.json does not list it")
    return RealRun(path, summaries, {p: frames[p] for p in summaries})


def load_for_real_run(scenario: Path | str, real_dir: Path, costs: Path | None = None
                      ) -> tuple[LoadedScenario, list[str]]:
    """The scenario with the calibration profile the real run was made with (REAL/profile.yaml,
    which `dualpace-hw run` writes): its controls decided the run's scheduling, so a box
    re-profiled since must not change what the run is compared with, nor break its replay.
    Runs without that file get the scenario's profile. A note says when the profile that
    prices the run is a quick one (its errors would be the quick grids', not the simulator's).

    With `costs`, another profile of the same box and model prices the run (a re-profile,
    to see whether it is nearer serving) while the run's own controls still make the decisions."""
    recorded = real_dir / RUN_PROFILE
    current = load_scenario(scenario)
    profile, notes = current.profile, []
    if recorded.is_file():
        profile = _read_profile(recorded, "the profile `dualpace-hw run` recorded for this run; "
                                          "delete it to compare with the scenario's profile")
        if profile != current.profile:
            notes.append(f"the scenario's calibration profile has changed since this run; "
                         f"compared with the profile the run used ({recorded})")
    if costs is not None:
        priced = _read_profile(costs, "the --costs profile; give a profile file "
                                      "`dualpace-hw profile` wrote")
        for what, mine, theirs in (
                ("model", priced.model.name, profile.model.name),
                ("block size", priced.block_size, profile.block_size),
                ("GPU tensor parallelism", priced.box.tensor_parallel,
                 profile.box.tensor_parallel),
                ("CPU tensor parallelism", priced.box.cpu_tensor_parallel,
                 profile.box.cpu_tensor_parallel)):
            if mine != theirs:
                raise ValidateError(f"{costs}: {what} {mine} but the run's profile has "
                                    f"{theirs}; --costs must profile the run's model and split")
        # The run's controls as its scheduler had them (stored, or fitted from its profile).
        ran = current if profile == current.profile else load_scenario(scenario, profile=profile)
        kept = Controls(**{name: choice.value for name, choice in ran.controls.items()})
        notes = [f"costs from {costs}; scheduler controls from the profile the run used"]
        profile = priced.model_copy(update={"controls": kept})
    if profile.provenance.is_quick():
        source = costs or (recorded if recorded.is_file() else current.profile_source)
        notes.append(f"note: {source} is a quick profile (`dualpace-hw profile --quick`: tiny "
                     "grids, few repeats, for tests): its costs are coarse, so the errors say "
                     "little about the simulator; re-profile the box without --quick")
    if profile == current.profile:
        return current, notes
    return load_scenario(scenario, profile=profile), notes


def _read_profile(path: Path, what: str) -> Profile:
    try:
        return load_profile(path)
    except (ValueError, OSError) as e:
        first = str(e).splitlines()[0]
        raise ValidateError(f"{first if str(path) in first else f'{path}: {first}'} "
                            f"({what})") from None


def check_against_scenario(real: RealRun, loaded: LoadedScenario) -> list[str]:
    """ValidateError if the real run is not a run of this scenario (a policy it does not list,
    another rate, other requests); returns notes on smaller differences (arrival jitter, a
    summary.json value its own records do not give)."""
    spec, scenario = loaded.spec, loaded.path
    listed = ", ".join(spec.policies)
    for policy in real.summaries:
        if policy not in spec.policies:
            raise ValidateError(f"{real.path}: ran policy {policy!r}, which {scenario} does not "
                                f"list (policies: {listed}); validate against the scenario the "
                                f"run used")
    rate = spec.workload.rate
    notes = [f"note: {scenario} also lists {policy}, which {real.path} did not run; left out"
             for policy in spec.policies if policy not in real.summaries]
    for policy, summary in real.summaries.items():
        real_rate = summary.get("rate")
        if (isinstance(real_rate, int | float) and isinstance(rate, int | float)
                and not math.isclose(real_rate, rate, rel_tol=1e-9)):
            raise ValidateError(f"{real.path}: {policy} ran at {real_rate:g} req/s but {scenario} "
                                f"offers {rate:g} req/s; validate against the scenario the run "
                                f"used")
        ranks, profiled = summary.get("cpu_tp"), loaded.profile.box.cpu_tensor_parallel
        if policy == "dualpace" and isinstance(ranks, int) and ranks != profiled:
            notes.append(f"note: {real.path} ran the CPU engine as {ranks} tensor-parallel "
                         f"rank(s), the profile describes {profiled}; its CPU costs are another "
                         f"engine's (profile the box with the same split)")
        gpu_ranks, gpu_profiled = summary.get("gpu_tp", 1), loaded.profile.box.tensor_parallel
        if isinstance(gpu_ranks, int) and gpu_ranks != gpu_profiled:
            notes.append(f"note: {real.path} ran {policy}'s GPU engine on {gpu_ranks} "
                         f"tensor-parallel GPU(s), the profile describes {gpu_profiled}; its GPU "
                         f"costs are another engine's (profile with --gpu-tp {gpu_ranks})")
        if summary.get("partial"):
            notes.append(f"note: {real.path}: {policy} is a partial run "
                         f"({summary.get('stopped_by', 'stopped')}): "
                         f"{summary.get('completed')} of {summary.get('submitted')} requests "
                         "finished; the simulator serves the whole workload, so the figures "
                         "compare a truncated run")
        name = summary.get("scenario")
        if isinstance(name, str) and name != spec.name:
            notes.append(f"note: {real.path} is named {name!r}, the scenario {spec.name!r}")
        notes += _check_requests(real.path, policy, real.frames[policy], loaded)
        notes += _check_summary(policy, summary, real.frames[policy])
    return notes


def host_read_notes(real: RealRun, profile: Profile) -> list[str]:
    """A note for each host read bandwidth the run's policies were served at (each
    `dualpace-hw run` call measures its own machine) more than HOST_READ_RTOL off the one
    `profile` (the costs that price the run) was measured at. Two machines of one kind can
    differ there by 20 %, and the CPU engine's memory-bound stages follow it, while its
    compute-bound ones do not. Nothing where either figure is missing (older runs, profiles),
    nor for a policy whose run checked its CPU engine's speed (`cpu_speed`): the check times the
    stages themselves, and on the H200 box it found them at 1.04x their tables where this probe
    read 58 GB/s against the profile's 126 (docs/validation/README.md, session 23)."""
    profiled = profile.provenance.host_read_bytes_per_s
    if profiled is None:
        return []
    served: dict[float, list[str]] = {}
    for policy, summary in real.summaries.items():
        if any((summary.get("cpu_speed") or {}).values()):
            continue
        value = summary.get("host_read_bytes_per_s")
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            served.setdefault(float(value), []).append(policy)
    notes = []
    for value, policies in served.items():
        diff = value / profiled - 1
        if abs(diff) <= HOST_READ_RTOL:
            continue
        notes.append(
            f"note: {real.path}: {', '.join(policies)} served on a host reading memory at "
            f"{value / 1e9:.1f} GB/s, {abs(diff):.0%} {'less' if diff < 0 else 'more'} than "
            f"the {profiled / 1e9:.1f} GB/s of the profile's host: the CPU engine's "
            "memory-bound stages (pre-attention at a few rows, decode attention at large "
            f"batches) ran about {profiled / value:.2f}x their tables' times there "
            f"({'slower' if diff < 0 else 'faster'}), its compute-bound ones as tabled; "
            "re-profile on the serving machine, or profile and serve in the same session")
    return notes


def stall_notes(real: RealRun, loaded: LoadedScenario, replays: list[ReplayReport]
                ) -> list[str]:
    """A note for each policy whose real GPU engine stalled (`served_rounds.stalls`): a pause
    of the engine's process that no cost prices (on the H200 box, full garbage collections
    before the runtime skipped them while serving, docs/validation/README.md, session 24),
    which the simulator does not have and which moves the run's P99s. Only journals whose
    plans the replay made again (`replays`) are priced, and policies whose GPU plans are not
    GpuPlans (NEO's iterations) are passed over."""
    notes = []
    for policy in (r.policy for r in replays if r.plans_match):
        try:
            found = stalls(served_rounds(loaded, real.path, policy))
        except NotGpuPlans:
            continue
        if found:
            worst = max(found, key=lambda r: r.real_s)
            notes.append(
                f"note: {policy}'s real GPU engine stalled in {len(found)} round(s) (over "
                f"{STALL_S:g} s and {STALL_RATIO:g}x the model; the longest {worst.real_s:.2f} s "
                f"at {worst.start_s:.1f} s into the run, priced {worst.model_s * 1e3:.1f} ms): "
                "pauses of the engine's process that the simulator does not have; requests "
                "arriving in one wait it out, so the run's P99s carry them")
    return notes


def at_run_cpu_speed(scenario: Path | str, loaded: LoadedScenario, real: RealRun, policy: str
                     ) -> tuple[LoadedScenario, list[str]]:
    """`loaded` with the CPU engine's stages priced at the speed `policy`'s run measured its
    host at (`cpu_speed` in its summary: `dualpace_sim.costs.cpu_speed`), and a note saying
    so; `loaded` itself where the run has no such record (older runs, GPU-only policies)."""
    record = real.summaries[policy].get("cpu_speed")
    if record is None:
        return loaded, []
    where = f"{real.path / 'summary.json'}: {policy}: cpu_speed"
    try:
        speed = cpu_speed(record, loaded.profile, where)
    except CpuSpeedError as e:
        raise ValidateError(f"{e}; delete the record to price the run as profiled") from None
    if speed is None:
        return loaded, []
    note = (f"note: {policy}'s run timed its CPU engine's cores at {speed.line()}, checked "
            "before and after it served; the simulation prices its CPU stages at that speed "
            "(--cpu-speed profile: as profiled)")
    return load_scenario(scenario, profile=at_cpu_speed(loaded.profile, speed)), [note]


def _check_requests(path: Path, policy: str, df: pd.DataFrame,
                    loaded: LoadedScenario) -> list[str]:
    specs = loaded.requests
    fix = f"validate against the scenario the run used ({loaded.path} has another workload)"
    if len(df) != len(specs):
        raise ValidateError(f"{path}: {policy} has {len(df)} requests but the scenario's "
                            f"workload has {len(specs)}; {fix}")
    ids = df["request_id"].to_numpy(dtype=np.int64)
    if not np.array_equal(np.sort(ids), np.arange(len(specs))):
        raise ValidateError(f"{path}: {policy}'s request ids are not 0..{len(specs) - 1}; {fix}")
    df = df.iloc[np.argsort(ids, kind="stable")]
    for column, attr in (("prompt_tokens", "prompt_tokens"), ("max_tokens", "max_tokens")):
        want = np.fromiter((getattr(s, attr) for s in specs), dtype=np.int64, count=len(specs))
        got = df[column].to_numpy(dtype=np.int64)
        bad = np.flatnonzero(got != want)
        if bad.size:
            i = int(bad[0])
            raise ValidateError(f"{path}: {policy}'s request {i} has {column} {got[i]}, the "
                                f"scenario's {want[i]} ({bad.size} requests differ); {fix}")
    want = np.fromiter((s.arrival_s for s in specs), dtype=float, count=len(specs))
    got = df["arrival_s"].to_numpy(dtype=float)
    drift = np.abs((got - got.min()) - (want - want.min()))
    notes = []
    if drift.max() > 1e-9:
        notes.append(f"note: {policy}'s real arrivals deviate from the scenario's by up to "
                     f"{drift.max() * 1e3:.3g} ms (mean {drift.mean() * 1e3:.3g} ms, counted "
                     f"from the first arrival)")
    incomplete = int((df["n_tokens"] != df["max_tokens"]).sum())
    if incomplete:
        notes.append(f"warning: {policy}: {incomplete} of {len(df)} real requests did not "
                     f"produce all their tokens")
    return notes


def _check_summary(policy: str, summary: dict, df: pd.DataFrame) -> list[str]:
    recomputed = summarize(df)
    differ = []
    for metric in METRICS:
        given = summary.get(metric)
        if not isinstance(given, int | float) or isinstance(given, bool):
            continue
        mine = recomputed[metric]
        if not math.isclose(given, mine, rel_tol=SUMMARY_RTOL, abs_tol=1e-12):
            differ.append(f"{metric} {given:.4g} vs {mine:.4g}")
    if not differ:
        return []
    shown = "; ".join(differ[:3]) + ("; ..." if len(differ) > 3 else "")
    return [f"warning: {policy}: summary.json disagrees with its own records on "
            f"{len(differ)} metric(s) ({shown}); the table uses the records"]


def relative_error(simulated: float, real: float) -> float:
    """(simulated − real) / real; 0 when both are 0, ±inf when only the real value is 0, NaN
    when either is undefined."""
    if math.isnan(simulated) or math.isnan(real):
        return math.nan
    if real == 0:
        return 0.0 if simulated == 0 else math.copysign(math.inf, simulated)
    return (simulated - real) / real


def compare(real: dict[str, pd.DataFrame], simulated: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The validation table: one row per (policy, metric) of :data:`METRICS`, for each policy of
    ``real`` (in its order), both sides summarized from their records."""
    rows = []
    for policy, real_df in real.items():
        r, s = summarize(real_df), summarize(simulated[policy])
        for metric in METRICS:
            sim_v, real_v = float(s[metric]), float(r[metric])
            rows.append((policy, metric, sim_v, real_v, relative_error(sim_v, real_v)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def format_table(table: pd.DataFrame) -> str:
    """The validation table as aligned text (values to 4 significant digits, errors in %)."""
    def num(v: float) -> str:
        return "n/a" if math.isnan(v) else f"{v:.4g}"

    def pct(v: float) -> str:
        return "n/a" if math.isnan(v) else f"{v:+.1%}" if math.isfinite(v) else f"{v:+}"

    header = ("policy", "metric", "simulated", "real", "rel. error")
    body = [(str(r.policy), str(r.metric), num(r.simulated), num(r.real), pct(r.relative_error))
            for r in table.itertuples(index=False)]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = []
    for row in [header, *body]:
        left = [c.ljust(w) for c, w in zip(row[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(left + right).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def validate(real_dir: Path | str, scenario: Path | str, out_dir: Path | str | None = None,
             progress: bool = False, costs: Path | str | None = None,
             cpu_speed: Literal["run", "profile"] = "run") -> ValidationResult:
    """Simulate ``scenario`` for each policy of the real run in ``real_dir``, compare, and write
    validation.csv, sim/{requests.parquet,summary.json} and the overlay plots to ``out_dir``
    (default ``real_dir``/validation). `cpu_speed` "run": a policy whose run checked its CPU
    engine's speed has its CPU stages priced at it (`at_run_cpu_speed`); "profile": as tabled.

    Raises ValidateError (bad real directory or a mismatch with the scenario), ScenarioError
    (bad scenario) or SimulationStalled (the simulator cannot serve the load).
    """
    real = read_real_run(real_dir)
    loaded, notes = load_for_real_run(scenario, real.path,
                                      Path(costs) if costs is not None else None)
    notes += check_against_scenario(real, loaded)
    notes += host_read_notes(real, loaded.profile)
    out = Path(out_dir) if out_dir is not None else real.path / "validation"

    try:  # before anything is written: a bad journal must not leave a half validation
        replays = replay_run(real.path, loaded)  # the runtime's journals, where it wrote them
    except JournalError as e:
        raise ValidateError(str(e)) from None
    notes += stall_notes(real, loaded, replays)
    sim_frames: dict[str, pd.DataFrame] = {}
    sim_summaries: list[dict] = []
    record, digest = provenance(loaded), scenario_hash(loaded.path)
    for policy in real.frames:
        priced = loaded
        if cpu_speed == "run":
            priced, speed_notes = at_run_cpu_speed(scenario, loaded, real, policy)
            notes += speed_notes
        records, summary = simulate(priced, policy, progress)
        sim_frames[policy] = records.frame()  # compared request by request below
        sim_summaries.append(stamp(summary, digest, record))
    sim_dir = out / "sim"
    sim_dir.mkdir(parents=True, exist_ok=True)
    write_records(pd.concat(sim_frames.values(), ignore_index=True), sim_dir / "requests.parquet",
                  parquet_metadata(record))
    write_json(sim_dir / "summary.json", sim_summaries)

    table = compare(real.frames, sim_frames)
    table.to_csv(out / "validation.csv", index=False)
    files = [out / "validation.csv", sim_dir / "requests.parquet", sim_dir / "summary.json"]
    name = f"{loaded.spec.name}: real (solid) vs simulated (dashed)"
    files += plot_timeline_overlay(real.frames, sim_frames, out / "timeline_overlay",
                                   title=f"{name}, token progress")
    files += plot_latency_cdf_overlay(real.frames, sim_frames, out / "latency_cdf_overlay",
                                      title=f"{name}, latency CDFs")
    if replays:
        (out / "replay.txt").write_text("".join(r.line() + "\n" for r in replays))
        files.append(out / "replay.txt")
    return ValidationResult(table, out, files, notes, replays)
