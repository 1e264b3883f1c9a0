"""`dualpace-hw`: measure a box (profile), replay a scenario for real (run), serve clients over
HTTP (serve)."""

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
    """Commands: profile (measure a box), run (replay a scenario for real), serve (an
    OpenAI-compatible endpoint over a checkpoint), random-checkpoint (one to serve offline)."""


INTERRUPTED_PROFILE = "interrupted; rerun the same command to resume the profile"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def profile(
    out: Annotated[Path, typer.Option(help="where to write, e.g. calibration/<box>/<model>.yaml")],
    model: Annotated[str | None, typer.Option(
        help="built-in model name or a HF config.json path")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        metavar="DIR", help="a Hugging Face checkpoint folder instead of --model: its "
                            "config.json gives the shapes timed (values do not change timing, "
                            "so its weights are not read)")] = None,
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
    calibration: Annotated[bool, typer.Option(
        help="after the tables, serve a short DualPace workload and take Dense Assist's q_x, "
             "o_x from it (paper Appendix B); --no-calibration keeps the handshake's")] = True,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Measure every table of a calibration profile with the runtime's executors, write it with
    provenance, serve the Appendix B calibration workload, then fit its controls and plot them.
    Interrupted runs resume."""
    from dualpace_hw.arguments import (
        ArgumentError,
        check_cpu_cores,
        check_device,
        check_kv_gib,
        check_out_file,
    )
    from dualpace_hw.profiler.run import Options, ProfileRunError, run_profile
    from dualpace_sim.costs.shapes import ModelShape

    try:
        check_cpu_cores(cpu_cores)
        check_device(gpu_device, "--device")
        check_out_file(out)
        check_kv_gib(gpu_kv_gib, host_kv_gib)
    except ArgumentError as e:
        _fail(str(e))
    if (model is None) == (checkpoint is None):
        _fail("give one of --model (a name or a config.json) and --checkpoint (a folder)")
    if checkpoint is not None:
        from dualpace_hw.executors.checkpoint import CheckpointError, load_checkpoint

        try:
            shape = load_checkpoint(checkpoint).shape
        except CheckpointError as e:
            _fail(f"--checkpoint {checkpoint}: {e}")
    else:
        try:
            shape = (ModelShape.from_hf_config(model)
                     if model.endswith(".json") or Path(model).is_dir()
                     else ModelShape.from_name(model))
        except (ValueError, OSError, KeyError) as e:
            _fail(f"--model {model}: {e}")
    opt = Options(shape=shape, out=out, box_name=box, quick=quick, gpu_device=gpu_device,
                  cpu_cores=cpu_cores, cpu_tp=cpu_tp, gpu_tp=gpu_tp, gpu_kv_gib=gpu_kv_gib,
                  host_kv_gib=host_kv_gib, calibration=calibration,
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
    cpu_cores: Annotated[int | None, typer.Option(
        help="cores for the CPU engine (NEO: for its CPU attention's threads)")] = None,
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
    checkpoint: Annotated[Path | None, typer.Option(
        metavar="DIR", help="a Hugging Face checkpoint folder (config.json, *.safetensors, "
                            "tokenizer.json) whose weights to run, its shape the scenario's "
                            "model (default: seeded random weights; timing does not depend on "
                            "values)")] = None,
    cpu_check: Annotated[bool, typer.Option(
        "--cpu-check/--no-cpu-check",
        help="time the profiler's CPU stages at a few of the profile's grid points on the CPU "
             "engine's cores before and after each policy with a CPU engine (tens of seconds "
             "each on a full-size model): the summary's cpu_speed, at which `dualpace-sim "
             "validate` prices the run's CPU stages")] = True,
) -> None:
    """Replay SCENARIO's workload in real time against the real runtime (DualPace, vLLM and
    NEO, each on the runtime's executors) and write what `dualpace-sim run` writes."""
    from dualpace_hw.arguments import (
        ArgumentError,
        check_cpu_cores,
        check_device,
        check_host_kv,
        check_out_dir,
        check_out_file,
    )
    from dualpace_hw.profiler.cpu_check import cpu_speed_check
    from dualpace_hw.runtime.engines import EngineFailure
    from dualpace_hw.serving.serve import open_checkpoint, run_real
    from dualpace_sim.config.scenario import ScenarioError, load_scenario

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
        if {"dualpace", "neo"} & set(policy or loaded.spec.policies):  # host pools
            check_host_kv(loaded.config.host_kv_blocks, loaded.config.block_size,
                          loaded.profile.model, str(scenario))
        weights = None if checkpoint is None else open_checkpoint(checkpoint, loaded)
        summaries = run_real(loaded, out, device, cpu_cores, trace_events, cpu_tp, gpu_tp,
                             policy, weights, cpu_speed_check if cpu_check else None)
    except (ScenarioError, ValueError, EngineFailure) as e:  # ArgumentError is a ValueError
        _fail(str(e))
    except KeyboardInterrupt:
        typer.echo("interrupted: the engines stopped (a CPU engine's process with them); "
                   f"what ran is in {out}/ (the stopped policy marked partial)", err=True)
        raise typer.Exit(130) from None
    for s in summaries:
        typer.echo(f"{s['policy']}: completed={s['completed']}/{s['submitted']} "
                   f"normalized_latency_s={s['normalized_latency_s']:.4g} "
                   f"p99_ttft_s={s['p99_ttft_s']:.4g} p99_itl_s={s['p99_itl_s']:.4g}")
    typer.echo(f"results in {out}/")


@app.command()
def serve(
    scenario: Annotated[Path, typer.Argument(
        help="scenario YAML: its profile and scheduler size the pools and fit the controls "
             "(its workload is not used: clients send the requests)")],
    checkpoint: Annotated[Path, typer.Option(
        metavar="DIR", help="the Hugging Face checkpoint folder to serve (config.json, "
                            "*.safetensors, tokenizer.json; its shape the scenario's model)")],
    out: Annotated[Path, typer.Option(
        help="directory for the served run's results, written when the server stops")],
    policy: Annotated[str, typer.Option(help="dualpace or vllm (one of the scenario's)")] = (
        "dualpace"),
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8000,
    model_name: Annotated[str | None, typer.Option(
        help="the model's name in the API (default: the checkpoint folder's name)")] = None,
    device: Annotated[str, typer.Option(help="'cuda', or 'cpu' for tests")] = "cuda",
    cpu_cores: Annotated[int | None, typer.Option(help="cores for the CPU engine")] = None,
    cpu_tp: Annotated[int, typer.Option(
        min=1, help="CPU tensor-parallel ranks (processes over Gloo)")] = 1,
    dtype: Annotated[str, typer.Option(
        help="bfloat16, or float32 (tests compare tokens exactly)")] = "bfloat16",
    default_max_tokens: Annotated[int, typer.Option(
        min=1, help="a chat request's max_tokens when it gives none")] = 256,
) -> None:
    """Serve CHECKPOINT over an OpenAI-compatible HTTP API (/v1/completions,
    /v1/chat/completions, /v1/models, /health, /metrics) on the real runtime, until SIGTERM or
    Ctrl-C; then write what `run` writes, and served.yaml for `dualpace-sim validate`."""
    import torch

    from dualpace_hw.runtime.engines import EngineFailure
    from dualpace_hw.serving.serve import serve_real
    from dualpace_sim.config.scenario import ScenarioError, load_scenario

    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype not in dtypes:
        _fail(f"--dtype {dtype}: choose bfloat16 or float32")
    try:
        summary = serve_real(load_scenario(scenario), checkpoint, out, policy, host, port,
                             device, cpu_cores, cpu_tp, dtypes[dtype], model_name,
                             default_max_tokens)
    except (ScenarioError, ValueError, EngineFailure) as e:
        _fail(str(e))
    if summary is not None:
        typer.echo(f"{policy}: served {summary['submitted']} requests "
                   f"(completed={summary['completed']}); results in {out}/")


@app.command("random-checkpoint")
def random_checkpoint(
    model: Annotated[str, typer.Option(help="built-in model name or a HF config.json path")],
    out: Annotated[Path, typer.Option(help="the checkpoint folder to write")],
    seed: Annotated[int, typer.Option(help="seed of the random weights")] = 0,
    device: Annotated[str, typer.Option(
        help="where to draw the weights ('cuda' is much faster for billions)")] = "cpu",
) -> None:
    """Write a Hugging Face checkpoint folder of MODEL's shape with seeded random bf16 weights
    and a small tokenizer trained here: what `serve` needs on a box that cannot download one
    (the text is noise; the timing is the model's)."""
    from dualpace_hw.executors.checkpoint import write_random_checkpoint
    from dualpace_sim.costs.shapes import ModelShape

    try:
        shape = (ModelShape.from_hf_config(model) if model.endswith(".json")
                 else ModelShape.from_name(model))
    except (ValueError, OSError, KeyError) as e:
        _fail(f"--model {model}: {e}")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out}: not empty; give a new folder")
    write_random_checkpoint(shape, out, seed, device)
    typer.echo(f"wrote {out}/ (config.json, model.safetensors, tokenizer.json)")


def _command_line(params: dict) -> str:
    """The profile command as a user would retype it, for the profile's provenance."""
    words = ["dualpace-hw", "profile"]
    flags = {"gpu_device": "--device"}  # the option's name where it is not the parameter's
    for name in ("model", "checkpoint", "out", "box", "cpu_cores", "cpu_tp", "gpu_tp", "gpu_kv_gib",
                 "host_kv_gib", "gpu_device"):
        if params[name] is not None:
            words += [flags.get(name, f"--{name.replace('_', '-')}"), str(params[name])]
    return shlex.join(words + (["--quick"] if params["quick"] else [])
                      + ([] if params["calibration"] else ["--no-calibration"]))


def main() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("dualpace-hw needs the hw extra: pip install -e \".[hw]\"\n")
        sys.exit(2)
    from dualpace_sim.common.cli_support import (
        cost_warnings_as_notes,
        interrupt_on_termination,
        run_app,
    )

    cost_warnings_as_notes()
    interrupt_on_termination()
    try:
        run_app(app, "dualpace-hw")
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_PROFILE + "\n")
        sys.exit(130)
