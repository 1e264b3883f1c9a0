"""Roofline synthesizer: published hardware specs + a model shape -> a calibration profile.

It lets users ask what-if questions about boxes they do not have. Each primitive is a sum
of kernels, and each kernel costs ``max(flops / (peak * eff), bytes / (bandwidth * eff))``
plus a fixed launch overhead. Linear layers read their weights once per call; attention
reads the KV it attends to; tensor parallelism divides weights, FLOPs and KV by the GPU
count and adds two ring all-reduces per layer. Profiles produced here say ``roofline`` in
their provenance and are never measurements; docs/costs.md explains the efficiency
factors.

Usage: ``python -m dualpace_sim.costs.roofline SPEC MODEL --out PATH``
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from dualpace_sim.costs.profile import (
    PROFILE_FORMAT,
    Profile,
    ProfileError,
    StrictModel,
    read_file_data,
    validate_file_data,
)
from dualpace_sim.costs.shapes import ModelShape

GENERATOR_VERSION = "dualpace-roofline/1"
GIB = 1 << 30
OS_RESERVE_GIB = 16.0  # host memory kept for the OS, runtime and pinned staging
ACTIVATION_TOKENS = 8192  # transient activations reserved in HBM: one prefill chunk this big
LOGIT_ROWS = 256  # ...plus fp32 logits for this many sampled rows
TOKEN_ID_BYTES = 8  # sampled token ids returned by a final Dense Assist (int64)

Efficiency = Annotated[float, Field(gt=0, le=1)]


# --- hardware spec ------------------------------------------------------------------------
class GpuSpec(StrictModel):
    name: str
    count: PositiveInt  # tensor-parallel degree
    hbm_gib: PositiveFloat  # per GPU
    hbm_bytes_per_s: PositiveFloat  # per GPU
    bf16_flops: PositiveFloat  # dense, per GPU
    launch_overhead_s: NonNegativeFloat  # per kernel
    interconnect_bytes_per_s: PositiveFloat | None = None  # per direction, for all-reduce
    allreduce_latency_s: NonNegativeFloat = 0.0
    reserved_gib: NonNegativeFloat  # CUDA context, cuBLAS/NCCL workspaces
    iteration_overhead_s: NonNegativeFloat

    @model_validator(mode="after")
    def _interconnect_for_tp(self) -> GpuSpec:
        if self.count > 1 and self.interconnect_bytes_per_s is None:
            raise ValueError("interconnect_bytes_per_s is required when count > 1")
        return self


class CpuSpec(StrictModel):
    name: str
    cores: PositiveInt
    dram_bytes_per_s: PositiveFloat  # what THESE cores can draw, not the socket peak
    amx_bf16_flops: PositiveFloat  # for these cores
    avx512_bf16_flops: PositiveFloat  # for these cores
    host_memory_gib: PositiveFloat
    op_overhead_s: NonNegativeFloat  # per operator call (dispatch + OpenMP fork/join)
    iteration_overhead_s: NonNegativeFloat
    # CPU tensor parallelism: `tensor_parallel` ranks, each with the cores, bandwidth and
    # FLOP/s above (one NUMA node each), weights and KV sharded, Gloo all-reduces between them.
    tensor_parallel: PositiveInt = 1
    allreduce_latency_s: NonNegativeFloat = 0.0
    interconnect_bytes_per_s: PositiveFloat | None = None  # between ranks (UPI), per direction

    @model_validator(mode="after")
    def _interconnect_for_tp(self) -> CpuSpec:
        if self.tensor_parallel > 1 and self.interconnect_bytes_per_s is None:
            raise ValueError("cpu.interconnect_bytes_per_s is required when tensor_parallel > 1")
        return self


class LinkSpec(StrictModel):
    """PCIe between host and EACH GPU (per direction)."""

    h2d_bytes_per_s: PositiveFloat
    d2h_bytes_per_s: PositiveFloat
    latency_s: NonNegativeFloat


class AssistSpec(StrictModel):
    q_s: NonNegativeFloat  # CPU-visible control-path wait per assist
    o_s: NonNegativeFloat  # GPU-worker launch + finalization per assist
    poll_s: NonNegativeFloat  # per stage-boundary check


class EfficiencySpec(StrictModel):
    gpu_gemm: Efficiency
    gpu_attn: Efficiency
    gpu_mem: Efficiency
    cpu_gemm: Efficiency
    cpu_mem: Efficiency
    link: Efficiency


class HardwareSpec(StrictModel):
    name: str
    reference: str
    notes: str = ""
    gpu: GpuSpec
    cpu: CpuSpec
    link: LinkSpec
    assist: AssistSpec
    efficiency: EfficiencySpec


def _packaged_specs() -> dict[str, Path]:
    folder = resources.files("dualpace_sim") / "data" / "hardware"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def load_spec(path_or_name: str | Path) -> HardwareSpec:
    """Load a spec file, or a packaged one by name (e.g. ``rtx4090-xeon4510-12c``)."""
    path = Path(path_or_name)
    if not path.is_file():
        packaged = _packaged_specs()
        if str(path_or_name) not in packaged:
            known = ", ".join(sorted(packaged))
            raise ProfileError(f"{path_or_name}: no such spec file or packaged spec ({known})")
        path = packaged[str(path_or_name)]
    return validate_file_data(HardwareSpec, read_file_data(path), str(path))


def with_cpu_cores(spec: HardwareSpec, cores: int, dram_ceiling_bytes_per_s: float
                   ) -> HardwareSpec:
    """The same box with ``cores`` cores of the same CPU per rank, for sizing the CPU tier.

    AMX and AVX512 peaks scale with the core count. Memory bandwidth does too, but only up to
    ``dram_ceiling_bytes_per_s`` (what the whole socket's channels deliver to a STREAM-like
    copy): each core keeps a bounded number of misses in flight, so a few cores cannot
    saturate the channels and many cores cannot exceed them. The spec's own bandwidth must
    already be within the ceiling, since it is what its cores were measured or assumed to draw.
    """
    c = spec.cpu
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if dram_ceiling_bytes_per_s < c.dram_bytes_per_s:
        raise ValueError(f"dram_ceiling_bytes_per_s {dram_ceiling_bytes_per_s:.4g} is below the "
                         f"{c.dram_bytes_per_s:.4g} B/s that {spec.name}'s {c.cores} cores "
                         f"already draw; give the socket's ceiling")
    scale = cores / c.cores
    cpu = c.model_copy(update={
        "name": f"{c.name} scaled to {cores} cores",
        "cores": cores,
        "amx_bf16_flops": c.amx_bf16_flops * scale,
        "avx512_bf16_flops": c.avx512_bf16_flops * scale,
        "dram_bytes_per_s": min(c.dram_bytes_per_s * scale, dram_ceiling_bytes_per_s),
    })
    return spec.model_copy(update={"name": f"{spec.name}@{cores}c", "cpu": cpu})


# --- roofline primitives ------------------------------------------------------------------
@dataclass(frozen=True)
class _Engine:
    """Effective (efficiency-scaled) rates of one execution engine."""

    gemm_flops: float
    attn_flops: float
    mem_bytes_per_s: float
    kernel_s: float

    def kernel(self, flops: float, nbytes: float, attn: bool = False) -> float:
        peak = self.attn_flops if attn else self.gemm_flops
        return max(flops / peak, nbytes / self.mem_bytes_per_s) + self.kernel_s


class _Stages:
    """Stage times of one model on one engine; ``tp`` shards weights, heads and KV."""

    def __init__(
        self,
        shape: ModelShape,
        engine: _Engine,
        tp: int = 1,
        allreduce: Callable[[float], float] = lambda nbytes: 0.0,
        allgather: Callable[[float], float] = lambda nbytes: 0.0,
    ) -> None:
        self.s, self.e, self.tp = shape, engine, tp
        self.allreduce, self.allgather = allreduce, allgather

    def _gemm(self, rows: float, d_in: float, d_out: float) -> float:
        dtb = self.s.dtype_bytes
        params = d_in * d_out
        return self.e.kernel(2 * params * rows, dtb * (params + rows * (d_in + d_out)))

    def _elementwise(self, rows: float, width_in: float, width_out: float) -> float:
        return self.e.kernel(0.0, self.s.dtype_bytes * rows * (width_in + width_out))

    def pre_layer(self, tokens: float) -> float:
        """Embedding gather (vocab-parallel under TP, hence an all-reduce)."""
        h = self.s.hidden_size
        return self._elementwise(tokens, h, h) + self.allreduce(tokens * h * self.s.dtype_bytes)

    def pre_attn(self, tokens: float) -> float:
        """RMSNorm, QKV projection, (q/k norm), RoPE, KV append."""
        s, tp = self.s, self.tp
        h, q, kv = s.hidden_size, s.q_dim / tp, s.kv_dim / tp
        t = self._elementwise(tokens, h, h) + self._gemm(tokens, h, q + 2 * kv)
        if s.qk_norm:
            t += self._elementwise(tokens, q + kv, q + kv)
        rope = self._elementwise(tokens, q + kv, q + kv)
        return t + rope + self._elementwise(tokens, 2 * kv, 2 * kv)

    def post_attn(self, tokens: float) -> float:
        """o_proj, all-reduce, residual + RMSNorm, gate/up, SiLU*mul, down, all-reduce."""
        s, tp = self.s, self.tp
        h, i = s.hidden_size, s.intermediate_size / tp
        act = tokens * h * s.dtype_bytes
        return (
            self._gemm(tokens, s.q_dim / tp, h)
            + self.allreduce(act)
            + self._elementwise(tokens, 2 * h, 2 * h)
            + self._gemm(tokens, h, 2 * i)
            + self._elementwise(tokens, 2 * i, i)
            + self._gemm(tokens, i, h)
            + self.allreduce(act)
        )

    def post_layer(self, rows: float) -> float:
        """Final RMSNorm, vocab-parallel LM head, logits gather, sampling over fp32 logits."""
        s = self.s
        h, v = s.hidden_size, s.vocab_size
        return (
            self._elementwise(rows, h, h)
            + self._gemm(rows, h, v / self.tp)
            + self.allgather(rows * v * s.dtype_bytes)
            + self.e.kernel(0.0, 3 * rows * v * 4)  # softmax, top-p/top-k, draw
        )

    def prefill_attn(self, chunk: float, context: float) -> float:
        """Causal attention of ``chunk`` new tokens over ``context`` tokens (chunk included)."""
        s, tp = self.s, self.tp
        context = max(context, chunk)
        q, kv = s.q_dim / tp, s.kv_dim / tp
        flops = 4 * q * chunk * (context - chunk / 2)
        nbytes = s.dtype_bytes * (context * 2 * kv + 2 * chunk * q)
        return self.e.kernel(flops, nbytes, attn=True)

    def decode_attn(self, batch: float, total_context: float) -> float:
        """Paged decode attention: one query per request over its own KV history."""
        s, tp = self.s, self.tp
        total_context = max(total_context, batch)
        q, kv = s.q_dim / tp, s.kv_dim / tp
        flops = 4 * q * total_context
        nbytes = s.dtype_bytes * (total_context * 2 * kv + 2 * batch * q)
        return self.e.kernel(flops, nbytes, attn=True)

    def copy(self, nbytes: float) -> float:
        """A host-memory copy: reads and writes ``nbytes``."""
        return self.e.kernel(0.0, 2 * nbytes)


# --- grids --------------------------------------------------------------------------------
def _grid(lo: int, hi: int, per_octave: int) -> list[float]:
    """Integer points log-spaced between lo and hi (both included)."""
    n = round(math.log2(hi / lo) * per_octave)
    return [float(v) for v in sorted({round(lo * 2 ** (k / per_octave)) for k in range(n + 1)})]


TOKENS = _grid(1, 16384, 4)  # GPU rows per iteration
BATCH = _grid(1, 2048, 4)  # CPU decode batch / Dense Assist rows
DECODE_BATCH = _grid(1, 2048, 2)
DECODE_CONTEXT = _grid(1, 1 << 22, 2)  # total context tokens of a decode batch (to 4M)
PREFILL_CHUNK = _grid(1, 16384, 2)
PREFILL_CONTEXT = _grid(1, 1 << 17, 2)  # context after the chunk (to 128k)


def _sig(value: float) -> float:
    """4 significant digits: keeps committed profiles small and diffs readable."""
    return float(f"{value:.4g}")


def _table1d(fn: Callable[[float], float], xs: Sequence[float]) -> dict:
    return {"x": list(xs), "y": [_sig(fn(x)) for x in xs]}


def _table2d(fn: Callable[[float, float], float], xs: Sequence[float], ys: Sequence[float]):
    return {"x": list(xs), "y": list(ys), "z": [[_sig(fn(x, y)) for y in ys] for x in xs]}


# --- synthesis ----------------------------------------------------------------------------
def _sharded(shape: ModelShape, engine: _Engine, n: int, latency_s: float,
             bus_bytes_per_s: float | None, link_eff: float) -> _Stages:
    """Stages over `n` tensor-parallel ranks joined by ring collectives (GPUs over NVLink or
    PCIe, CPU ranks over UPI)."""
    if n == 1:
        return _Stages(shape, engine)
    bus = (bus_bytes_per_s or 0.0) * link_eff

    def allreduce(nbytes: float) -> float:  # ring: 2(n-1)/n of the buffer over each link
        return latency_s + 2 * (n - 1) / n * nbytes / bus

    def allgather(nbytes: float) -> float:  # ring: (n-1)/n of the gathered buffer
        return latency_s + (n - 1) / n * nbytes / bus

    return _Stages(shape, engine, n, allreduce, allgather)


def _gpu_stages(spec: HardwareSpec, shape: ModelShape) -> _Stages:
    g, eff = spec.gpu, spec.efficiency
    engine = _Engine(
        gemm_flops=g.bf16_flops * eff.gpu_gemm,
        attn_flops=g.bf16_flops * eff.gpu_attn,
        mem_bytes_per_s=g.hbm_bytes_per_s * eff.gpu_mem,
        kernel_s=g.launch_overhead_s,
    )
    return _sharded(shape, engine, g.count, g.allreduce_latency_s, g.interconnect_bytes_per_s,
                    eff.link)


def _cpu_stages(spec: HardwareSpec, shape: ModelShape) -> _Stages:
    c, eff = spec.cpu, spec.efficiency
    engine = _Engine(
        gemm_flops=c.amx_bf16_flops * eff.cpu_gemm,
        attn_flops=c.avx512_bf16_flops * eff.cpu_gemm,
        mem_bytes_per_s=c.dram_bytes_per_s * eff.cpu_mem,
        kernel_s=c.op_overhead_s,
    )
    return _sharded(shape, engine, c.tensor_parallel, c.allreduce_latency_s,
                    c.interconnect_bytes_per_s, eff.link)


def _kv_blocks(free_bytes: float, block_bytes: float, what: str) -> int:
    if free_bytes <= 0:
        raise ValueError(f"no room for KV cache on the {what} ({free_bytes / GIB:.2f} GiB left)")
    return int(free_bytes // block_bytes)


def gpu_kv_blocks(spec: HardwareSpec, shape: ModelShape, block_size: int, util: float) -> int:
    """HBM left for KV per GPU after weights, workspaces and a transient-activation reserve."""
    g, tp = spec.gpu, spec.gpu.count
    activations = (
        shape.dtype_bytes
        * ACTIVATION_TOKENS
        * (4 * shape.hidden_size + 3 * shape.intermediate_size / tp)
        + 4 * LOGIT_ROWS * shape.vocab_size
    )
    free = g.hbm_gib * GIB * util - shape.weight_bytes / tp - g.reserved_gib * GIB - activations
    return _kv_blocks(free, block_size * shape.kv_bytes_per_token / tp, "GPU")


def host_kv_gib_default(spec: HardwareSpec, shape: ModelShape) -> float:
    """Host memory minus the CPU's own copy of the weights (for AMX) minus an OS reserve."""
    return spec.cpu.host_memory_gib - shape.weight_bytes / GIB - OS_RESERVE_GIB


def _provenance(spec: HardwareSpec, parameters: dict[str, float | None]) -> dict:
    return {
        "method": "roofline",
        "date": dt.date.today().isoformat(),
        "notes": "Derived from published specifications and assumed efficiency factors "
        "(docs/costs.md); not a measurement.",
        "gpu_model": spec.gpu.name,
        "cpu_model": spec.cpu.name,
        "cpu_cores": spec.cpu.cores * spec.cpu.tensor_parallel,
        "amx": True,
        "memory_gib": spec.cpu.host_memory_gib,
        "spec_name": spec.name,
        "spec": spec.model_dump(mode="json"),
        "efficiency": spec.efficiency.model_dump(),
        "parameters": parameters,
        "generator_version": GENERATOR_VERSION,
    }


def _gpu_section(spec: HardwareSpec, gpu: _Stages, kv_blocks: int) -> dict:
    return {
        "pre_attn": _table1d(gpu.pre_attn, TOKENS),
        "post_attn": _table1d(gpu.post_attn, TOKENS),
        "prefill_attn": _table2d(gpu.prefill_attn, PREFILL_CHUNK, PREFILL_CONTEXT),
        "decode_attn": _table2d(gpu.decode_attn, DECODE_BATCH, DECODE_CONTEXT),
        "pre_layer": _table1d(gpu.pre_layer, TOKENS),
        "post_layer": _table1d(gpu.post_layer, TOKENS),
        "iteration_overhead_s": spec.gpu.iteration_overhead_s,
        "kv_capacity_blocks": kv_blocks,
    }


def _cpu_section(spec: HardwareSpec, shape: ModelShape, cpu: _Stages, kv_blocks: int) -> dict:
    hidden = shape.hidden_size * shape.dtype_bytes
    assist_in = (shape.hidden_size + shape.q_dim) * shape.dtype_bytes
    return {
        "pre_layer": _table1d(cpu.pre_layer, BATCH),
        "pre_attn": _table1d(cpu.pre_attn, BATCH),
        "decode_attn": _table2d(cpu.decode_attn, DECODE_BATCH, DECODE_CONTEXT),
        "post_attn": _table1d(cpu.post_attn, BATCH),
        "post_layer": _table1d(cpu.post_layer, BATCH),
        # Assist Buffer traffic: residual + attention output out, one hidden state back.
        "assist_write": _table1d(lambda b: cpu.copy(b * assist_in), BATCH),
        "assist_read": _table1d(lambda b: cpu.copy(b * hidden), BATCH),
        "hidden_write": _table1d(lambda b: cpu.copy(b * hidden), BATCH),
        "iteration_overhead_s": spec.cpu.iteration_overhead_s,
        "kv_capacity_blocks": kv_blocks,
    }


def _assist_section(spec: HardwareSpec, shape: ModelShape, gpu: _Stages) -> dict:
    """g_x(b): the complete CUDA path of one Dense Assist, transfers included (App. B)."""
    h2d = spec.link.h2d_bytes_per_s * spec.efficiency.link  # per GPU
    d2h = spec.link.d2h_bytes_per_s * spec.efficiency.link
    lat = spec.link.latency_s
    hidden = shape.hidden_size * shape.dtype_bytes
    assist_in = (shape.hidden_size + shape.q_dim) * shape.dtype_bytes

    def transfers(b: float, in_per_row: float, out_per_row: float) -> float:
        # Activations are replicated to every TP rank, each over its own link in parallel.
        return 2 * lat + b * in_per_row / h2d + b * out_per_row / d2h

    def g_p(b: float) -> float:
        return transfers(b, assist_in, hidden) + gpu.post_attn(b)

    def g_la(b: float) -> float:
        return transfers(b, assist_in, TOKEN_ID_BYTES) + gpu.post_attn(b) + gpu.post_layer(b)

    def g_ls(b: float) -> float:
        return transfers(b, hidden, TOKEN_ID_BYTES) + gpu.post_layer(b)

    paths = ("p", "lA", "lS")
    return {
        "g_p": _table1d(g_p, BATCH),
        "g_lA": _table1d(g_la, BATCH),
        "g_lS": _table1d(g_ls, BATCH),
        "q": dict.fromkeys(paths, spec.assist.q_s),
        "o": dict.fromkeys(paths, spec.assist.o_s),
        "poll_s": spec.assist.poll_s,
    }


def synthesize(
    spec: HardwareSpec,
    shape: ModelShape,
    *,
    block_size: int = 16,
    gpu_mem_util: float = 0.9,
    host_kv_gib: float | None = None,
) -> Profile:
    """Build a roofline profile; deterministic apart from ``provenance.date``."""
    n = spec.gpu.count
    host_gib = host_kv_gib_default(spec, shape) if host_kv_gib is None else host_kv_gib
    cpu_blocks = _kv_blocks(host_gib * GIB, block_size * shape.kv_bytes_per_token, "host")
    gpu_blocks = gpu_kv_blocks(spec, shape, block_size, gpu_mem_util)
    gpu = _gpu_stages(spec, shape)
    parameters = dict(block_size=block_size, gpu_mem_util=gpu_mem_util, host_kv_gib=host_kv_gib)
    data = {
        "format": PROFILE_FORMAT,
        "provenance": _provenance(spec, parameters),
        "model": shape,
        "box": {
            "name": spec.name,
            "gpu": spec.gpu.name,
            "gpu_count": n,
            "tensor_parallel": n,
            "cpu": spec.cpu.name,
            "cpu_cores": spec.cpu.cores * spec.cpu.tensor_parallel,
            "cpu_tensor_parallel": spec.cpu.tensor_parallel,
        },
        "block_size": block_size,
        "gpu": _gpu_section(spec, gpu, gpu_blocks),
        "cpu": _cpu_section(spec, shape, _cpu_stages(spec, shape), cpu_blocks),
        "assist": _assist_section(spec, shape, gpu),
        "link": {
            # KV moves sharded across the TP group, each GPU over its own link.
            "h2d_bytes_per_s": _sig(n * spec.link.h2d_bytes_per_s * spec.efficiency.link),
            "d2h_bytes_per_s": _sig(n * spec.link.d2h_bytes_per_s * spec.efficiency.link),
            "latency_s": spec.link.latency_s,
        },
    }
    return Profile.model_validate(data)


def _load_shape(model: str) -> ModelShape:
    path = Path(model)
    return ModelShape.from_hf_config(path) if path.exists() else ModelShape.from_name(model)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dualpace_sim.costs.roofline",
        description="Synthesize a roofline calibration profile from a hardware spec.",
    )
    parser.add_argument("spec", help="packaged spec name or path to a spec YAML")
    parser.add_argument("model", help="built-in model name or path to a HF config.json")
    parser.add_argument("--out", required=True, type=Path, help="profile to write (.yaml/.json)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--gpu-mem-util", type=float, default=0.9)
    parser.add_argument("--host-kv-gib", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        profile = synthesize(
            load_spec(args.spec),
            _load_shape(args.model),
            block_size=args.block_size,
            gpu_mem_util=args.gpu_mem_util,
            host_kv_gib=args.host_kv_gib,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    command = " ".join(["python -m dualpace_sim.costs.roofline", *(argv or sys.argv[1:])])
    profile.provenance.command = command
    profile.save(args.out)
    print(
        f"wrote {args.out}: GPU KV {profile.gpu.kv_capacity_blocks} blocks, "
        f"CPU KV {profile.cpu.kv_capacity_blocks} blocks"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
