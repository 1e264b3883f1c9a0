"""`dualpace-sim`: what-if studies of GPU+CPU cooperative serving."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from dualpace_sim.cli.profile import profile_app
from dualpace_sim.cli.traces import traces_app
from dualpace_sim.common.cli_support import (
    cost_warnings_as_notes,
    interrupt_on_termination,
    run_app,
)
from dualpace_sim.config.scenario import ScenarioError
from dualpace_sim.sim import SimulationStalled

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate GPU+CPU cooperative LLM serving (DualPace).")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _out_dir(out: str, option: str = "--out") -> Path:
    """A results folder given on the command line: not empty (typer would read '' as the
    current directory) and not an existing file."""
    if not out.strip():
        _fail(f"{option}: empty; give the directory for the results")
    path = Path(out)
    if path.exists() and not path.is_dir():
        _fail(f"{option} {out}: is a file; give a directory for the results")
    return path


def _trace_file(path: Path) -> None:
    """Refuse a --trace-events path that cannot take a trace, before simulating anything."""
    if path.is_dir():
        _fail(f"--trace-events {path}: is a directory; give a file such as {path / 'trace.json'}")
    if path.exists() and not path.is_file():
        _fail(f"--trace-events {path}: not a regular file; give a file such as trace.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--trace-events {path}: cannot create its folder: {e.strerror} ({e.filename})")


def _write_error(e: OSError, out: Path) -> str:
    """One line for a failed write of results into `out`; Arrow's errors carry no file name."""
    reason = e.strerror or (str(e).splitlines() or [type(e).__name__])[0]
    return f"{e.filename or out}: cannot write the results: {reason}"


def _notes(notes: list[str]) -> None:
    """Notes go to stderr, with --quiet too: they qualify the results, as warnings would."""
    for note in notes:
        typer.echo(f"note: {note}", err=True)


class CpuSpeedSource(enum.StrEnum):
    """Where `validate` takes the CPU engine's speed from."""

    run = "run"
    profile = "profile"


SET_HELP = ("change a scenario field without editing the file: a dotted key and a YAML value, "
            "e.g. --set scheduler.host_kv_blocks=4096 --set workload.rate=3 (repeat); checked "
            "as if written in the file")


def _changes(items: list[str] | None) -> dict:
    """The nested changes of repeated --set options; a malformed one fails with exit 2."""
    from dualpace_sim.config.overrides import OverrideError, parse_set

    try:
        return parse_set(items or [])
    except OverrideError as e:
        _fail(str(e))


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    out: Annotated[str, typer.Option("--out", "-o", help="directory for results")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar or table")] = False,
    trace_events: Annotated[Path | None, typer.Option(
        "--trace-events", metavar="FILE",
        help="also write a timeline trace (Chrome/Perfetto JSON; open it in ui.perfetto.dev or "
             "chrome://tracing): GPU rounds, CPU rounds, Dense Assists, PCIe transfers and "
             "migration arrows. Each policy of the scenario is one process in FILE. Large: tens "
             "of MB for 2,000 requests")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                   help=SET_HELP)] = None,
) -> None:
    """Simulate every policy of SCENARIO; write requests.parquet, summary.json, timeline plot."""
    from dualpace_sim.experiments.runner import run_scenario

    out = _out_dir(out)
    changes = _changes(set_)

    if trace_events is not None:  # fail before simulating, not after the first policy
        _trace_file(trace_events)
    try:
        result = run_scenario(scenario, out, progress=not quiet, trace_events=trace_events,
                              changes=changes)
    except (ScenarioError, SimulationStalled) as e:
        _fail(str(e))
    except OSError as e:  # reading is checked by the scenario's loader: this is writing
        _fail(_write_error(e, out))
    except KeyboardInterrupt:  # here, not in main(): typer turns it into a silent exit 130
        typer.echo(f"interrupted; the policies that finished are in {out}/", err=True)
        raise typer.Exit(130) from None
    _notes(result.notes)
    if quiet:
        return
    keys = ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s", "throughput_tok_s")
    for s in result.summaries:
        values = "  ".join(f"{k}={s[k]:.4g}" for k in keys)
        typer.echo(f"{s['policy']}: completed={s['completed']}/{s['submitted']}  {values}")
    typer.echo(f"results in {out}/ (requests.parquet, summary.json, timeline.png)")
    if trace_events is not None:
        typer.echo(f"timeline trace in {trace_events} (open in ui.perfetto.dev)")


@app.command()
def sweep(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file with a sweep section")],
    out: Annotated[str, typer.Option("--out", "-o", help="directory for the sweep")],
    workers: Annotated[int | None, typer.Option(
        "--workers", "-j",
        help="worker processes (default: CPU count); with --ray, the most points running at once "
             "(default: as many as the cluster has CPUs for)")] = None,
    restart: Annotated[bool, typer.Option(
        "--restart", help="discard what OUT holds from an earlier sweep and start over")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar or table")] = False,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS",
        help="compute the points as Ray tasks instead of local processes: 'local' starts Ray on "
             "this machine for the sweep, 'auto' joins the cluster `ray start` runs here, "
             "ray://HOST:10001 a remote cluster (its nodes need this package installed, not "
             "the scenario's files). Same results, byte for byte, as without it. Needs "
             "pip install -e \".\\[ray]\"")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                   help=SET_HELP)] = None,
) -> None:
    """Run every (policy, rate, grid setting, seed) point of SCENARIO's sweep in parallel;
    rerun to resume.

    Writes OUT/points/<policy>@<rate>[,<key>=<value>...]/ as points finish, then sweep.csv,
    sustainable.csv and, with seeds, sweep_ci.csv. The points run in local worker processes,
    or with --ray ADDRESS on a Ray cluster.
    """
    from dualpace_sim.experiments.executors import ExecutorUnavailable
    from dualpace_sim.experiments.sweep import (
        SweepError,
        SweepInterrupted,
        format_sustainable,
        run_sweep,
    )

    out = _out_dir(out)
    changes = _changes(set_)
    try:
        result = run_sweep(scenario, out, workers=workers, restart=restart, progress=not quiet,
                           ray=ray, changes=changes)
    except (ScenarioError, SweepError, ExecutorUnavailable) as e:
        _fail(str(e))
    except OSError as e:
        _fail(_write_error(e, out))
    except SweepInterrupted as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(130) from None
    _notes(result.notes)
    if not quiet:
        done = sum(p.status == "done" for p in result.points)
        skipped = sum(p.status == "skipped" for p in result.points)
        typer.echo(f"{result.name}: {len(result.points)} points ({done} computed, {skipped} "
                   f"already finished, {len(result.failed)} failed) in {result.wall_s:.1f}s")
        if not result.sustainable.empty:
            typer.echo(format_sustainable(result.sustainable, result.table["rate"]))
        typer.echo(f"results in {out}/ (sweep.csv, sustainable.csv, points/); "
                   f"figures: dualpace-sim plot {out}")
    if result.failed:
        for p in result.failed:
            typer.echo(f"error: point {p.name} failed: {p.error} "
                       f"(traceback in {out / 'points' / p.name / 'error.txt'})", err=True)
        advice = ("the stalls are deterministic: the same command stalls again; see "
                  "docs/liveness.md" if all(p.stalled for p in result.failed) else
                  "rerun the same command to retry the failed ones")
        typer.echo(f"error: {len(result.failed)} of {len(result.points)} points failed; the CSVs "
                   f"cover the others; {advice}", err=True)
        raise typer.Exit(1)


@app.command()
def capacity(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    low: Annotated[float, typer.Option("--low", help="lowest offered rate to search, req/s")
                   ] = 0.25,
    high: Annotated[float, typer.Option("--high", help="highest offered rate to search, req/s")
                    ] = 32.0,
    tol: Annotated[float, typer.Option("--tol", help="stop when the bracket is this narrow, "
                                                     "req/s")] = 0.05,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="also write DIR/capacity.csv")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                   help=SET_HELP)] = None,
) -> None:
    """The highest offered rate at which each policy of SCENARIO meets every target, found by
    bisection between --low and --high to within --tol."""
    from dualpace_sim.experiments.capacity import capacity as find_capacity
    from dualpace_sim.experiments.capacity import format_capacity

    changes = _changes(set_)
    try:
        table = find_capacity(scenario, changes, low=low, high=high, tol=tol)
    except ScenarioError as e:
        _fail(str(e))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "capacity.csv", index=False)
    typer.echo(format_capacity(table, tol))


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(
        help="a run directory (requests.parquet and summary.json), such as a sweep's point")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="directory for the files (default RUN_DIR)")] = None,
    format_: Annotated[str, typer.Option(
        "--format", help="the layout: vllm (the result JSON of vLLM's serving benchmark, "
                         "`vllm bench serve --save-result`)")] = "vllm",
) -> None:
    """Write each policy's results of RUN_DIR in another tool's layout: vllm-<policy>.json."""
    import json

    from dualpace_sim.results.records import read_records
    from dualpace_sim.results.vllm_export import vllm_result

    if format_ != "vllm":
        _fail(f"--format {format_!r}: the one layout is vllm")
    try:
        summaries = json.loads((run_dir / "summary.json").read_text())
        records = read_records(run_dir / "requests.parquet")
    except (OSError, ValueError) as e:
        _fail(f"{run_dir}: not a run directory ({str(e).splitlines()[0]})")
    if not isinstance(summaries, list):
        _fail(f"{run_dir / 'summary.json'}: not a run's summary (a list of policies); rerun it "
              f"with this version")
    target = out or run_dir
    target.mkdir(parents=True, exist_ok=True)
    for s in summaries:
        frame = records[records["policy"] == s["policy"]].reset_index(drop=True)
        path = target / f"vllm-{s['policy']}.json"
        path.write_text(json.dumps(vllm_result(frame, s), indent=2) + "\n")
        typer.echo(f"{s['policy']}: {path}")


@app.command()
def plot(
    dirs: Annotated[list[Path], typer.Argument(
        help="a sweep directory (has sweep.csv) or a run directory (has requests.parquet and "
             "summary.json); several sweep directories with --compare")],
    compare: Annotated[bool, typer.Option(
        "--compare", help="overlay several sweep directories in one figure")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="directory for the figures (default DIR/plots; needed with "
                            "--compare)")] = None,
    label: Annotated[list[str] | None, typer.Option(
        "--label", "-l", help="legend label per directory with --compare (repeat; default: "
                              "directory names)")] = None,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="offered rate of the sweep's timeline figure (default: highest rate "
                       "where every policy meets the normalized-latency target)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print nothing on success")] = False,
) -> None:
    """Draw figures (PNG and PDF) of a sweep directory, a run directory, or compare sweeps."""
    from dualpace_sim.plots.dirs import is_run_dir, plot_compare_dirs, plot_run_dir, plot_sweep_dir
    from dualpace_sim.results.sweep_dir import is_sweep_dir

    for d in dirs:
        if not (is_sweep_dir(d) or (not compare and is_run_dir(d))):
            wanted = ("a sweep directory (with sweep.csv)" if compare else
                      "a sweep directory (with sweep.csv) or a run directory (with "
                      "requests.parquet and summary.json)")
            _fail(f"{d}: not {wanted}")
    try:
        if compare:
            if out is None:
                _fail("plot --compare: give --out DIR for the comparison figures")
            report = plot_compare_dirs(dirs, label, out)
        else:
            if len(dirs) != 1:
                _fail("plot: give one directory, or several sweep directories with --compare")
            if label:
                _fail("plot: --label goes with --compare")
            if is_sweep_dir(dirs[0]):
                report = plot_sweep_dir(dirs[0], out, rate)
            else:
                if rate is not None:
                    _fail("plot: --rate applies to sweep directories")
                report = plot_run_dir(dirs[0], out)
    except (ValueError, OSError) as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if quiet:
        return
    for line in report.lines:
        typer.echo(line)
    folders = sorted({str(f.parent) for f in report.files})
    typer.echo(f"{len(report.files)} figure files in {', '.join(folders)}/: "
               + ", ".join(sorted({f.stem for f in report.files})))


@app.command()
def validate(
    scenario: Annotated[Path, typer.Argument(help="the scenario YAML the real run used")],
    real: Annotated[Path, typer.Option(
        "--real", help="directory of a real run (`dualpace-hw run --out DIR`)")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="directory for the comparison (default REAL/validation)")] = None,
    costs: Annotated[Path | None, typer.Option(
        "--costs", help="price the run with this profile of the same box and model (say, a "
                        "re-profile) instead of the one it ran with; the run's controls are kept")
    ] = None,
    max_rel_error: Annotated[str | None, typer.Option(
        "--max-rel-error", metavar="FRACTION",
        help="fail (exit 1) when a headline metric of any policy is further off than this: "
             "throughput and mean normalized latency at FRACTION, P99 TTFT, P99 ITL and P99 "
             "TPOT at twice it (0.1: 10 % and 20 %)")] = None,
    limit: Annotated[list[str] | None, typer.Option(
        "--limit", metavar="METRIC=FRACTION",
        help="one metric's limit instead (repeat; any metric of the table, such as "
             "p99_ttft_s=0.3 or cpu_token_fraction=0.1); alone, only these are checked")] = None,
    cpu_speed: Annotated[CpuSpeedSource, typer.Option(
        "--cpu-speed",
        help="run: price the CPU engine's stages at the speed the run measured its cores at "
             "against the profile (its summary's cpu_speed, checked before and after each "
             "policy with a CPU engine; runs without it are priced as profiled); profile: "
             "always as profiled")] = CpuSpeedSource.run,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="no progress bar or table; misses are still printed and still "
                              "exit 1")] = False,
) -> None:
    """Simulate SCENARIO for each policy of the real run in REAL and compare them: a table of
    simulated vs real per metric (validation.csv), the simulated run (sim/) and overlay plots.

    Exit status: 0 when the comparison was made (and every checked metric is within its limit),
    1 when a metric misses its limit or the replay check diverges, 2 on bad input."""
    from dualpace_sim.validation.limits import describe, find_misses, parse_limits
    from dualpace_sim.validation.validate import ValidateError, format_table
    from dualpace_sim.validation.validate import validate as run_validation

    try:
        limits = parse_limits(max_rel_error, limit or [])  # before minutes of simulation
        result = run_validation(real, scenario, out, progress=not quiet, costs=costs,
                                cpu_speed=cpu_speed.value)
    except (ScenarioError, SimulationStalled, ValidateError) as e:
        _fail(str(e))
    diverged = [r for r in result.replays if not r.ok]
    misses = find_misses(result.table, limits)
    if not quiet:
        typer.echo(format_table(result.table))
        for line in result.notes:
            typer.echo(line)
        for report in result.replays:
            typer.echo(f"replay check: {report.line()}")
        typer.echo(f"results in {result.out_dir}/ (validation.csv, sim/, timeline_overlay.png, "
                   f"latency_cdf_overlay.png)")
    if diverged and quiet:  # --quiet too: a DIVERGED replay is a failed check, printed or not
        typer.echo(f"error: replay check: {diverged[0].line().splitlines()[0]}", err=True)
    checks = len(limits) * result.table["policy"].nunique()
    for miss in misses:
        typer.echo(miss.line(), err=True)
    if misses:
        typer.echo(f"validation failed: {len(misses)} of {checks} checks outside their limits "
                   f"({describe(limits)})", err=True)
    elif limits and not quiet:
        typer.echo(f"within limits: all {checks} checks ({describe(limits)})")
    if diverged or misses:
        raise typer.Exit(1)


app.add_typer(profile_app, name="profile", help="Inspect a calibration profile and fit its "
              "controls (routing thresholds P/F, GPU token limit, CPU batch limit).")
app.add_typer(traces_app, name="traces", help="List the public LLM request traces scenarios can "
              "replay (Azure 2023/2024, Vidur, Mooncake) and download them into the cache.")


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as v

    typer.echo(v("dualpace"))


def main() -> None:
    cost_warnings_as_notes()
    interrupt_on_termination()
    try:
        run_app(app, "dualpace-sim")
    except KeyboardInterrupt:
        typer.echo("interrupted; results written so far are kept", err=True)
        sys.exit(130)
