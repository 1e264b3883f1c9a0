"""`dualpace-sim`: what-if studies of GPU+CPU cooperative serving."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .scenario import ScenarioError
from .sim import SimulationStalled

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate GPU+CPU cooperative LLM serving (DualPace).")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    out: Annotated[Path, typer.Option("--out", "-o", help="directory for results")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar or table")] = False,
) -> None:
    """Simulate every policy of SCENARIO; write requests.parquet, summary.json, timeline plot."""
    from .runner import run_scenario

    try:
        summaries = run_scenario(scenario, out, progress=not quiet)
    except (ScenarioError, SimulationStalled) as e:
        _fail(str(e))
    if quiet:
        return
    keys = ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s", "throughput_tok_s")
    for s in summaries:
        values = "  ".join(f"{k}={s[k]:.4g}" for k in keys)
        typer.echo(f"{s['policy']}: completed={s['completed']}/{s['submitted']}  {values}")
    typer.echo(f"results in {out}/ (requests.parquet, summary.json, timeline.png)")


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as v

    typer.echo(v("dualpace"))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted; results written so far are kept", err=True)
        sys.exit(130)
