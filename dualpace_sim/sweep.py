"""`dualpace-sim sweep`: every (policy, offered rate) point of a scenario, in parallel, resumable.

Layout of a sweep directory::

    DIR/sweep.json                  what was swept: scenario, its hash, policies, rates, targets
    DIR/points/<policy>@<rate>/     one point, written as soon as it finishes
        requests.parquet            per-request records (see records.py)
        summary.json                metrics + controls + engine counters + scenario_hash
        error.txt                   only when the point failed (the worker's traceback)
    DIR/sweep.csv                   one row per finished point, sorted by policy then rate
    DIR/sustainable.csv             policy, metric, target, rate (sustainable request rate)

A point counts as finished when its ``summary.json`` exists; both of its files are written to a
temporary name and renamed, the summary last, so a killed sweep never leaves a half-written point
and rerunning the same command computes only what is missing. Every point and ``sweep.json``
carry a hash of the scenario file and the files it refers to (profile, roofline spec/model,
trace), so results of an edited scenario are never mixed with old ones.

This process loads the scenario once per rate, hands each point to an executor
(:mod:`dualpace_sim.executors`: worker processes of this machine, or Ray tasks on a cluster) that
runs :func:`compute_point` (:func:`dualpace_sim.runner.simulate`) and returns the records and
summary, and writes each point as it comes back (:func:`write_point`). So every executor gives
the same files, byte for byte, and workers never touch the file system. With one worker the
points run in this process, one after another (also what tests use to monkeypatch).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from .executors import InProcess, ProcessPool, RayCluster
from .metrics import longest_cpu_stall, sustainable_rate
from .outputs import temporary_name, write_json, write_text_atomically
from .records import write_records
from .runner import simulate
from .scenario import LoadedScenario, Scenario, load_scenario, read_scenario
from .sim import SimulationStalled

# The metrics that have a target, in the order tables show them.
TARGET_METRICS = ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s")

# sweep.csv columns: the point, then the headline metrics, then the rest of summarize().
SWEEP_COLUMNS = (
    "policy", "rate", "normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s",
    "throughput_tok_s", "completed", "submitted", "cpu_token_fraction", "mean_ttft_s",
    "p50_ttft_s", "makespan_s", "longest_cpu_stall_s",
)

ABOVE_SWEEP = "above_sweep"
BELOW_SWEEP = "below_sweep"


class SweepError(ValueError):
    """A sweep that cannot start; the message is one line saying what to do."""


class SweepInterrupted(Exception):
    """Ctrl-C: finished points are kept; the message says how to resume."""


@dataclass
class PointOutcome:
    policy: str
    rate: float
    status: str  # "done" (computed now), "skipped" (finished earlier) or "failed"
    wall_s: float | None = None
    error: str | None = None  # one line; the traceback is in the point's error.txt

    @property
    def stalled(self) -> bool:
        """The point failed by stalling: deterministic, so a rerun stalls again."""
        return self.error is not None and self.error.startswith(f"{SimulationStalled.__name__}:")

    @property
    def name(self) -> str:
        return point_name(self.policy, self.rate)


@dataclass
class SweepResult:
    out: Path
    name: str
    targets: dict[str, float]
    points: list[PointOutcome]
    table: pd.DataFrame  # sweep.csv
    sustainable: pd.DataFrame  # sustainable.csv
    wall_s: float = 0.0
    failed: list[PointOutcome] = field(init=False)

    def __post_init__(self) -> None:
        self.failed = [p for p in self.points if p.status == "failed"]


def point_name(policy: str, rate: float) -> str:
    """Folder name of one point: ``<policy>@<rate>`` with the rate's shortest exact repr."""
    return f"{policy}@{float(rate)!r}"


def point_dir(out: Path | str, policy: str, rate: float) -> Path:
    return Path(out) / "points" / point_name(policy, rate)


def _resolve(base: Path, name: str) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() else base / p


def referenced_files(path: Path, spec: Scenario) -> list[Path]:
    """The files besides the scenario whose bytes decide the results: the calibration profile
    (or the roofline's hardware spec / model config when given as paths) and a trace file."""
    base = path.parent
    files = []
    if spec.profile is not None:
        files.append(_resolve(base, spec.profile))
    if spec.roofline is not None:
        if spec.roofline.hardware.endswith((".yaml", ".yml")):
            files.append(_resolve(base, spec.roofline.hardware))
        if spec.roofline.model.endswith(".json"):
            files.append(_resolve(base, spec.roofline.model))
    if spec.workload.path is not None:
        files.append(_resolve(base, spec.workload.path))
    return files


def scenario_hash(path: Path | str) -> str:
    """sha256 over the scenario file's bytes and those of the files it refers to."""
    path = Path(path)
    digest = hashlib.sha256()
    for f in [path, *referenced_files(path, read_scenario(path))]:
        data = f.read_bytes() if f.is_file() else b""
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- one point


def _write_error(pdir: Path, text: str) -> None:
    pdir.mkdir(parents=True, exist_ok=True)
    write_text_atomically(pdir / "error.txt", text)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass
class PointResult:
    """What computing one point gives back; the sweep writes it (:func:`write_point`)."""

    wall_s: float | None
    frame: pd.DataFrame | None = None  # per-request records; None when the point failed
    summary: dict | None = None
    error: str | None = None  # one line
    traceback: str | None = None  # for the point's error.txt


def compute_point(loaded: LoadedScenario, policy: str, digest: str) -> PointResult:
    """Simulate one point, in this process, a pool worker or a Ray task; writes nothing.

    Never raises on a failing simulation (the traceback comes back for ``error.txt``), so one
    bad point cannot take the others down. Taking the loaded scenario and returning the results
    keeps files out of the workers: a Ray node needs neither the scenario's files nor ``out``.
    """
    start = time.perf_counter()
    try:
        frame, summary = simulate(loaded, policy)
        summary["longest_cpu_stall_s"] = longest_cpu_stall(frame)
        summary["scenario_hash"] = digest
    except Exception as exc:  # noqa: BLE001 - any failure of a point is reported, not raised
        return PointResult(time.perf_counter() - start, error=_one_line(exc),
                           traceback=traceback.format_exc())
    return PointResult(time.perf_counter() - start, frame, summary)


def write_point(pdir: Path, result: PointResult) -> None:
    """Write one computed point as it finishes: ``requests.parquet``, then ``summary.json``
    (last: it marks the point finished), each to a temporary name and renamed; or
    ``error.txt`` when it failed."""
    if result.summary is None:
        _write_error(pdir, result.traceback)
        return
    pdir.mkdir(parents=True, exist_ok=True)
    write_records(result.frame, pdir / "requests.parquet")
    write_json(pdir / "summary.json", result.summary)
    (pdir / "error.txt").unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the sweep


SWEEP_FILES = ("sweep.json", "sweep.csv", "sustainable.csv")
POINT_FILES = ("requests.parquet", "summary.json", "error.txt")
PLOT_SUFFIXES = (".png", ".pdf")


def _clear(out: Path) -> None:
    """--restart: remove what a sweep and its plots wrote, and nothing else, from ``out``: the
    sweep's own files, each point folder's files (and the folder once empty), the figures in
    plots/. A file of the user's in points/ or plots/ stays, and so does its folder."""
    points = out / "points"
    if points.is_dir():
        for pdir in points.iterdir():
            if pdir.is_dir() and "@" in pdir.name:
                for name in POINT_FILES:
                    (pdir / name).unlink(missing_ok=True)
                    temporary_name(pdir / name).unlink(missing_ok=True)
                _remove_if_empty(pdir)
        _remove_if_empty(points)
    plots = out / "plots"
    if plots.is_dir():
        for f in plots.iterdir():
            if f.is_file() and f.suffix in PLOT_SUFFIXES:
                f.unlink()
        _remove_if_empty(plots)
    for name in SWEEP_FILES:
        (out / name).unlink(missing_ok=True)


def _remove_if_empty(folder: Path) -> None:
    if not any(folder.iterdir()):
        folder.rmdir()


def _check_out(out: Path) -> None:
    """Refuse, before computing anything, an ``out`` the sweep cannot write or must not: a
    file, a folder without write permission, and a folder holding a sweep.csv that no sweep
    wrote there (neither sweep.json nor a finished point), which the sweep would overwrite."""
    if out.exists() and not out.is_dir():
        raise SweepError(f"{out}: is a file; give --out a directory for the sweep")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SweepError(f"{existing}: permission denied; give --out a directory you can write")
    ours = (out / "sweep.json").is_file() or any((out / "points").glob("*@*/summary.json"))
    if out.is_dir() and not ours:
        foreign = [name for name in SWEEP_FILES[1:] if (out / name).exists()]
        if foreign:
            raise SweepError(f"{out}: holds a {foreign[0]} that no sweep wrote there (no "
                             "sweep.json, no points); give --out a new directory")


def _stale_message(out: Path, scenario: Path) -> str:
    return (f"{out}: holds a sweep of a different version of {scenario} (the scenario or a file "
            f"it refers to changed since); use a new --out, or add --restart to discard it")


def _check_resumable(out: Path, scenario: Path, digest: str,
                     grid: Iterable[tuple[str, float]]) -> None:
    meta_path = out / "sweep.json"
    if meta_path.is_file():
        try:
            old = json.loads(meta_path.read_text()).get("scenario_hash")
        except (json.JSONDecodeError, AttributeError):
            old = None
        if old != digest:
            raise SweepError(_stale_message(out, scenario))
    for policy, rate in grid:
        summary = point_dir(out, policy, rate) / "summary.json"
        if summary.is_file():
            try:
                old = json.loads(summary.read_text()).get("scenario_hash")
            except (json.JSONDecodeError, AttributeError):
                old = None
            if old != digest:
                raise SweepError(_stale_message(out, scenario))


def sweep_table(out: Path, grid: Iterable[tuple[str, float]]) -> pd.DataFrame:
    """sweep.csv's frame: one row per finished point of ``grid``, sorted by policy then rate."""
    rows = []
    for policy, rate in grid:
        summary_path = point_dir(out, policy, rate) / "summary.json"
        if not summary_path.is_file():
            continue
        s = json.loads(summary_path.read_text())
        row = {c: s.get(c) for c in SWEEP_COLUMNS}
        row["policy"], row["rate"] = policy, float(rate)
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS))
    for c in SWEEP_COLUMNS[2:]:
        table[c] = pd.to_numeric(table[c], errors="coerce")
    return table.sort_values(["policy", "rate"], kind="stable", ignore_index=True)


def sustainable_table(table: pd.DataFrame, targets: Mapping[str, float]) -> pd.DataFrame:
    """sustainable.csv's frame: for each policy and each target metric, the sustainable request
    rate over that policy's points (:func:`metrics.sustainable_rate`): a float in req/s, or
    ``above_sweep`` / ``below_sweep``. Points that failed are simply absent."""
    rows = []
    for policy, points in table.groupby("policy", sort=True):
        points = points.sort_values("rate")
        for metric in TARGET_METRICS:
            if metric not in targets:
                continue
            rate = sustainable_rate(points["rate"].to_numpy(float),
                                    points[metric].to_numpy(float), targets[metric])
            rows.append({"policy": policy, "metric": metric, "target": float(targets[metric]),
                         "rate": rate})
    return pd.DataFrame(rows, columns=["policy", "metric", "target", "rate"])


def format_rate(value: float | str, rates: Iterable[float] | None = None) -> str:
    """A sustainable rate for people: ``3.42``, ``> 5`` (above the sweep), ``< 1.5`` (below)."""
    rates = sorted(rates) if rates is not None else []
    if value == ABOVE_SWEEP:
        return f"> {rates[-1]:g}" if rates else "above sweep"
    if value == BELOW_SWEEP:
        return f"< {rates[0]:g}" if rates else "below sweep"
    return f"{float(value):.3g}"


def format_sustainable(sustainable: pd.DataFrame, rates: Iterable[float]) -> str:
    """The sustainable-rate table as aligned text (policies × target metrics)."""
    rates = list(rates)
    metrics = [m for m in TARGET_METRICS if m in set(sustainable["metric"])]
    targets = sustainable.drop_duplicates("metric").set_index("metric")["target"]
    short = {"normalized_latency_s": "norm. latency", "p99_ttft_s": "P99 TTFT",
             "p99_itl_s": "P99 ITL", "p99_tpot_s": "P99 TPOT"}
    unit = {"normalized_latency_s": " s/tok"}
    header = ["policy"] + [f"{short[m]} <= {targets[m]:g}{unit.get(m, ' s')}" for m in metrics]
    lines = [header]
    for policy, rows in sustainable.groupby("policy", sort=True):
        by_metric = rows.set_index("metric")["rate"]
        lines.append([policy] + [format_rate(by_metric[m], rates) for m in metrics])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in lines]
    return "sustainable request rate (req/s):\n" + "\n".join(text)


def run_sweep(
    scenario: Path | str,
    out: Path | str,
    workers: int | None = None,
    restart: bool = False,
    progress: bool = True,
    ray: str | None = None,
) -> SweepResult:
    """Run (or resume) the sweep of ``scenario`` into ``out``; see the module docstring.

    The points run in ``workers`` local processes (default: one per CPU), or, given ``ray``, as
    tasks on the Ray cluster at that address (see :class:`executors.RayCluster`; ``workers``
    then caps the points running at once, default no cap). Either way they give the same files.

    Raises ScenarioError (bad scenario), SweepError (no sweep section, ``out`` holds a sweep of
    another scenario version, bad ``workers``) and ExecutorUnavailable (Ray not installed or not
    reachable) before computing anything, and SweepInterrupted on Ctrl-C. Failing points do not
    raise: they are in ``result.failed``.
    """
    scenario, out = Path(scenario), Path(out)
    start = time.perf_counter()
    spec = read_scenario(scenario)
    if spec.sweep is None:
        raise SweepError(f"{scenario}: sweep: the scenario has no sweep section; add e.g. "
                         f"`sweep: {{rates: [1.0, 2.0, 3.0]}}` (offered req/s, increasing)")
    if workers is not None and workers < 1:
        raise SweepError(f"--workers: must be at least 1 (got {workers})")
    cluster = RayCluster(ray, max_running=workers) if ray is not None else None
    rates = [float(r) for r in spec.sweep.rates]
    # Everything a worker could trip over in the scenario fails here, once, as one line.
    first = load_scenario(scenario, rate=rates[0])
    policies = list(dict.fromkeys(first.spec.policies))  # a repeated name runs once
    grid = [(p, r) for p in policies for r in rates]
    targets = first.spec.targets.model_dump()
    digest = scenario_hash(scenario)
    _check_out(out)
    if restart:
        _clear(out)
    _check_resumable(out, scenario, digest, grid)
    out.mkdir(parents=True, exist_ok=True)
    (out / "points").mkdir(exist_ok=True)
    write_json(out / "sweep.json", {
        "scenario": str(scenario.resolve()), "name": first.spec.name, "scenario_hash": digest,
        "hashed_files": [str(f.resolve()) for f in referenced_files(scenario, first.spec)],
        "policies": policies, "rates": rates, "targets": targets,
    })

    outcomes: dict[tuple[str, float], PointOutcome] = {}
    todo = []
    for policy, rate in grid:
        if (point_dir(out, policy, rate) / "summary.json").is_file():
            outcomes[policy, rate] = PointOutcome(policy, rate, "skipped")
        else:
            todo.append((policy, rate))
    if cluster is not None:
        executor = cluster
    else:
        n_workers = min((os.cpu_count() or 1) if workers is None else workers, len(todo))
        executor = ProcessPool(n_workers) if n_workers > 1 else InProcess()
    if not isinstance(executor, InProcess):
        # Longest points (highest rates) first, so the last busy worker finishes soonest.
        todo.sort(key=lambda point: -point[1])
    # Each rate is loaded once, here; its policies' points share it.
    loads = {rates[0]: first}
    for _, rate in todo:
        if rate not in loads:
            loads[rate] = load_scenario(scenario, rate=rate)
    bar = None

    def on_result(point: tuple[str, float], result: PointResult | BaseException) -> None:
        if isinstance(result, BaseException):  # e.g. its worker was killed by the OS
            result = PointResult(None, error=_one_line(result),
                                 traceback="".join(traceback.format_exception(result)))
        write_point(point_dir(out, *point), result)
        outcome = PointOutcome(*point, "failed" if result.summary is None else "done",
                               result.wall_s, result.error)
        outcomes[point] = outcome
        if outcome.error is not None and progress:
            bar.write(f"point {outcome.name} failed: {outcome.error}")
        wall = f" ({result.wall_s:.1f}s)" if result.wall_s is not None else ""
        bar.set_postfix_str(f"{outcome.name}{wall}", refresh=False)
        bar.update(1)

    try:
        if todo:
            with executor:
                bar = tqdm(total=len(grid), initial=len(grid) - len(todo), unit="point",
                           desc=f"sweep {spec.name}", disable=not progress, leave=False)
                calls = [(loads[rate], policy, digest) for policy, rate in todo]
                for index, result in executor.run(compute_point, calls):
                    on_result(todo[index], result)
    except KeyboardInterrupt:
        finished = sum(1 for o in outcomes.values() if o.status != "failed")
        raise SweepInterrupted(
            f"interrupted: {finished} of {len(grid)} points are finished and kept in {out}/; "
            f"run the same command again to resume") from None
    finally:
        if bar is not None:
            bar.close()

    table = sweep_table(out, grid)
    write_text_atomically(out / "sweep.csv", table.to_csv(index=False))
    sustainable = sustainable_table(table, targets)
    write_text_atomically(out / "sustainable.csv", sustainable.to_csv(index=False))
    return SweepResult(out, spec.name, targets, [outcomes[k] for k in grid], table, sustainable,
                       wall_s=time.perf_counter() - start)


# ----------------------------------------------------------------------------- reading back


@dataclass
class SweepDir:
    """A finished (or partly finished) sweep directory, for plots and comparisons."""

    path: Path
    name: str
    table: pd.DataFrame
    targets: dict[str, float]

    def point_dir(self, policy: str, rate: float) -> Path:
        return point_dir(self.path, policy, rate)

    @property
    def rates(self) -> list[float]:
        return sorted(set(self.table["rate"].astype(float)))

    @property
    def policies(self) -> list[str]:
        return list(dict.fromkeys(self.table["policy"]))


def is_sweep_dir(path: Path | str) -> bool:
    return (Path(path) / "sweep.csv").is_file()


def read_sweep_dir(path: Path | str) -> SweepDir:
    """Read sweep.csv and the targets and name from sweep.json (paper targets if it is gone)."""
    path = Path(path)
    table = pd.read_csv(path / "sweep.csv")
    missing = [c for c in ("policy", "rate", *TARGET_METRICS) if c not in table.columns]
    if missing:
        raise ValueError(f"{path / 'sweep.csv'}: no column {missing[0]!r}; not a sweep.csv")
    table["policy"] = table["policy"].astype(str)
    meta_path = path / "sweep.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    from .scenario import Targets

    targets = {**Targets().model_dump(), **(meta.get("targets") or {})}
    return SweepDir(path, meta.get("name", path.name), table, targets)
