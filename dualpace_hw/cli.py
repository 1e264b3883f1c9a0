"""`dualpace-hw`: measure a box (profile); the real runtime arrives with `run`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The real DualPace runtime and profiler (the hw extra).")


@app.callback()
def _commands() -> None:
    """Commands: profile (measure a box), run (serve a scenario for real)."""


INTERRUPTED_PROFILE = "interrupted; rerun the same command to resume the profile"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def profile(
    model: Annotated[str, typer.Option(help="built-in model name or a HF config.json path")],
    out: Annotated[Path, typer.Option(help="where to write, e.g. calibration/<box>/<model>.yaml")],
    box: Annotated[str, typer.Option(help="box name recorded in the profile")] = "this-box",
    quick: Annotated[bool, typer.Option(help="tiny grids and few repeats (tests)")] = False,
    cpu_cores: Annotated[int | None, typer.Option(help="CPU threads (and cores) to use")] = None,
    cpu_tp: Annotated[int, typer.Option(
        min=1, help="CPU tensor-parallel ranks: the sharded CPU stages are timed on this many "
                    "Gloo ranks at once, each on its share of the cores (rank-critical)")] = 1,
    gpu_tp: Annotated[int, typer.Option(
        min=1, help="GPU tensor-parallel ranks, one per GPU over NCCL: every GPU measurement "
                    "is taken on all of them at once, each with its shard of the layer, keeping "
                    "the slowest rank's time; the link is their aggregate")] = 1,
    gpu_kv_gib: Annotated[float | None, typer.Option(
        help="GPU KV budget (in all, over the --gpu-tp GPUs)")] = None,
    host_kv_gib: Annotated[float | None, typer.Option(help="host KV budget")] = None,
    gpu_device: Annotated[str, typer.Option(
        "--device", "--gpu-device", help="the GPU path's device: 'cuda', or 'cpu' for tests "
                                         "(--gpu-device is the older name)")] = "cuda",
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Measure every table of a calibration profile with the runtime's executors, write it with
    provenance, then fit its controls and plot them. Interrupted runs resume."""
    from dualpace_sim.costs.shapes import ModelShape

    from .arguments import (
        ArgumentError,
        check_cpu_cores,
        check_device,
        check_kv_gib,
        check_out_file,
    )
    from .profiler.run import Options, ProfileRunError, run_profile

    try:
        check_cpu_cores(cpu_cores)
        check_device(gpu_device, "--device")
        check_out_file(out)
        check_kv_gib(gpu_kv_gib, host_kv_gib)
    except ArgumentError as e:
        _fail(str(e))
    try:
        shape = (ModelShape.from_hf_config(model) if model.endswith(".json") or Path(model).is_dir()
                 else ModelShape.from_name(model))
    except (ValueError, OSError, KeyError) as e:
        _fail(f"--model {model}: {e}")
    opt = Options(shape=shape, out=out, box_name=box, quick=quick, gpu_device=gpu_device,
                  cpu_cores=cpu_cores, cpu_tp=cpu_tp, gpu_tp=gpu_tp, gpu_kv_gib=gpu_kv_gib,
                  host_kv_gib=host_kv_gib,
                  command=_command_line(locals()), progress=not quiet)
    try:
        result = run_profile(opt)
    except ProfileRunError as e:
        _fail(str(e))
    except KeyboardInterrupt:  # here, not in main(): typer turns it into a silent exit 130
        typer.echo(INTERRUPTED_PROFILE, err=True)
        raise typer.Exit(130) from None
    c = result.controls
    typer.echo(f"wrote {out}")
    for name in ("route_p", "route_f", "gpu_token_limit", "cpu_batch_limit"):
        typer.echo(f"{name}={getattr(c, name)}")


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML (its profile names the model)")],
    out: Annotated[str, typer.Option(help="directory for results")],
    device: Annotated[str, typer.Option(
        "--device", "--gpu-device", help="the GPU engine's device: 'cuda', or 'cpu' for tests "
                                         "(--gpu-device: the same, as `profile` once named "
                                         "it)")] = "cuda",
    cpu_cores: Annotated[int | None, typer.Option(help="cores for the CPU engine")] = None,
    cpu_tp: Annotated[int, typer.Option(
        min=1, help="CPU tensor-parallel ranks (processes over Gloo, splitting the heads and "
                    "the cores)")] = 1,
    gpu_tp: Annotated[int, typer.Option(
        min=1, help="GPU tensor-parallel ranks: the GPU engine on this many GPUs (one process "
                    "each, NCCL), heads and KV split")] = 1,
    trace_events: Annotated[Path | None, typer.Option(
        "--trace-events", metavar="FILE",
        help="also write a timeline trace (Chrome/Perfetto JSON, as `dualpace-sim run "
             "--trace-events` writes; one process per policy)")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        help="run only this of the scenario's policies; repeat it to run several, in the "
             "order given (default: the scenario's, in its order)")] = None,
) -> None:
    """Replay SCENARIO's workload in real time against the real runtime (DualPace and vLLM;
    NEO is simulated only) and write what `dualpace-sim run` writes."""
    from dualpace_sim.scenario import ScenarioError, load_scenario

    from .arguments import (
        ArgumentError,
        check_cpu_cores,
        check_device,
        check_host_kv,
        check_out_dir,
        check_out_file,
    )
    from .runtime import EngineFailure
    from .serve import run_real

    if not out.strip():
        _fail("--out: empty; give the directory for the results")
    out = Path(out)
    try:
        check_cpu_cores(cpu_cores)
        check_device(device, "--device")
        check_out_dir(out)
        if trace_events is not None:
            check_out_file(trace_events, "--trace-events")
    except ArgumentError as e:
        _fail(str(e))
    try:
        loaded = load_scenario(scenario)
        if "dualpace" in (policy or loaded.spec.policies):  # the one with a host pool
            check_host_kv(loaded.config.host_kv_blocks, loaded.config.block_size,
                          loaded.profile.model, str(scenario))
        summaries = run_real(loaded, out, device, cpu_cores, trace_events, cpu_tp, gpu_tp,
                             policy)
    except (ScenarioError, ValueError, EngineFailure) as e:  # ArgumentError is a ValueError
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("interrupted: the engines stopped and the CPU engine's process exited; "
                   f"what ran is in {out}/ (the stopped policy marked partial)", err=True)
        raise typer.Exit(130) from None
    for s in summaries:
        typer.echo(f"{s['policy']}: completed={s['completed']}/{s['submitted']} "
                   f"normalized_latency_s={s['normalized_latency_s']:.4g} "
                   f"p99_ttft_s={s['p99_ttft_s']:.4g} p99_itl_s={s['p99_itl_s']:.4g}")
    typer.echo(f"results in {out}/")


def _command_line(params: dict) -> str:
    """The profile command as a user would retype it, for the profile's provenance."""
    words = ["dualpace-hw", "profile"]
    flags = {"gpu_device": "--device"}  # the option's name where it is not the parameter's
    for name in ("model", "out", "box", "cpu_cores", "cpu_tp", "gpu_tp", "gpu_kv_gib",
                 "host_kv_gib", "gpu_device"):
        if params[name] is not None:
            words += [flags.get(name, f"--{name.replace('_', '-')}"), str(params[name])]
    return shlex.join(words + (["--quick"] if params["quick"] else []))


def main() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("dualpace-hw needs the hw extra: pip install -e \".[hw]\"\n")
        sys.exit(2)
    from dualpace_sim.cli import cost_warnings_as_notes, interrupt_on_termination

    cost_warnings_as_notes()
    interrupt_on_termination()
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_PROFILE + "\n")
        sys.exit(130)
