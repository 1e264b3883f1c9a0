"""`dualpace-sim sweep`: every (policy, offered rate, grid setting, seed) point of a scenario,
in parallel, resumable.

Layout of a sweep directory (every column and key: docs' output reference)::

    DIR/sweep.json                  what was swept: scenario, its hash, policies, rates, grid,
                                    targets, --set changes, code version, provenance
    DIR/points/<policy>@<rate>[,<key>=<value>...]/
                                    one point, written as soon as it finishes
        requests.parquet            per-request records (see records.py), provenance metadata
        state.parquet               queues and KV over time (see node_series.py), likewise
        utilisation.parquet         each engine's busy share over time, likewise
        summary.json                a list of one summary, the shape of `run`'s
        error.txt                   only when the point failed (the worker's traceback)
    DIR/sweep.csv                   one row per finished point, sorted by policy, setting, rate
    DIR/sustainable.csv             policy, grid keys, metric, target, rate (sustainable rate)
    DIR/sweep_ci.csv                with seeds: each metric's mean over seeds and its interval

A point counts as finished when its ``summary.json`` exists; both of its files are written to a
temporary name and renamed, the summary last, so a killed sweep never leaves a half-written point
and rerunning the same command computes only what is missing. Every point and ``sweep.json``
carry a hash of the scenario file, the files it refers to (profile, roofline spec/model, trace)
and the ``--set`` changes, and the simulator's version (:func:`provenance.code_version`), so
results of an edited scenario or of another simulator are never mixed with old ones.

A grid (``sweep.grid``: dotted scenario keys and their values) and seeds (``sweep.seeds``, the
grid key ``workload.seed``) multiply the points; a seed is a replicate, so sustainable rates are
read off the mean over seeds and bounded by bootstrap intervals
(:mod:`dualpace_sim.results.variance`).

This process loads the scenario once per (rate, setting), hands each point to an executor
(:mod:`dualpace_sim.experiments.executors`: worker processes of this machine, or Ray tasks on a
cluster) that
runs :func:`compute_point` (:func:`dualpace_sim.experiments.runner.simulate`) and returns the
records and
summary, and writes each point as it comes back (:func:`write_point`), adding its hash and
provenance. So every executor gives the same files, byte for byte, and workers never touch the
file system. With one worker the points run in this process, one after another (also what tests
use to monkeypatch).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dualpace_sim.common.progress import progress_bar
from dualpace_sim.config.overrides import Setting, grid_settings, merged, nested, setting_text
from dualpace_sim.config.scenario import LoadedScenario, load_scenario, read_scenario
from dualpace_sim.experiments.executors import InProcess, ProcessPool, RayCluster
from dualpace_sim.experiments.runner import simulate
from dualpace_sim.results.metrics import sustainable_rate
from dualpace_sim.results.node_series import STATE_FILE, UTILISATION_FILE, write_series
from dualpace_sim.results.outputs import temporary_name, write_json, write_text_atomically
from dualpace_sim.results.provenance import (
    code_version,
    describe_version,
    parquet_metadata,
    provenance,
    referenced_files,
    scenario_hash,
)
from dualpace_sim.results.records import PolicyRecords, write_policy_records
from dualpace_sim.results.summary import stamp
from dualpace_sim.results.sweep_dir import (
    SWEEP_COLUMNS,
    TARGET_METRICS,
    grid_columns,
    point_dir,
    point_name,
    read_point_summary,
)
from dualpace_sim.results.variance import SEED_KEY, ci_table, sustainable_ci
from dualpace_sim.sim import SimulationStalled

ABOVE_SWEEP = "above_sweep"
BELOW_SWEEP = "below_sweep"


class SweepError(ValueError):
    """A sweep that cannot start; the message is one line saying what to do."""


class SweepInterrupted(Exception):
    """Ctrl-C: finished points are kept; the message says how to resume."""


# One point of a sweep: policy, offered rate and the grid's setting (seed included).
Point = tuple[str, float, Setting]


@dataclass
class PointOutcome:
    policy: str
    rate: float
    status: str  # "done" (computed now), "skipped" (finished earlier) or "failed"
    wall_s: float | None = None
    error: str | None = None  # one line; the traceback is in the point's error.txt
    setting: Setting = ()

    @property
    def stalled(self) -> bool:
        """The point failed by stalling: deterministic, so a rerun stalls again."""
        return self.error is not None and self.error.startswith(f"{SimulationStalled.__name__}:")

    @property
    def name(self) -> str:
        return point_name(self.policy, self.rate, self.setting)


@dataclass
class SweepResult:
    out: Path
    name: str
    targets: dict[str, float]
    points: list[PointOutcome]
    table: pd.DataFrame  # sweep.csv
    sustainable: pd.DataFrame  # sustainable.csv
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # one-line notes for the reader
    failed: list[PointOutcome] = field(init=False)

    def __post_init__(self) -> None:
        self.failed = [p for p in self.points if p.status == "failed"]


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
    records: PolicyRecords | None = None  # None when the point failed
    summary: dict | None = None
    error: str | None = None  # one line
    traceback: str | None = None  # for the point's error.txt


def compute_point(loaded: LoadedScenario, policy: str) -> PointResult:
    """Simulate one point, in this process, a pool worker or a Ray task; writes nothing.

    Never raises on a failing simulation (the traceback comes back for ``error.txt``), so one
    bad point cannot take the others down. Taking the loaded scenario and returning the results
    keeps files out of the workers: a Ray node needs neither the scenario's files nor ``out``.
    """
    start = time.perf_counter()
    try:
        records, summary = simulate(loaded, policy)
    except Exception as exc:  # noqa: BLE001 - any failure of a point is reported, not raised
        return PointResult(time.perf_counter() - start, error=_one_line(exc),
                           traceback=traceback.format_exc())
    return PointResult(time.perf_counter() - start, records, summary)


def write_point(pdir: Path, result: PointResult, digest: str, record: dict) -> None:
    """Write one computed point as it finishes: ``requests.parquet``, then ``summary.json``
    (last: it marks the point finished), each to a temporary name and renamed; or
    ``error.txt`` when it failed. Both carry the scenario hash ``digest`` and the provenance
    ``record`` (:func:`summary.stamp`), added here, in the sweep's own process."""
    if result.summary is None:
        _write_error(pdir, result.traceback)
        return
    pdir.mkdir(parents=True, exist_ok=True)
    write_policy_records([result.records], pdir / "requests.parquet", parquet_metadata(record))
    write_series({result.records.policy: result.records.series}, pdir,
                 parquet_metadata(record))
    write_json(pdir / "summary.json", [stamp(result.summary, digest, record)])
    (pdir / "error.txt").unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the sweep


SWEEP_FILES = ("sweep.json", "sweep.csv", "sustainable.csv", "sweep_ci.csv")
POINT_FILES = ("requests.parquet", STATE_FILE, UTILISATION_FILE, "summary.json",
               "error.txt")
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


def _version_message(out: Path, old: dict | None) -> str:
    return (f"{out}: holds a sweep made by {describe_version(old)}, but this is "
            f"{describe_version(code_version())}; their points would mix two simulators, so use "
            f"a new --out, or add --restart to discard it")


def _point_version(summary: dict) -> dict | None:
    record = summary.get("provenance")
    if not isinstance(record, dict):
        return None
    return {k: record.get(k) for k in code_version()}


def _check_resumable(out: Path, scenario: Path, digest: str, grid: Iterable[Point]) -> None:
    """Refuse to resume into ``out`` when it holds points of another scenario version or of
    another simulator version (:func:`provenance.code_version`)."""
    meta_path = out / "sweep.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        if meta.get("scenario_hash") != digest:
            raise SweepError(_stale_message(out, scenario))
        if meta.get("code_version") != code_version():
            raise SweepError(_version_message(out, meta.get("code_version")))
    for point in grid:
        pdir = point_dir(out, *point)
        if not (pdir / "summary.json").is_file():
            continue
        summary = read_point_summary(pdir)
        if summary is None or summary.get("scenario_hash") != digest:
            raise SweepError(_stale_message(out, scenario))
        if _point_version(summary) != code_version():
            raise SweepError(_version_message(out, _point_version(summary)))


def metric_columns(summary: dict) -> list[str]:
    """sweep.csv's metric columns for points summarized like ``summary``: the headline ones
    (:data:`SWEEP_COLUMNS`), then every other number of the summary's top level (the
    serving-benchmark set, in summarize()'s order)."""
    extra = [k for k, v in summary.items() if k not in SWEEP_COLUMNS and k != "rate"
             and (isinstance(v, int | float) or v is None) and not isinstance(v, bool)]
    return [*SWEEP_COLUMNS[2:], *extra]


def sweep_table(out: Path, grid: Iterable[Point]) -> pd.DataFrame:
    """sweep.csv's frame: one row per finished point of ``grid``, sorted by policy, setting and
    rate, with a column per grid key after ``rate``."""
    rows, metrics, keys = [], list(SWEEP_COLUMNS[2:]), []
    for policy, rate, setting in grid:
        s = read_point_summary(point_dir(out, policy, rate, setting))
        if s is None:
            continue
        metrics = metric_columns(s)
        keys = [k for k, _ in setting]
        rows.append({"policy": policy, "rate": float(rate), **dict(setting),
                     **{c: s.get(c) for c in metrics}})
    columns = ["policy", "rate", *keys, *metrics]
    table = pd.DataFrame(rows, columns=columns)
    for c in metrics:
        table[c] = pd.to_numeric(table[c], errors="coerce")
    return table.sort_values(["policy", *keys, "rate"], kind="stable", ignore_index=True)


def sustainable_table(table: pd.DataFrame, targets: Mapping[str, float]) -> pd.DataFrame:
    """sustainable.csv's frame: for each policy (and grid setting) and each target metric, the
    sustainable request rate over its points (:func:`metrics.sustainable_rate`): a float in
    req/s, or ``above_sweep`` / ``below_sweep``. Points that failed are simply absent.

    With several seeds the rate is read off the mean over seeds at each rate, and
    ``rate_ci_low`` / ``rate_ci_high`` bound it (:func:`variance.sustainable_ci`)."""
    keys = [k for k in grid_columns(table) if k != SEED_KEY]
    seeded = SEED_KEY in table.columns
    rows = []
    for group, points in table.groupby(["policy", *keys], sort=True, dropna=False):
        labels = dict(zip(["policy", *keys], group, strict=True))
        for metric in TARGET_METRICS:
            if metric not in targets:
                continue
            by_rate = points.pivot(index="rate", columns=SEED_KEY,
                                   values=metric) if seeded else None
            if by_rate is None:
                points = points.sort_values("rate")
                rate = sustainable_rate(points["rate"].to_numpy(float),
                                        points[metric].to_numpy(float), targets[metric])
                ci = {}
            else:
                rate, low, high = sustainable_ci(by_rate.index.to_numpy(float),
                                                 by_rate.to_numpy(float), targets[metric])
                ci = {"rate_ci_low": low, "rate_ci_high": high}
            rows.append({**labels, "metric": metric, "target": float(targets[metric]),
                         "rate": rate, **ci})
    columns = ["policy", *keys, "metric", "target", "rate"]
    return pd.DataFrame(rows, columns=columns + (["rate_ci_low", "rate_ci_high"] if seeded
                                                 else []))


def format_rate(value: float | str, rates: Iterable[float] | None = None) -> str:
    """A sustainable rate for people: ``3.42``, ``> 5`` (above the sweep), ``< 1.5`` (below)."""
    rates = sorted(rates) if rates is not None else []
    if value == ABOVE_SWEEP:
        return f"> {rates[-1]:g}" if rates else "above sweep"
    if value == BELOW_SWEEP:
        return f"< {rates[0]:g}" if rates else "below sweep"
    return f"{float(value):.3g}"


def format_sustainable(sustainable: pd.DataFrame, rates: Iterable[float]) -> str:
    """The sustainable-rate table as aligned text (policies, and grid settings, × target
    metrics), with the 95% interval over seeds when there is one."""
    rates = list(rates)
    metrics = [m for m in TARGET_METRICS if m in set(sustainable["metric"])]
    targets = sustainable.drop_duplicates("metric").set_index("metric")["target"]
    short = {"normalized_latency_s": "norm. latency", "p99_ttft_s": "P99 TTFT",
             "p99_itl_s": "P99 ITL", "p99_tpot_s": "P99 TPOT"}
    unit = {"normalized_latency_s": " s/tok"}
    keys = list(sustainable.columns[1:list(sustainable.columns).index("metric")])
    header = ["policy"] + [f"{short[m]} <= {targets[m]:g}{unit.get(m, ' s')}" for m in metrics]
    lines = [header]
    for group, rows in sustainable.groupby(["policy", *keys], sort=True, dropna=False):
        group = group if isinstance(group, tuple) else (group,)
        label = ",".join([str(group[0]), *(f"{k}={v}" for k, v in zip(keys, group[1:],
                                                                     strict=True))])
        cells = []
        for _, row in rows.set_index("metric").loc[metrics].iterrows():
            text = format_rate(row["rate"], rates)
            if "rate_ci_low" in row and pd.notna(row["rate_ci_low"]):
                text += f" [{row['rate_ci_low']:.3g}, {row['rate_ci_high']:.3g}]"
            cells.append(text)
        lines.append([label, *cells])
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
    changes: dict | None = None,
) -> SweepResult:
    """Run (or resume) the sweep of ``scenario`` into ``out``; see the module docstring.

    ``changes`` (``--set``, nested like the file) are laid over every point. The points run in
    ``workers`` local processes (default: one per CPU), or, given ``ray``, as tasks on the Ray
    cluster at that address (see :class:`executors.RayCluster`; ``workers`` then caps the
    points running at once, default no cap). Either way they give the same files.

    Raises ScenarioError (bad scenario or grid key), SweepError (no sweep section, ``out``
    holds a sweep of another scenario or simulator version, bad ``workers``) and
    ExecutorUnavailable (Ray not installed or not reachable) before computing anything, and
    SweepInterrupted on Ctrl-C. Failing points do not raise: they are in ``result.failed``.
    """
    scenario, out = Path(scenario), Path(out)
    changes = changes or {}
    start = time.perf_counter()
    spec = read_scenario(scenario, changes)
    if spec.sweep is None:
        raise SweepError(f"{scenario}: sweep: the scenario has no sweep section; add e.g. "
                         f"`sweep: {{rates: [1.0, 2.0, 3.0]}}` (offered req/s, increasing)")
    if workers is not None and workers < 1:
        raise SweepError(f"--workers: must be at least 1 (got {workers})")
    cluster = RayCluster(ray, max_running=workers) if ray is not None else None
    rates = [float(r) for r in spec.sweep.rates]
    grid_spec = dict(spec.sweep.grid)
    if spec.sweep.seeds is not None:
        grid_spec[SEED_KEY] = list(spec.sweep.seeds)
    settings = grid_settings(grid_spec)

    def load(rate: float, setting: Setting) -> LoadedScenario:
        return load_scenario(scenario, rate=rate, changes=merged(changes, nested(setting)))

    # Everything a worker could trip over in the scenario fails here, once, as one line; each
    # setting is checked at the first rate, which also validates every grid key.
    loads = {(rates[0], st): load(rates[0], st) for st in settings}
    first = loads[rates[0], settings[0]]
    policies = list(dict.fromkeys(first.spec.policies))  # a repeated name runs once
    grid = [(p, r, st) for p in policies for st in settings for r in rates]
    targets = first.spec.targets.model_dump()
    digest = scenario_hash(scenario, changes)
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
        "grid": grid_spec, "changes": changes, "code_version": code_version(),
        "provenance": provenance(first),
    })

    outcomes: dict[Point, PointOutcome] = {}
    todo = []
    for point in grid:
        if (point_dir(out, *point) / "summary.json").is_file():
            outcomes[point] = PointOutcome(point[0], point[1], "skipped", setting=point[2])
        else:
            todo.append(point)
    if cluster is not None:
        executor = cluster
    else:
        n_workers = min((os.cpu_count() or 1) if workers is None else workers, len(todo))
        executor = ProcessPool(n_workers) if n_workers > 1 else InProcess()
    if not isinstance(executor, InProcess):
        # Longest points (highest rates) first, so the last busy worker finishes soonest.
        todo.sort(key=lambda point: -point[1])
    # Each (rate, setting) is loaded once, here; its policies' points share it.
    for _, rate, setting in todo:
        if (rate, setting) not in loads:
            loads[rate, setting] = load(rate, setting)
    records = {key: provenance(loaded) for key, loaded in loads.items()}
    bar = None

    def on_result(point: Point, result: PointResult | BaseException) -> None:
        if isinstance(result, BaseException):  # e.g. its worker was killed by the OS
            result = PointResult(None, error=_one_line(result),
                                 traceback="".join(traceback.format_exception(result)))
        write_point(point_dir(out, *point), result, digest, records[point[1], point[2]])
        outcome = PointOutcome(point[0], point[1], "failed" if result.summary is None else
                               "done", result.wall_s, result.error, point[2])
        outcomes[point] = outcome
        if outcome.error is not None and progress:
            bar.write(f"point {outcome.name} failed: {outcome.error}")
        wall = f" ({result.wall_s:.1f}s)" if result.wall_s is not None else ""
        bar.set_postfix_str(f"{outcome.name}{wall}", refresh=False)
        bar.update(1)

    try:
        if todo:
            with executor:
                bar = progress_bar(progress, total=len(grid), initial=len(grid) - len(todo),
                                   unit="point", desc=f"sweep {spec.name}", leave=False)
                calls = [(loads[rate, setting], policy) for policy, rate, setting in todo]
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
    if SEED_KEY in table.columns:
        write_text_atomically(out / "sweep_ci.csv",
                              ci_table(table, grid_columns(table)).to_csv(index=False))
    sustainable = sustainable_table(table, targets)
    write_text_atomically(out / "sustainable.csv", sustainable.to_csv(index=False))
    return SweepResult(out, spec.name, targets, [outcomes[k] for k in grid], table, sustainable,
                       wall_s=time.perf_counter() - start, notes=_budget_notes(loads, rates[0]))


def _budget_notes(loads: Mapping[tuple[float, Setting], LoadedScenario],
                  rate: float) -> list[str]:
    """At most one note: the first grid setting whose policies' GPU batch budgets differ, named
    by its grid keys (a budget depends on neither the rate nor the seed)."""
    for (at, setting), loaded in loads.items():
        note = loaded.budget_note() if at == rate else None
        if note is not None:
            keys = tuple((k, v) for k, v in setting if k != SEED_KEY)
            return [f"at {setting_text(keys)}: {note}" if keys else note]
    return []
