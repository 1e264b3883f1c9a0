"""`dualpace-sim profile`: inspect a calibration profile and fit its controls (paper §4.3).

Mount with ``app.add_typer(profile_app, name="profile")``. Bad input (a missing file, a profile
that fails validation, values in the wrong unit) prints one line naming the file and the field,
and exits with status 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
import yaml

from dualpace_sim.costs.profile import (
    Profile,
    ProfileError,
    Table1D,
    Table2D,
    check_magnitudes,
    load_profile,
)

profile_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Inspect calibration profiles and fit their controls (paper \u00a74.3).")

# What each table's axes count, for `show`.
_AXES = {
    "gpu.pre_attn": ("tokens",), "gpu.post_attn": ("tokens",),
    "gpu.prefill_attn": ("chunk tokens", "context tokens"),
    "gpu.decode_attn": ("requests", "total context tokens"),
    "gpu.pre_layer": ("tokens",), "gpu.post_layer": ("rows",), "gpu.rank_round": ("rows",),
    "cpu.decode_attn": ("requests", "total context tokens"),
}
_WHOLE_MODEL = {"gpu.pre_layer", "gpu.post_layer", "cpu.pre_layer", "cpu.post_layer"}
_PER_ROUND = {"gpu.rank_round"}


def _fail(message: str) -> None:
    typer.echo(f"error: {message.splitlines()[0] if message else 'failed'}", err=True)
    raise typer.Exit(2)


def _load(path: Path) -> Profile:
    """Load, validate and unit-check a profile, or fail with one line naming file and field."""
    if not path.exists():
        _fail(f"{path}: no such profile file")
    if not path.is_file():
        _fail(f"{path}: not a file")
    try:
        profile = load_profile(path)
        check_magnitudes(profile, str(path))
    except ProfileError as e:
        _fail(_scenario_hint(path) or str(e))
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}")
    return profile


def _scenario_hint(path: Path) -> str | None:
    """When ``path`` is a scenario rather than a profile, the line that says so and names its
    profile; None otherwise."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict) or "format" in doc or "workload" not in doc:
        return None
    if isinstance(doc.get("profile"), str):
        named = Path(doc["profile"]).expanduser()
        named = Path(os.path.normpath(named if named.is_absolute() else path.parent / named))
        return (f"{path}: a scenario, not a profile; its profile is {named} (give that file, "
                f"or `dualpace-sim run {path}` to simulate the scenario)")
    return (f"{path}: a scenario, not a profile; it synthesizes a roofline profile (write one "
            f"with python -m dualpace_sim.costs.roofline)")


def _seconds(v: float) -> str:
    if v == 0:
        return "0 s"
    if v < 1e-3:
        return f"{v * 1e6:.4g} \u00b5s"
    if v < 1:
        return f"{v * 1e3:.4g} ms"
    return f"{v:.4g} s"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _range(values: list[float]) -> str:
    return f"{values[0]:g}..{values[-1]:g} ({len(values)} points)"


def _table_lines(profile: Profile) -> list[str]:
    lines = []
    for section in ("gpu", "cpu", "assist"):
        for name, value in getattr(profile, section):
            key = f"{section}.{name}"
            axes = _AXES.get(key, ("batch",) if section != "gpu" else ("tokens",))
            scope = ("whole model" if key in _WHOLE_MODEL
                     else "per round" if key in _PER_ROUND else "per layer")
            if isinstance(value, Table1D):
                lines.append(f"  {key:<18} x: {axes[0]} {_range(value.x)}; y: "
                             f"{_seconds(min(value.y))}..{_seconds(max(value.y))} ({scope})")
            elif isinstance(value, Table2D):
                flat = [v for row in value.z for v in row]
                lines.append(f"  {key:<18} x: {axes[0]} {_range(value.x)}; y: {axes[1]} "
                             f"{_range(value.y)}; z: {_seconds(min(flat))}..{_seconds(max(flat))}"
                             f" ({scope})")
    return lines


@profile_app.command()
def show(
    profile: Annotated[Path, typer.Argument(help="calibration profile (YAML or JSON)")],
) -> None:
    """Summarize PROFILE: provenance, model, box, capacities, tables, link, assist constants,
    controls."""
    from dualpace_sim.costs.model import CostModel

    p = _load(profile)
    cm = CostModel(p)
    pv, m, box = p.provenance, p.model, p.box
    typer.echo(f"file: {profile}")
    where = pv.host or pv.spec_name or "?"
    extra = f", generator {pv.generator_version}" if pv.generator_version else ""
    typer.echo(f"provenance: {pv.method} on {pv.date} ({where}{extra})"
               + ("  -- NOT a measurement" if pv.method == "roofline" else ""))
    for label, value in (("command", pv.command), ("notes", pv.notes),
                         ("versions", ", ".join(f"{k} {v}" for k, v in (
                             ("torch", pv.torch_version), ("CUDA", pv.cuda_version),
                             ("oneDNN", pv.onednn_version)) if v))):
        if value:
            typer.echo(f"  {label}: {value}")
    if pv.efficiency:
        typer.echo("  efficiency: " + ", ".join(f"{k} {v:g}" for k, v in pv.efficiency.items()))
    typer.echo(f"model: {m.name}: {m.n_layers} layers, hidden {m.hidden_size}, heads "
               f"{m.n_heads} (kv {m.n_kv_heads}) x {m.head_dim}, ffn {m.intermediate_size}, vocab "
               f"{m.vocab_size}, {m.dtype_bytes}-byte weights, KV "
               f"{m.kv_bytes_per_token / 1024:g} KiB/token")
    cores = f"{box.cpu_cores} cores"
    typer.echo(f"box: {box.name}: {box.gpu_count} x {box.gpu} (TP {box.tensor_parallel}), "
               f"{box.cpu}" + ("" if cores in box.cpu else f" ({cores})")
               + (f", CPU TP {box.cpu_tensor_parallel}" if box.cpu_tensor_parallel > 1 else ""))
    typer.echo(f"block_size: {p.block_size} tokens ({cm.kv_block_bytes / 2**20:g} MiB per block)")
    gpu_blocks, host_blocks = p.gpu.kv_capacity_blocks, p.cpu.kv_capacity_blocks
    typer.echo(f"kv capacity: GPU {gpu_blocks} blocks ({_gib(gpu_blocks * cm.kv_block_bytes)}), "
               f"host {host_blocks} blocks ({_gib(host_blocks * cm.kv_block_bytes)})")
    typer.echo(f"iteration overhead: GPU {_seconds(p.gpu.iteration_overhead_s)}, CPU "
               f"{_seconds(p.cpu.iteration_overhead_s)}")
    typer.echo("tables (seconds):")
    for line in _table_lines(p):
        typer.echo(line)
    link = p.link
    typer.echo(f"link: H2D {link.h2d_bytes_per_s / 1e9:.4g} GB/s, D2H "
               f"{link.d2h_bytes_per_s / 1e9:.4g} GB/s, latency {_seconds(link.latency_s)}")
    a = p.assist
    typer.echo("assist: q = {" + ", ".join(f"{k}: {_seconds(v)}" for k, v in a.q) + "}, o = {"
               + ", ".join(f"{k}: {_seconds(v)}" for k, v in a.o) + f"}}, poll "
               f"{_seconds(a.poll_s)}")
    typer.echo(f"neo: launch {_seconds(p.neo.launch_s)}")
    c = p.controls
    if c is None:
        typer.echo("controls: none (fit them with `dualpace-sim profile fit`)")
    else:
        values = ", ".join(f"{k}={getattr(c, k)}" for k in
                           ("route_p", "route_f", "gpu_token_limit", "cpu_batch_limit")
                           if getattr(c, k) is not None)
        typer.echo(f"controls: {values or 'none'}")
        if c.fit is not None:
            f = c.fit
            cap = (f", max_iteration_s {f.max_iteration_s:g} at context {f.iteration_context}"
                   if f.max_iteration_s is not None else "")
            typer.echo(f"  fitted {f.date}: epsilon {f.epsilon:g}, lambda_gpu {f.lambda_gpu:g}, "
                       f"k {f.k}, delta {f.delta:g}{cap}")


@profile_app.command()
def fit(
    profile: Annotated[Path, typer.Argument(help="calibration profile (YAML or JSON)")],
    epsilon: Annotated[float, typer.Option(
        min=0, help="regret tolerance of Algorithm 1 (paper: 0.25% = 0.0025)")] = 0.0025,
    lambda_gpu: Annotated[float, typer.Option(
        min=0, help="weight of displaced GPU-main service in the routing score")] = 1.0,
    k: Annotated[int, typer.Option(
        "--k", min=1, help="fitted points averaged into the GPU throughput plateau")] = 5,
    delta: Annotated[float, typer.Option(
        min=0, max=0.999, help="relative distance from the plateau / best throughput")] = 0.01,
    max_iteration_s: Annotated[float | None, typer.Option(
        min=0, help="latency-oriented CPU batch limit: cap it at the largest batch whose CPU "
                    "iteration (all layers) stays under this many seconds")] = None,
    iteration_context: Annotated[int, typer.Option(
        min=1, help="context tokens per request for --max-iteration-s")] = 1024,
    out_dir: Annotated[Path | None, typer.Option(
        help="directory for the figure (default: beside the profile)")] = None,
    write: Annotated[bool, typer.Option(
        "--write", help="store the fitted controls (and the fit parameters) into PROFILE")] = False,
    figure: Annotated[bool, typer.Option(
        "--figure/--no-figure", help="draw the Figure 7 panels")] = True,
) -> None:
    """Fit (P, F), the GPU batched-token limit and the CPU decode batch limit of PROFILE; draw
    Figure 7 as <stem>-fit.png/.pdf; the last four lines are name=value."""
    from dualpace_sim.costs.fit import FitError, fit_controls, with_controls
    from dualpace_sim.plots.fit import plot_fit

    p = _load(profile)
    try:
        result = fit_controls(p, epsilon=epsilon, lambda_gpu=lambda_gpu, k=k, delta=delta,
                              max_iteration_s=max_iteration_s,
                              iteration_context=iteration_context)
    except (FitError, ValueError) as e:
        _fail(f"{profile}: fit: {e}")
    r, ch = result.routing, result.thresholds
    typer.echo(f"profile: {profile} ({result.label}, {p.provenance.method})")
    bs = r.batch_sizes
    typer.echo(f"routing: B = {len(bs)} batch sizes {bs[0]}..{bs[-1]}, N = {r.n_layers}; exact "
               f"minimum (P, F) = ({ch.best.p}, {ch.best.f}) at {ch.best.score * 1e3:.4g} ms; "
               f"chosen ({ch.p}, {ch.f}) at {ch.score * 1e3:.4g} ms (+{ch.regret:.3%}), "
               f"{ch.avg_calls:.3g} assist calls per batch on average, {len(ch.window)} of "
               f"{len(ch.candidates)} candidates within epsilon")
    local, assisted = r.post_attn_local(), r.post_attn_assisted()
    cross = r.post_attn_crossover()
    if cross == bs[0]:
        where = "Dense Assist is cheaper at every profiled b"
    elif cross is None:
        where = "CPU-local is cheaper even at the largest profiled b"
    else:
        where = f"Dense Assist becomes cheaper from b = {cross}"
    typer.echo(f"post-attention crossover (t_p vs t\u0304_p + \u03bb\u00b7d_p): {where} "
               f"(b={bs[0]}: {local[0] * 1e3:.4g} vs {assisted[0] * 1e3:.4g} ms; b={bs[-1]}: "
               f"{local[-1] * 1e3:.4g} vs {assisted[-1] * 1e3:.4g} ms)")
    pf = result.prefill.fit
    typer.echo(f"gpu prefill: plateau {pf.plateau / 1e3:.4g} K tokens/s (last {pf.k} fitted of n "
               f"= {pf.tokens[0]}..{pf.tokens[-1]}); earliest n within {pf.delta:.3g} of it: "
               f"{pf.limit}")
    c = result.cpu
    per_ctx = ", ".join(f"{ctx}: {b}" for ctx, b in zip(c.contexts, c.pick.best_per_context,
                                                         strict=True))
    typer.echo(f"cpu decode: best b per context ({per_ctx}); best mean-normalized b "
               f"{c.pick.best}; smallest within {c.delta:.3g}: {c.pick.limit}")
    if c.latency_limit is not None:
        typer.echo(f"cpu latency cap: largest b with a CPU iteration <= {c.max_iteration_s:g} s "
                   f"at {c.iteration_context} context tokens: {c.latency_limit}")
    if figure:
        stem = (out_dir if out_dir is not None else profile.parent) / f"{profile.stem}-fit"
        try:
            files = plot_fit(result, stem)
        except OSError as e:
            _fail(f"{stem}: cannot write the figure: {e.strerror or e}")
        typer.echo("figure: " + ", ".join(str(f) for f in files))
    if write:
        try:
            with_controls(p, result).save(profile)
        except OSError as e:
            _fail(f"{profile}: cannot write: {e.strerror or e}")
        typer.echo(f"wrote controls into {profile}")
    for line in result.lines():
        typer.echo(line)


@profile_app.command()
def calibrate(
    profile: Annotated[Path, typer.Argument(help="the box's calibration profile")],
    run: Annotated[list[Path], typer.Option(
        "--run", help="a `dualpace-hw run --out` directory of DualPace on this box (repeat "
                      "for several); its assists-dualpace.csv.gz holds every Dense Assist")],
    out: Annotated[Path | None, typer.Option(
        help="write the calibrated profile here (default: print only)")] = None,
    write: Annotated[bool, typer.Option(
        "--write", help="store the calibrated q and o (and the refitted controls) into "
                        "PROFILE")] = False,
    scenario: Annotated[Path | None, typer.Option(
        help="the scenario the runs served, to price their GPU rounds for the served "
             "iteration overhead (default: each run's ../scenario.yaml, as `dualpace-hw "
             "profile` lays out its calibration passes; without one the overhead is kept)")
    ] = None,
) -> None:
    """Dense Assist's q_x and o_x from serving runs (paper Appendix B end-to-end calibration):
    per path and batch-row group, Q = mean [W - G]+ and O = mean (L + F); q, o the groups'
    equal-weight means. With the runs' scenario, also the GPU iteration overhead as served
    (their decode-only rounds with the CPU engine idle). Prints the groups, q and o before and
    after, and the (P, F) Algorithm 1 then fits; writes the profile, controls refitted, with
    --out or --write."""
    from dualpace_sim.config.scenario import ScenarioError
    from dualpace_sim.core.journal import JournalError
    from dualpace_sim.costs import calibrate as appendix_b
    from dualpace_sim.costs.fit import FitError, fit_controls, profile_batch_sizes, with_controls
    from dualpace_sim.costs.model import CostModel
    from dualpace_sim.results.served_rounds import (
        PASS_SCENARIO,
        served_round_overhead,
        served_rounds,
        with_served_overhead,
    )
    from dualpace_sim.validation.validate import load_for_real_run

    p = _load(profile)
    scenarios = [scenario or d.parent / PASS_SCENARIO for d in run]
    overhead = None
    try:
        calls = [c for d in run for c in appendix_b.run_assist_calls(d)]
        cal = appendix_b.calibrate(calls, profile_batch_sizes(p))
        runs = [str(d) for d in run]
        old = p.assist.calibration  # recomputed from the same runs: keep what they served
        workload = old.workload if old is not None and old.runs == runs else None
        calibrated = appendix_b.with_calibration(p, cal, runs, workload=workload)
        if all(sc.is_file() for sc in scenarios):
            rounds = [r for d, sc in zip(run, scenarios, strict=True)
                      for r in served_rounds(load_for_real_run(sc, d)[0], d, "dualpace")]
            overhead = served_round_overhead(rounds, runs)
            if overhead is not None:
                calibrated = with_served_overhead(calibrated, overhead)
        before, after = fit_controls(p), fit_controls(calibrated)
    except (appendix_b.CalibrationError, FitError, ScenarioError, JournalError,
            ValueError) as e:
        _fail(str(e))
    typer.echo(f"{len(calls)} Dense Assist calls from {len(run)} run(s)")
    typer.echo(f"{'path':<5}{'rows':>6}{'calls':>8}{'Q us':>10}{'O us':>10}{'B us':>10}"
               f"{'G us':>10}{'g us':>10}   (B: the stage-boundary wait inside Q; G: the "
               "served CUDA interval, g: the profile's)")
    idle = CostModel(p)
    for g in cal.groups:
        typer.echo(f"{g.path:<5}{g.rows:>6}{g.calls:>8}{g.q_s * 1e6:>10.1f}{g.o_s * 1e6:>10.1f}"
                   f"{g.boundary_s * 1e6:>10.1f}{(g.g_s or 0.0) * 1e6:>10.1f}"
                   f"{idle.assist_gpu(g.path, g.rows) * 1e6:>10.1f}")
    served = CostModel(calibrated)
    for x in ("p", "lA", "lS"):
        q0, o0 = getattr(p.assist.q, x) * 1e6, getattr(p.assist.o, x) * 1e6
        if x in cal.q:
            stretch = served.assist_gpu_beside_batch(x, 1) / served.assist_gpu(x, 1)
            typer.echo(f"{x}: q {q0:.1f} -> {cal.q[x] * 1e6:.1f} us, o {o0:.1f} -> "
                       f"{cal.o[x] * 1e6:.1f} us, g beside a running batch x {stretch:.2f}")
        else:
            typer.echo(f"{x}: no calls in the runs; q {q0:.1f} us and o {o0:.1f} us kept (the "
                       "handshake's)")
    if overhead is not None:
        typer.echo(f"GPU iteration overhead: {overhead.measured_s * 1e3:.3f} ms timed -> "
                   f"{overhead.served_s * 1e3:.3f} ms served ({overhead.rounds} decode-only "
                   "rounds with the CPU engine idle)")
    else:
        missing = next((str(sc) for sc in scenarios if not sc.is_file()), None)
        typer.echo("GPU iteration overhead kept: " + (
            f"no scenario {missing} (give --scenario)" if missing else
            "the runs hold no decode-only round with the CPU engine idle"))
    typer.echo(f"routes: (P, F) = ({before.route_p}, {before.route_f}) with the profile's q, o; "
               f"({after.route_p}, {after.route_f}) calibrated")
    target = profile if write else out
    if target is not None:
        try:
            with_controls(calibrated, after).save(target)
        except OSError as e:
            _fail(f"{target}: cannot write: {e.strerror or e}")
        typer.echo(f"wrote {target}")


@profile_app.command()
def compare(
    first: Annotated[Path, typer.Argument(help="a profile, e.g. the measured one")],
    second: Annotated[Path, typer.Argument(help="another profile of the same model")],
) -> None:
    """Table by table, how far FIRST is from SECOND (ratios FIRST/SECOND at FIRST's grid
    points, interpolating SECOND), plus the scalar constants, as a markdown table."""
    from dualpace_sim.costs.compare import markdown

    a, b = _load(first), _load(second)
    if a.model.name != b.model.name:
        _fail(f"{second}: model {b.model.name} differs from {first}'s {a.model.name}")
    # Name the two by their files: both may be measured (a re-profile), or of one method.
    typer.echo(f"A: {first} ({a.provenance.method}, {a.provenance.date})  \n"
               f"B: {second} ({b.provenance.method}, {b.provenance.date})\n")
    typer.echo(markdown(a, b, "A", "B"), nl=False)


def _in_calibration_runs(path: Path) -> bool:
    """Whether `path` lies in the `<stem>-calibration/` folder beside a profile `<stem>.yaml`,
    where `dualpace-hw profile` keeps its calibration passes and the profiles they ran with."""
    return any(d.name.endswith("-calibration")
               and d.with_name(d.name.removesuffix("-calibration") + ".yaml").is_file()
               for d in path.parents)


@profile_app.command("list")
def list_profiles(
    folders: Annotated[list[Path] | None, typer.Argument(
        help="folders to search (recursively); default: calibration")] = None,
) -> None:
    """Every profile under FOLDERS with its key — box, model, GPU and CPU tensor-parallel
    degrees, the CPU engine's cores — and how it was made (measured or roofline, and when), as a
    markdown table. Two profiles of one key and method are flagged: a scenario should name one
    of them."""
    folders = folders or [Path("calibration")]
    rows: list[tuple[str, ...]] = []
    for folder in folders:
        if not folder.is_dir():
            _fail(f"{folder}: no such folder")
        for path in sorted(folder.rglob("*.yaml")):
            if _in_calibration_runs(path):
                continue  # the profile a calibration pass ran with, not one to choose
            if not path.read_text(errors="replace").lstrip().startswith(
                    ("format: dualpace-profile/", "# dualpace-profile/")):
                continue  # a scenario, a hardware spec, a partial checkpoint
            p = _load(path)
            rows.append((p.box.name, p.model.name, str(p.box.tensor_parallel),
                         str(p.box.cpu_tensor_parallel), str(p.box.cpu_cores),
                         p.provenance.method, p.provenance.date, str(path)))
    if not rows:
        _fail(f"no profiles under {', '.join(map(str, folders))}")
    typer.echo("| box | model | GPU TP | CPU TP | CPU cores | method | date | file |")
    typer.echo("|---|---|---|---|---|---|---|---|")
    for row in sorted(rows):
        typer.echo("| " + " | ".join(row) + " |")
    keys = [row[:6] for row in rows]
    for key in sorted({k for k in keys if keys.count(k) > 1}):
        files = ", ".join(r[7] for r in rows if r[:6] == key)
        typer.echo(f"note: {key[0]} / {key[1]} (GPU TP {key[2]}, CPU TP {key[3]}, {key[4]} CPU "
                   f"cores, {key[5]}) has several profiles: {files}")
