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

Workers are separate processes (``concurrent.futures.ProcessPoolExecutor``); each loads the
scenario itself at its rate and runs :func:`dualpace_sim.runner.simulate`. With one worker the
points run in this process, one after another (also what tests use to monkeypatch).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from .metrics import longest_cpu_stall, sustainable_rate
from .records import write_records
from .runner import _json_safe, simulate
from .scenario import Scenario, load_scenario, read_scenario

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


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_json_safe(obj), indent=2) + "\n")
    os.replace(tmp, path)


def _write_error(pdir: Path, text: str) -> None:
    pdir.mkdir(parents=True, exist_ok=True)
    tmp = pdir / ".error.txt.tmp"
    tmp.write_text(text)
    os.replace(tmp, pdir / "error.txt")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_point(scenario: str, policy: str, rate: float, pdir: str, digest: str) -> dict:
    """Compute one point and write its files; in a worker process or in this one.

    Never raises on a failing simulation (the traceback goes to ``error.txt``), so one bad
    point cannot take the others down. Returns ``{policy, rate, ok, wall_s, error}``.
    """
    start = time.perf_counter()
    target = Path(pdir)
    try:
        loaded = load_scenario(scenario, rate=rate)
        frame, summary = simulate(loaded, policy)
        summary["longest_cpu_stall_s"] = longest_cpu_stall(frame)
        summary["scenario_hash"] = digest
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / ".requests.parquet.tmp"
        write_records(frame, tmp)
        os.replace(tmp, target / "requests.parquet")
        _write_json(target / "summary.json", summary)  # last: it marks the point finished
        (target / "error.txt").unlink(missing_ok=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a point is reported, not raised
        for leftover in (".requests.parquet.tmp", ".summary.json.tmp"):
            (target / leftover).unlink(missing_ok=True)
        _write_error(target, traceback.format_exc())
        return {"policy": policy, "rate": rate, "ok": False,
                "wall_s": time.perf_counter() - start, "error": _one_line(exc)}
    return {"policy": policy, "rate": rate, "ok": True, "wall_s": time.perf_counter() - start,
            "error": None}


def _worker_init() -> None:
    # Ctrl-C goes to the whole process group; only the parent handles it (and stops workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Workers draw no bars: a thread lock keeps tqdm from creating a named multiprocessing lock,
    # which a worker stopped on Ctrl-C would leave to the resource tracker (a "leaked" warning).
    tqdm.set_lock(threading.RLock())


def _mp_context():
    """forkserver where available: workers fork from a clean, single-threaded server that has
    already imported the simulator, so starting them is cheap and safe."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dualpace_sim.sweep"])
        return ctx
    return multiprocessing.get_context("spawn")


def _run_pool(todo: list[tuple[str, float]], scenario: Path, out: Path, digest: str,
              workers: int, on_result: Callable[[dict], None],
              start_progress: Callable[[], None]) -> None:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context(),
                               initializer=_worker_init)
    interrupted = False
    try:
        # Longest points (highest rates) first, so the last busy worker finishes soonest.
        order = sorted(todo, key=lambda p: -p[1])
        futures = {pool.submit(run_point, str(scenario), policy, rate,
                               str(point_dir(out, policy, rate)), digest): (policy, rate)
                   for policy, rate in order}
        start_progress()
        for fut in as_completed(futures):
            policy, rate = futures[fut]
            try:
                result = fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. a worker killed by the OS
                _write_error(point_dir(out, policy, rate),
                             "".join(traceback.format_exception(exc)))
                result = {"policy": policy, "rate": rate, "ok": False, "wall_s": None,
                          "error": _one_line(exc)}
            on_result(result)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if interrupted:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in processes:  # a point being written is atomic, so killing is safe
                proc.terminate()
            for proc in processes:
                proc.join(timeout=5)
        else:
            pool.shutdown(wait=True)


# ----------------------------------------------------------------------------- the sweep


def _clear(out: Path) -> None:
    """--restart: remove what a sweep writes (and nothing else) from ``out``."""
    shutil.rmtree(out / "points", ignore_errors=True)
    shutil.rmtree(out / "plots", ignore_errors=True)
    for name in ("sweep.json", "sweep.csv", "sustainable.csv"):
        (out / name).unlink(missing_ok=True)


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
) -> SweepResult:
    """Run (or resume) the sweep of ``scenario`` into ``out``; see the module docstring.

    Raises ScenarioError (bad scenario), SweepError (no sweep section, ``out`` holds a sweep of
    another scenario version, bad ``workers``) before computing anything, and SweepInterrupted on
    Ctrl-C. Failing points do not raise: they are in ``result.failed``.
    """
    scenario, out = Path(scenario), Path(out)
    start = time.perf_counter()
    spec = read_scenario(scenario)
    if spec.sweep is None:
        raise SweepError(f"{scenario}: sweep: the scenario has no sweep section; add e.g. "
                         f"`sweep: {{rates: [1.0, 2.0, 3.0]}}` (offered req/s, increasing)")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise SweepError(f"--workers: must be at least 1 (got {workers})")
    rates = [float(r) for r in spec.sweep.rates]
    # Everything a worker could trip over in the scenario fails here, once, as one line.
    loaded = load_scenario(scenario, rate=rates[0])
    policies = list(dict.fromkeys(loaded.spec.policies))  # a repeated name runs once
    grid = [(p, r) for p in policies for r in rates]
    targets = loaded.spec.targets.model_dump()
    digest = scenario_hash(scenario)
    if restart:
        _clear(out)
    _check_resumable(out, scenario, digest, grid)
    out.mkdir(parents=True, exist_ok=True)
    (out / "points").mkdir(exist_ok=True)
    _write_json(out / "sweep.json", {
        "scenario": str(scenario.resolve()), "name": loaded.spec.name, "scenario_hash": digest,
        "hashed_files": [str(f.resolve()) for f in referenced_files(scenario, loaded.spec)],
        "policies": policies, "rates": rates, "targets": targets,
    })
    del loaded

    outcomes: dict[tuple[str, float], PointOutcome] = {}
    todo = []
    for policy, rate in grid:
        if (point_dir(out, policy, rate) / "summary.json").is_file():
            outcomes[policy, rate] = PointOutcome(policy, rate, "skipped")
        else:
            todo.append((policy, rate))
    bar = None

    def start_progress() -> None:
        nonlocal bar
        bar = tqdm(total=len(grid), initial=len(grid) - len(todo), unit="point",
                   desc=f"sweep {spec.name}", disable=not progress or not todo, leave=False)

    def on_result(res: dict) -> None:
        key = (res["policy"], res["rate"])
        outcome = PointOutcome(*key, "done" if res["ok"] else "failed", res["wall_s"],
                               res["error"])
        outcomes[key] = outcome
        if not res["ok"] and progress:
            bar.write(f"point {outcome.name} failed: {outcome.error}")
        wall = f" ({res['wall_s']:.1f}s)" if res["wall_s"] is not None else ""
        bar.set_postfix_str(f"{outcome.name}{wall}", refresh=False)
        bar.update(1)

    n_workers = min(workers, len(todo))
    try:
        if n_workers == 1:
            start_progress()
            for policy, rate in todo:
                on_result(run_point(str(scenario), policy, rate,
                                    str(point_dir(out, policy, rate)), digest))
        elif n_workers > 1:
            _run_pool(todo, scenario, out, digest, n_workers, on_result, start_progress)
    except KeyboardInterrupt:
        finished = sum(1 for o in outcomes.values() if o.status != "failed")
        raise SweepInterrupted(
            f"interrupted: {finished} of {len(grid)} points are finished and kept in {out}/; "
            f"run the same command again to resume") from None
    finally:
        if bar is not None:
            bar.close()

    table = sweep_table(out, grid)
    table.to_csv(out / "sweep.csv", index=False)
    sustainable = sustainable_table(table, targets)
    sustainable.to_csv(out / "sustainable.csv", index=False)
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
