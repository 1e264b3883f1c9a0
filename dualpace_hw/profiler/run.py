"""Run a whole profile: every table, with progress, a resumable checkpoint, provenance, the
profile-guided fits and their plots."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dualpace_hw import hostinfo as box
from dualpace_hw.executors.tp import shard_shape
from dualpace_hw.kernels.cpu_attention import pin_threads
from dualpace_hw.kernels.host_read import host_read_bytes_per_s
from dualpace_hw.profiler.calibration import CalibrationWorkload, calibrated, serve_passes
from dualpace_hw.profiler.grids import Grids
from dualpace_hw.profiler.handshake import Handshake, measure_handshake
from dualpace_hw.profiler.load import cpu_engine_load
from dualpace_hw.profiler.measure import Measurer
from dualpace_hw.profiler.rank_round import MAX_ROWS as RANK_ROUND_ROWS
from dualpace_hw.profiler.rank_round import RankRounds, timed_depth, with_rank_round
from dualpace_hw.profiler.ranks import CPU_STAGES, GPU_STAGES, CpuRanks, GpuRanks
from dualpace_hw.profiler.timing import Protocol, Timer
from dualpace_hw.runtime.cpu_worker import ASSIST_KINDS
from dualpace_hw.runtime.processes import on_cores, place_all_threads
from dualpace_sim.common.progress import progress_bar
from dualpace_sim.config.scenario import ScenarioError
from dualpace_sim.costs.calibrate import CalibrationError
from dualpace_sim.costs.fit import FitResult, fit_controls, with_controls
from dualpace_sim.costs.profile import REVERSED_RATIO, Profile
from dualpace_sim.costs.shapes import ModelShape

GIB = 2**30
HOST_RESERVE_GIB = 16.0  # OS and runtime, kept out of the host KV pool
GPU_RESERVE_GIB = 2.0  # CUDA context, workspaces, activations


class ProfileRunError(RuntimeError):
    """The box lacks something the profile needs; the message says what and what to do."""


@dataclass
class Options:
    shape: ModelShape
    out: Path
    box_name: str
    quick: bool = False
    gpu_device: str = "cuda"
    cpu_cores: int | None = None
    cpu_tp: int = 1  # CPU tensor-parallel ranks: sharded CPU stages timed rank-critically
    gpu_tp: int = 1  # GPU tensor-parallel ranks, one per GPU: every GPU measurement on them
    gpu_kv_gib: float | None = None
    host_kv_gib: float | None = None
    block_size: int = 16
    seed: int = 0
    command: str = ""
    progress: bool = True
    calibration: bool = True  # serve the Appendix B calibration workload (calibration.py)


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProfileRunError("no CUDA device: the GPU tables need one. Profile on a GPU box, or "
                              "pass --gpu-device cpu to run the GPU path on the CPU (for tests)")
    return device


def _check_gpu_tp(opt: Options, device: torch.device) -> None:
    """Refuse a --gpu-tp that cannot run here before anything is measured."""
    n = opt.gpu_tp
    try:
        shard_shape(opt.shape, n)
    except ValueError as e:
        raise ProfileRunError(f"--gpu-tp {n}: {e}") from None
    if device.type == "cuda" and n > torch.cuda.device_count():
        raise ProfileRunError(f"--gpu-tp {n}: one rank per GPU needs {n} CUDA devices, this box "
                              f"has {torch.cuda.device_count()}")


def _threads(cores: int | None) -> int:
    available = box.usable_cores()
    n = available if cores is None else cores
    if n > available:
        raise ProfileRunError(f"--cpu-cores {n}: only {available} cores are usable here")
    torch.set_num_threads(n)
    if hasattr(os, "sched_setaffinity") and cores is not None:
        mine = sorted(os.sched_getaffinity(0))[:n]
        os.sched_setaffinity(0, mine)
        # One OpenMP thread pinned to each core, as the runtime's CPU engine runs on its
        # --cpu-cores: on the H200 box the same attention call took 0.73-1.37x as long with
        # the threads floating over those cores, by shape (benchmarks/results/kernels). The
        # calling thread, the team's first, gets its mask back: what follows reads the
        # measured cores from it (CPU and GPU ranks, the stand-in CPU engine), and its one
        # free core is its pinned core's.
        pin_threads(mine)
        os.sched_setaffinity(0, mine)
    return n


class Checkpoint:
    """Measured points, saved after each one so an interrupted profile resumes."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = path
        self.points: dict[str, float] = {}
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("meta") != meta:
                raise ProfileRunError(f"{path}: a partial profile of another configuration; "
                                      "delete it or choose another --out")
            self.points = saved["points"]
        self.meta = meta

    def get(self, key: str, measure: Callable[[], float]) -> float:
        if key not in self.points:
            self.points[key] = measure()
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"meta": self.meta, "points": self.points}))
            tmp.replace(self.path)
        return self.points[key]


def _tables(m: Measurer, g: Grids) -> list[tuple[str, list[int], list[int] | None, Callable]]:
    """(name, x grid, y grid or None, measure) for every measured table."""
    one = [
        ("gpu.pre_attn", g.gpu_tokens, m.gpu_pre_attn),
        ("gpu.post_attn", g.gpu_tokens, m.gpu_post_attn),
        ("gpu.pre_layer", g.gpu_tokens, m.gpu_pre_layer),
        ("gpu.post_layer", g.gpu_rows, m.gpu_post_layer),
        ("cpu.pre_layer", g.cpu_batches, m.cpu_pre_layer),
        ("cpu.pre_attn", g.cpu_batches, m.cpu_pre_attn),
        ("cpu.post_attn", g.cpu_batches, m.cpu_post_attn),
        ("cpu.post_layer", g.cpu_batches, m.cpu_post_layer),
        ("cpu.assist_write", g.cpu_batches, m.assist_write),
        ("cpu.assist_read", g.cpu_batches, m.assist_read),
        ("cpu.hidden_write", g.cpu_batches, m.hidden_write),
    ]
    two = [
        ("gpu.prefill_attn", g.prefill_chunks, g.prefill_contexts, m.gpu_prefill_attn),
        ("gpu.decode_attn", g.decode_batches, g.decode_totals, m.gpu_decode_attn),
        ("cpu.decode_attn", g.decode_batches, g.decode_totals, m.cpu_decode_attn),
    ]
    return [(n, x, None, f) for n, x, f in one] + two


def _routed(tables: list, stages: tuple[str, ...], ranks: CpuRanks | GpuRanks) -> list:
    """`tables` with the measures of `stages` replaced by the ranks' rank-critical ones."""
    return [(name, xs, ys, (lambda *a, n=name: ranks.measure(n, *a)) if name in stages else f)
            for name, xs, ys, f in tables]


def _start_ranks(opt: Options, m: Measurer, grids: Grids, protocol: Protocol, threads: int,
                 stack: contextlib.ExitStack) -> tuple[list, Measurer | GpuRanks]:
    """The tables to measure, their sharded stages routed to tensor-parallel ranks (closed by
    `stack`), and what measures the assists, the link and the eager layer: the GPU ranks
    under --gpu-tp, else `m`."""
    tables = _tables(m, grids)
    gpu: Measurer | GpuRanks = m
    if opt.gpu_tp > 1:
        gpu = GpuRanks(opt.shape, opt.seed, opt.block_size, grids, protocol, opt.gpu_tp,
                       m.gpu_device, threads)
        stack.callback(gpu.close)
        tables = _routed(tables, GPU_STAGES, gpu)
    if opt.cpu_tp > 1:
        try:
            ranks = CpuRanks(opt.shape, opt.seed, opt.block_size, m.kv_blocks, grids,
                             protocol, opt.cpu_tp, sorted(os.sched_getaffinity(0))[:threads])
        except ValueError as e:
            raise ProfileRunError(f"--cpu-tp {opt.cpu_tp}: {e}") from None
        stack.callback(ranks.close)
        tables = _routed(tables, CPU_STAGES, ranks)
    return tables, gpu


FLOOR_SAMPLES = 3  # the eager floors, measured at the start, middle and end of a profile


def run_profile(opt: Options) -> Profile:
    gpu_device = _device(opt.gpu_device)
    _check_gpu_tp(opt, gpu_device)
    box_cores = sorted(os.sched_getaffinity(0))
    threads = _threads(opt.cpu_cores)
    if not box.has_amx():
        print("note: this CPU has no AMX; profiling its AVX-512 path (the profile says amx: "
              "false)")
    protocol = Protocol.quick() if opt.quick else Protocol()
    grids = Grids.quick() if opt.quick else Grids.full()
    m = Measurer(opt.shape, gpu_device, Timer(gpu_device, protocol),
                 Timer(torch.device("cpu"), protocol), grids, opt.block_size, opt.seed)
    meta = {"model": opt.shape.name, "quick": opt.quick, "device": str(gpu_device),
            "threads": threads, "cpu_tp": opt.cpu_tp, "gpu_tp": opt.gpu_tp,
            "block_size": opt.block_size, "grids": asdict(grids)}
    opt.out.parent.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpoint(opt.out.with_suffix(".partial.json"), meta)
    values: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        tables, gpu = _start_ranks(opt, m, grids, protocol, threads, stack)
        n_points = sum(len(x) * (len(y) if y else 1) for _, x, y, _ in tables)
        n_points += 6 * len(grids.cpu_batches) + 6 + (6 if opt.gpu_tp == 1 else 0)
        n_points += FLOOR_SAMPLES * (4 if opt.gpu_tp == 1 else 2)
        bar = stack.enter_context(progress_bar(opt.progress, total=n_points, unit="pt"))

        def point(key: str, measure: Callable[[], float]) -> float:
            bar.set_description(key.split("|")[0])
            v = ckpt.get(key, measure)
            bar.update()
            return v

        floors: list[tuple[float, float | None, float | None, float | None]] = []
        overheads: list[float] = []

        def sample_floors() -> None:
            """The eager floors and the iteration overhead once more: host-side times, and the
            host's speed drifts within minutes (one-shot overheads of successive profiles
            ranged 0.53-1.03 ms), so they are sampled at the start, the middle and the end of
            the run. NEO's decode floor only on one GPU (the real NEO runs on one)."""
            i = len(floors)
            overheads.append(point(f"iteration_overhead_s|{i}", m.iteration_overhead))
            eager = point(f"gpu.eager_layer_s|{i}", gpu.eager_layer)
            beside = decode = prefill = None
            if opt.gpu_tp == 1:
                beside = point(f"gpu.eager_layer_beside_cpu_s|{i}",
                               lambda: _eager_beside_cpu(opt, m, box_cores, threads))
                decode = point(f"neo.eager_decode_layer_s|{i}", m.eager_decode_layer)
                prefill = point(f"neo.eager_prefill_layer_s|{i}", m.eager_prefill_layer)
            floors.append((eager, beside, decode, prefill))

        # on the profiled cores, as the CPU tables are: the speed of their memory-bound stages
        read = point("host_read_bytes_per_s", host_read_bytes_per_s)
        sample_floors()
        for t, (name, xs, ys, measure) in enumerate(tables):
            if t == len(tables) // 2:
                sample_floors()
            if ys is None:
                values[name] = {"x": xs, "y": [
                    point(f"{name}|{x}", lambda x=x, f=measure: f(x)) for x in xs]}
            else:
                values[name] = {"x": xs, "y": ys, "z": [
                    [point(f"{name}|{x}|{y}", lambda x=x, y=y, f=measure: f(x, y)) for y in ys]
                    for x in xs]}
            remeasure_stalled_first(values[name], measure)
        waits: dict[str, float] = {}
        for kind in ("p", "lA", "lS"):
            g, overhead = [], []
            for b in grids.cpu_batches:
                cuda_s = point(f"assist.g_{kind}|{b}",
                               lambda b=b, k=kind: gpu.assist(k, b)[0])
                wall_s = point(f"assist.wall_{kind}|{b}",
                               lambda b=b, k=kind: gpu.assist(k, b)[1])
                g.append(cuda_s)
                overhead.append(max(wall_s - cuda_s, 0.0))
            values[f"assist.g_{kind}"] = {"x": grids.cpu_batches, "y": g}
            remeasure_stalled_first(values[f"assist.g_{kind}"],
                                    lambda b, k=kind: gpu.assist(k, b)[0])
            waits[kind] = sum(overhead) / len(overhead)
        q, o = waits, waits  # under GPU tensor parallelism: the in-process overhead
        if opt.gpu_tp == 1:
            q, o = _handshake(opt, m, grids, protocol, values, box_cores, threads, point)
        link = {k: point(f"link.{k}", lambda k=k: gpu.link()[k])
                for k in ("h2d_bytes_per_s", "d2h_bytes_per_s", "latency_s")}
        poll = point("assist.poll_s", m.poll_s)
        launch = point("neo.launch_s", m.neo_launch_s)
        sample_floors()
    profile = _assemble(opt, m, values, q, o, link, poll, launch, overheads, floors,
                        threads, protocol, read)
    if opt.gpu_tp > 1:  # after the stage ranks are gone: the runtime's own rank group
        rows = [b for b in grids.decode_batches
                if b <= min(RANK_ROUND_ROWS, max(grids.gpu_rows))]
        depth = timed_depth(opt.shape, opt.gpu_tp, m.gpu_device,
                            RankRounds.blocks(rows, opt.block_size), opt.block_size)
        walls: dict[int, dict[int, float]] = {}
        for d in sorted({1, depth} if depth < opt.shape.n_layers else {depth}):
            rounds = RankRounds(opt.shape, d, opt.seed, opt.block_size, opt.gpu_tp,
                                m.gpu_device, Timer(torch.device("cpu"), protocol), rows)
            try:
                walls[d] = {b: ckpt.get(f"gpu.rank_round_wall|{d}|{b}",
                                        lambda b=b, r=rounds: r.wall(b)) for b in rows}
            finally:
                rounds.close()
        profile = with_rank_round(profile, walls)
    profile.save(opt.out)
    result = fit_controls(profile)
    fitted = with_controls(profile, result)
    fitted.save(opt.out)
    if opt.calibration:  # served as `dualpace-hw run` serves: on all the process's cores
        place_all_threads(box_cores)  # the measured cores' pinned threads let go
        with on_cores(box_cores):
            fitted, result = _calibrate(opt, fitted, result, threads)
    try:
        from dualpace_sim.plots.fit import plot_fit

        plot_fit(result, opt.out.with_name(opt.out.stem + "-fit"))
    except ImportError as e:  # matplotlib missing on the box: the profile still stands
        print(f"note: fit plots skipped ({e})")
    ckpt.path.unlink(missing_ok=True)
    return fitted


def _calibrate(opt: Options, fitted: Profile, before: FitResult, threads: int
               ) -> tuple[Profile, FitResult]:
    """Serve the calibration workload, take q_x and o_x from its assists, refit the controls
    with them and save the profile (calibration.py).

    Called on the cores the process had before `_threads` narrowed it to the measured ones:
    the runtime gives the CPU engine its `threads` cores and its GPU engine the rest, and on
    the narrowed set there is no rest. The H200 box's passes ran that way until session 16,
    the GPU engine's threads on the CPU engine's 14 cores: its CPU steps took 2.3-3.4x their
    modelled work (0.99-1.18x in `dualpace-hw run`s) and q_p read 2.09 ms where served runs
    wait 0.15-0.19 ms an assist."""
    work = CalibrationWorkload.quick() if opt.quick else CalibrationWorkload.full()
    try:
        runs = serve_passes(fitted, opt.out, work, opt.gpu_device, threads, opt.cpu_tp,
                            opt.gpu_tp)
        profile = calibrated(fitted, runs, opt.out, work)
    except (ScenarioError, CalibrationError) as e:
        raise ProfileRunError(f"the Appendix B calibration: {e}; the tables are in {opt.out} "
                              "(rerun to retry, or pass --no-calibration)") from None
    result = fit_controls(profile)
    served = profile.gpu.iteration_overhead_calibration
    notes = (f"{profile.provenance.notes} q_x, o_x then replaced by Appendix B's end-to-end "
             f"calibration (assist.calibration): the runtime served {work.describe()}, once "
             "with every CPU step Fused-Assist and once Split-Final; the controls were fitted "
             "with the calibrated q_x, o_x."
             + ("" if served is None else
                f" gpu.iteration_overhead_s then set from the same runs' {served.rounds} "
                "decode-only rounds with the CPU engine idle (their median time less their "
                f"modelled stages): {served.measured_s * 1e3:.3f} ms timed, "
                f"{served.served_s * 1e3:.3f} ms served (gpu.iteration_overhead_calibration)."))
    profile = profile.model_copy(update={
        "provenance": profile.provenance.model_copy(update={"notes": notes})})
    fitted = with_controls(profile, result)
    fitted.save(opt.out)
    print(f"calibration: routes (P, F) = ({before.route_p}, {before.route_f}) with the "
          f"handshake's q, o; ({result.route_p}, {result.route_f}) calibrated", flush=True)
    return fitted, result


def _handshake(opt: Options, m: Measurer, grids: Grids, protocol: Protocol, values: dict,
               box_cores: list[int], threads: int, point: Callable) -> tuple[dict, dict]:
    """q_x and o_x through the runtime's Dense Assist control path (handshake.py), measured
    once for all six checkpointed points."""

    @functools.cache
    def handshake() -> Handshake:
        g = {k: values[f"assist.g_{k}"]["y"] for k in ASSIST_KINDS}
        return measure_handshake(
            opt.shape, m.assist_executor(), grids.cpu_batches, g, box_cores[:threads],
            box_cores[threads:] or box_cores, warmups=protocol.warmups,
            repeats=max(3, min(30, protocol.invocations)))

    q = {k: point(f"assist.q_{k}", lambda k=k: handshake().q[k]) for k in ASSIST_KINDS}
    o = {k: point(f"assist.o_{k}", lambda k=k: handshake().o[k]) for k in ASSIST_KINDS}
    return q, o


def remeasure_stalled_first(table: dict, measure: Callable[..., float], tries: int = 2) -> None:
    """Measure a table's smallest shape again, keeping its fastest, while it costs more than
    `REVERSED_RATIO` times the largest. A busy host can stall every repeat of one point (seen
    in CI: a tiny model's post-layer at 1 row 80 times its cost at 8 rows), and the profile's
    plausibility check then refuses the whole profile as reversed. Noise only slows a point,
    so the largest shape's value stands."""
    two_d = "z" in table
    for _ in range(tries):
        first = table["z"][0][0] if two_d else table["y"][0]
        last = table["z"][-1][-1] if two_d else table["y"][-1]
        if last * REVERSED_RATIO >= first:
            return
        if two_d:
            table["z"][0][0] = min(first, measure(table["x"][0], table["y"][0]))
        else:
            table["y"][0] = min(first, measure(table["x"][0]))


def _eager_beside_cpu(opt: Options, m: Measurer, box_cores: list[int], threads: int) -> float:
    """The eager layer timed as DualPace's GPU engine runs it: on the cores `dualpace-hw run
    --cpu-cores` leaves it (all of them where none are left), beside a stand-in CPU engine
    decoding on the profiled CPU cores."""
    engine_cores = box_cores[:threads]
    with cpu_engine_load(opt.shape, opt.seed, opt.block_size, engine_cores), \
            on_cores(box_cores[threads:] or box_cores):
        return m.eager_layer()


def _capacities(opt: Options, gpu_device: torch.device) -> tuple[int, int, dict]:
    s, bs = opt.shape, opt.block_size
    block_bytes = bs * s.kv_bytes_per_token
    if opt.gpu_kv_gib is not None:
        gpu_bytes = opt.gpu_kv_gib * GIB
    elif gpu_device.type == "cuda":
        # Under --gpu-tp N each GPU holds 1/N of the weights and 1/N of every block's heads, so
        # the pool is the sum of what each leaves, in blocks of the whole model.
        devices = ([gpu_device] if opt.gpu_tp == 1 else
                   [torch.device("cuda", r) for r in range(opt.gpu_tp)])
        gpu_bytes = sum(torch.cuda.get_device_properties(d).total_memory * 0.9
                        - s.weight_bytes / opt.gpu_tp - GPU_RESERVE_GIB * GIB for d in devices)
    else:
        gpu_bytes = 1 * GIB  # the GPU path on the CPU (tests): a nominal pool
    host_bytes = (opt.host_kv_gib * GIB if opt.host_kv_gib is not None else
                  (box.memory_gib() - HOST_RESERVE_GIB) * GIB - s.weight_bytes)
    if gpu_bytes < block_bytes or host_bytes < block_bytes:
        raise ProfileRunError(
            f"no room for KV: {gpu_bytes / GIB:.1f} GiB on the GPU, {host_bytes / GIB:.1f} GiB "
            f"on the host after the weights; set --gpu-kv-gib / --host-kv-gib")
    params = {"gpu_kv_gib": round(gpu_bytes / GIB, 2), "host_kv_gib": round(host_bytes / GIB, 2)}
    return int(gpu_bytes // block_bytes), int(host_bytes // block_bytes), params


def _assemble(opt: Options, m: Measurer, v: dict, q: dict, o: dict, link: dict, poll: float,
              launch: float, overheads: list[float],
              floors: list[tuple[float, float | None, float | None, float | None]],
              threads: int, protocol: Protocol, read_bytes_per_s: float) -> Profile:
    gpu_blocks, host_blocks, params = _capacities(opt, m.gpu_device)
    overhead = statistics.median(overheads)
    eager, beside, decode, prefill = (
        statistics.median(f[i] for f in floors) if floors[0][i] is not None else None
        for i in range(4))
    prov = box.provenance(m.gpu_device, threads, opt.command, dt.date.today().isoformat())
    prov["quick"] = opt.quick  # `dualpace-sim validate` notes runs priced by a quick profile
    prov["host_read_bytes_per_s"] = read_bytes_per_s  # and runs served on a slower host
    prov["parameters"] = {**params, "warmups": protocol.warmups,
                          "invocations_max": protocol.invocations, "repeats": protocol.repeats}
    prov["notes"] = (
        f"One decoder layer plus pre/post-layer measured with random bf16 weights; CPU dense "
        f"stages via {m.cpu_linear}, each call on the next of {m.cpu_ring or 1} distinct layers "
        f"(their QKV weights twice the {m.cache_bytes >> 20} MiB last-level cache: weights "
        "from memory, as in a decode step); CPU decode attention over disjoint block windows "
        f"spanning twice that cache, in turn; the CPU stages on {threads} OpenMP thread(s)"
        f"{', one pinned to each core as the CPU engine runs' if opt.cpu_cores else ''}; "
        f"GPU decode attention via "
        f"{m.gpu_decode.__module__}; "
        f"decode contexts beyond {m.grids.max_request_context} tokens per request extended "
        "along the line through the cap and half the cap. "
        + ("q_x = o_x = the in-process host overhead of an assist call (wall minus CUDA "
           "time; the shared-memory handshake not timed under GPU tensor parallelism). "
           if opt.gpu_tp > 1 else
           "q_x, o_x: each assist through the runtime's shared control block (a client "
           "process on the CPU engine's cores, the runtime's AssistServer on the rest): the "
           "client's CPU-Ready to GPU-Done wait and the server's service, each less g_x(b), "
           "averaged over the CPU batch sizes. ")
        + "Iteration overheads (both engines) = the GPU executor "
        "building a 64-request decode batch, the median of "
        + ", ".join(f"{x * 1e3:.3f}" for x in overheads) + " ms (sampled with the floors). "
        "gpu.eager_layer_s = one layer of a small mixed "
        "batch as the runtime runs it (its chunked rounds' layer graphs around eager "
        "attention on one GPU, eagerly under tensor parallelism), back to back (the host's "
        "floor of prefill rounds); "
        "gpu.eager_layer_beside_cpu_s = the same on the cores the CPU engine leaves, beside a "
        "stand-in CPU engine decoding on the profiled cores (DualPace's floor; not measured "
        "under GPU tensor parallelism); neo.eager_prefill_layer_s = the small batch run "
        "eagerly, and neo.eager_decode_layer_s = its 8 decodes alone, eagerly (the floors "
        "of NEO's sub-batches, which SwiftLLM runs without CUDA graphs; not measured under "
        "GPU tensor parallelism). Each floor is the median of "
        f"{len(floors)} measurements at the start, middle and end of the run (the host's "
        "speed drifts): "
        + "; ".join(label + " " + ", ".join(f"{f[i] * 1e3:.3f}" for f in floors) + " ms"
                    for i, label in enumerate(("eager", "beside", "NEO decode", "NEO prefill"))
                    if floors[0][i] is not None) + "."
        + (f" GPU tensor parallel over {opt.gpu_tp} ranks: every GPU table, the assists and "
           "the eager layer were timed on all ranks at once, each with its shard of the layer "
           "(all-reduces included), keeping the slowest rank's time (rank-critical); the link "
           "is every rank copying at once over its own PCIe link (total bytes over the slowest "
           "rank's time), as a swap under tensor parallelism moves each rank's heads "
           "concurrently. gpu.rank_round = whole decode rounds of 1,024-token requests through "
           "the runtime's LeadExecutor over the ranks at the model's depth (CUDA graphs, as "
           "served; where the whole model does not fit rank 0's GPU, at the depth that does "
           "and at one layer, extended linearly), less the model's price for them: the rank "
           "group's hand-off and token check, and what a layer costs inside a round beyond "
           "its stages timed alone."
           if opt.gpu_tp > 1 else "")
        + (f" CPU tensor parallel over {opt.cpu_tp} ranks: each rank timed its shard of the "
           "CPU stages on its own cores, all ranks at once, keeping the slowest (its ring of "
           "layers and KV windows sized, as above, on its shard)." if opt.cpu_tp > 1 else "")
        + (" QUICK grids and protocol: for tests, not for studies." if opt.quick else ""))
    data = {
        "format": "dualpace-profile/1",
        "provenance": prov,
        "model": asdict(opt.shape),
        "box": {"name": opt.box_name, "gpu": prov["gpu_model"], "gpu_count": opt.gpu_tp,
                "tensor_parallel": opt.gpu_tp, "cpu": prov["cpu_model"], "cpu_cores": threads,
                "cpu_tensor_parallel": opt.cpu_tp},
        "block_size": opt.block_size,
        "gpu": {k.split(".", 1)[1]: t for k, t in v.items() if k.startswith("gpu.")}
        | {"iteration_overhead_s": overhead, "eager_layer_s": eager,
           "eager_layer_beside_cpu_s": beside,
           "kv_capacity_blocks": gpu_blocks},
        "cpu": {k.split(".", 1)[1]: t for k, t in v.items() if k.startswith("cpu.")}
        | {"iteration_overhead_s": overhead, "kv_capacity_blocks": host_blocks},
        "assist": {"g_p": v["assist.g_p"], "g_lA": v["assist.g_lA"], "g_lS": v["assist.g_lS"],
                   "q": q, "o": o, "poll_s": poll},
        "link": link,
        "neo": {"launch_s": launch, "eager_decode_layer_s": decode,
                "eager_prefill_layer_s": prefill},
    }
    return Profile.model_validate(data)
