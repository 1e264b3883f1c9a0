"""`dualpace-sim traces`: list the registered public traces and download them into the cache.

Mount with ``app.add_typer(traces_app, name="traces")``. A failed download or checksum prints one
line saying what to download from where and where to put it, and exits with status 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dualpace_sim.workload.fetch import (
    AZURE_DIR_ENV,
    cache_path,
    default_cache_dir,
    file_sha256,
    local_copy,
    trace_path,
)
from dualpace_sim.workload.registry import TRACES, trace_entry
from dualpace_sim.workload.spec import WorkloadError

traces_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="List the public LLM request traces scenarios can name, and download them.")


@traces_app.command("list")
def list_traces() -> None:
    """Show each registered trace: size, local copy, description, license and whom to cite.

    A scenario replays one with `workload: {source: trace, trace: NAME}`.
    """
    for entry in TRACES.values():
        found = local_copy(entry)
        size = f"{found.stat().st_size / 1e6:.1f} MB" if found else entry.size
        cached = f"local copy at {found}" if found else "not cached"
        pinned = "sha256 pinned" if entry.sha256 else "sha256 not pinned"
        typer.echo(f"{entry.name}  ({size}, {cached}, {pinned})")
        typer.echo(f"    {entry.description}; {entry.format} format")
        typer.echo(f"    license: {entry.license}")
        typer.echo(f"    cite: {entry.attribution}")
    typer.echo(f"cache: {default_cache_dir()} (set XDG_CACHE_HOME to move it); download with "
               "`dualpace-sim traces fetch NAME`")


@traces_app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="a name from `dualpace-sim traces list`")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Download trace NAME into the cache (unless a good copy is there) and check its sha256."""
    try:
        entry = trace_entry(name)
        before = local_copy(entry)
        path = trace_path(name, progress=not quiet)
    except WorkloadError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if path != cache_path(entry):
        typer.echo(f"{name}: using {path} from ${AZURE_DIR_ENV}, taken as is")
    else:
        done = "already cached at" if before == path else f"downloaded {entry.url} to"
        typer.echo(f"{name}: {done} {path}")
        typer.echo(f"sha256 {entry.sha256} matches the pinned value" if entry.sha256 else
                   f"sha256 {file_sha256(path)}: NOT checked, the registry pins no checksum "
                   "for this trace; compare it with upstream's and pin it in "
                   "dualpace_sim/workload/registry.py")
    typer.echo(f"license: {entry.license}; cite: {entry.attribution}")
