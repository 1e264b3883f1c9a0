"""The CPU executor's dense projections: bf16 weights reordered once, AMX where the CPU has it.

`PackedDense` is a drop-in replacement for `model.Dense`. Its weight is reordered at load into
the blocked layout of the extension's dense kernel (`csrc/dense.cpp`: column blocks of 32 in
the VNNI-2 order AMX and vdpbf16ps read), and every call runs that kernel: AMX tiles for more
than `SMALL_ROWS` rows, AVX512-BF16 for fewer (or everywhere on CPUs without AMX). Each thread
owns a contiguous range of the weight's column blocks, so a call reads the weight from DRAM
once at any row count. Why not oneDNN through torch: plain `F.linear`
repacks the weight on every call above 64 rows (20-40 GB/s, 2.6 TF/s at 128 rows on the H200
box) and the prepacked inner product Inductor emits fell off a cliff above 64 rows
(benchmarks/results/kernels/README.md).

Where the kernel cannot run (no C++ extension, a CPU with neither AMX-BF16 nor AVX512-BF16, a
non-bf16 weight) `PackedDense` falls back to `F.linear` and logs why once.

`pack_model(model)` returns a CPU `Model` whose projections (qkv, o, gate_up, down, lm_head) are
`PackedDense`; the embedding and norms are shared with the input model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from dualpace_hw.executors.model import Dense, LayerWeights, Model, ModelWeights
from dualpace_hw.kernels.cpu_attention import extension_info, load_extension

log = logging.getLogger("dualpace_hw.executors.packed")
_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("PackedDense falls back to F.linear: %s", reason)


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_features() -> dict[str, object]:
    """What this CPU offers the dense and attention kernels (from /proc/cpuinfo and torch)."""
    info = _read_cpuinfo()
    flags: set[str] = set()
    model = ""
    mhz: list[float] = []
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "model name" and not model:
            model = value.strip()
        elif key == "cpu MHz":
            with contextlib.suppress(ValueError):
                mhz.append(float(value))
    feats: dict[str, object] = {
        "model_name": model,
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "amx_bf16": "amx_bf16" in flags,
        "amx_tile": "amx_tile" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512f": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "cpuinfo_mhz": max(mhz) if mhz else None,
        "torch_version": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "mkldnn_bf16": _mkldnn_bf16_supported(),
        "torch_threads": torch.get_num_threads(),
    }
    # Whether the kernel lets this process use the AMX tiles (Linux asks for permission first).
    init_amx = getattr(torch.cpu, "_init_amx", None)
    try:
        feats["amx_usable"] = bool(init_amx()) if init_amx is not None else None
    except Exception:  # pragma: no cover - depends on the kernel
        feats["amx_usable"] = False
    return feats


def _mkldnn_bf16_supported() -> bool:
    fn = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:
        return False


def cpu_clock_ghz() -> tuple[float | None, str]:
    """The clock used for the AMX peak, and where it came from: lscpu's max MHz, else the base
    frequency in the model name (Intel names end '@ 2.10GHz'), else /proc/cpuinfo's current MHz."""
    try:
        import subprocess

        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"CPU max MHz:\s*([\d.]+)", out)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)) / 1000, "lscpu 'CPU max MHz'"
    except Exception:
        pass
    feats = cpu_features()
    m = re.search(r"@\s*([\d.]+)\s*GHz", str(feats["model_name"]))
    if m:
        return float(m.group(1)), "base clock in the CPU model name"
    if feats["cpuinfo_mhz"]:
        return float(feats["cpuinfo_mhz"]) / 1000, "/proc/cpuinfo 'cpu MHz'"
    return None, "unknown"


@functools.cache
def dense_isas() -> list[str]:
    """The dense kernel's paths this machine can run, fastest first: "amx" (our AMX tile kernel)
    and "brgemm" (the same tiles through ATen's oneDNN ukernel), where the CPU has AMX-BF16 and
    the kernel lets this process use it; "avx512bf16" where the extension was built for it;
    "portable" (plain C++, which tests run everywhere). [] without the extension."""
    if not load_extension():
        return []
    built = torch.ops.dualpace_cpu.dense_isas()
    feats = cpu_features()
    amx = bool(feats["amx_bf16"] and feats["amx_tile"] and feats["amx_usable"])
    isas = [name for code, name in (("3", "amx"), ("2", "brgemm")) if amx and code in built]
    if "1" in built:
        isas.append("avx512bf16")
    return isas + ["portable"]


_ISA_CODES = {"portable": 0, "avx512bf16": 1, "brgemm": 2, "amx": 3}
# How far ahead (in 32-k steps of 2 KiB of weight) the AMX path prefetches the weight stream.
AMX_PREFETCH_STEPS = 4


def amx_tile_peak(iters: int = 200_000) -> float:
    """FLOP/s of AMX tile multiplies alone (TDPBF16PS on data held in tile registers) with the
    calling thread's OpenMP team: the hardware's ceiling, which no GEMM reaches. 0.0 where the
    extension has no AMX kernel or the CPU has no AMX."""
    if "amx" not in dense_isas():
        return 0.0
    t0 = time.perf_counter()
    flops = torch.ops.dualpace_cpu.tile_peak_flops(iters)
    return flops / (time.perf_counter() - t0)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 -> the kernel's blocked layout [ceil(N/32), K/2, 32, 2] (csrc/dense.cpp)."""
    if weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
        raise ValueError(f"pack_weight wants a 2-D bf16 weight of even in_features, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    return torch.ops.dualpace_cpu.pack_linear_weight(weight.contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                  isa: str, ahead: int = AMX_PREFETCH_STEPS) -> torch.Tensor:
    """[M, K] bf16 @ the packed [N, K] weight -> [M, N] bf16, on the named path (checked here,
    not in C++: a C++ exception from an op crashed the process under torch 2.11). `ahead`: the
    AMX path's weight prefetch distance in 32-k steps (0: none)."""
    if isa not in _ISA_CODES:
        raise ValueError(f"unknown dense kernel path {isa!r}; one of {sorted(_ISA_CODES)}")
    k = packed.shape[1] * 2
    if isa == "amx" and k % 32:
        raise ValueError(f"the AMX path needs in_features in multiples of 32, got {k}")
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16:
        raise ValueError(f"packed_linear wants x [M, {k}] bf16, got {tuple(x.shape)} {x.dtype}")
    if not 0 < out_features <= packed.shape[0] * 32:
        raise ValueError(f"out_features {out_features} does not fit the packed weight "
                         f"{tuple(packed.shape)}")
    return torch.ops.dualpace_cpu.packed_linear(x.contiguous(), packed, out_features,
                                                _ISA_CODES[isa], ahead)


# Rows up to which the AVX512-BF16 path runs even where AMX is there: a few rows leave AMX's
# 16-row tiles mostly empty while both paths stream the same weight bytes.
SMALL_ROWS = 4


class PackedDense(Dense):
    """y = x @ W^T with W reordered once into the dense kernel's blocked layout (csrc/dense.cpp):
    AMX tiles where the CPU has them, AVX512-BF16 for few rows or where AMX is absent. Falls
    back to F.linear, with the reason logged once, where neither runs (no extension, a CPU
    without AVX512-BF16, a non-bf16 or non-CPU weight).

    `keep_plain`: keep the plain weight too (twice the memory) so `.weight` is free.
    """

    def __init__(self, weight: torch.Tensor, keep_plain: bool = False) -> None:
        self._plain: torch.Tensor | None = weight
        self.out_dim, self.in_dim = weight.shape
        self.dtype = weight.dtype
        self.packed: torch.Tensor | None = None
        self.isa: str | None = None
        self.small_isa: str | None = None
        self.fallback_reason: str | None = None
        isas = [i for i in dense_isas()
                if i != "portable" and (i != "amx" or self.in_dim % 32 == 0)]
        reason = None
        if weight.device.type != "cpu":
            reason = f"the weight is on {weight.device}, not the CPU"
        elif weight.dtype != torch.bfloat16:
            reason = f"dtype {weight.dtype} is not packed (bf16 is)"
        elif not isas:
            reason = ("the CPU dense kernel needs AMX-BF16 or AVX512-BF16 and the C++ "
                      f"extension ({extension_info()['error'] or 'built without either'})")
        elif self.in_dim % 2:
            reason = f"in_features {self.in_dim} is odd"
        if reason is None:
            self.packed = pack_weight(weight)
            self.isa = isas[0]
            self.small_isa = "avx512bf16" if "avx512bf16" in isas else self.isa
            if not keep_plain:
                self._plain = None
        else:
            self.fallback_reason = reason
            _warn_once(reason)

    @property
    def is_packed(self) -> bool:
        return self.packed is not None

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The plain [out, in] weight (unpacked on demand, which copies, unless keep_plain)."""
        if self._plain is not None:
            return self._plain
        return unpack_weight(self.packed, self.out_dim)

    @weight.setter
    def weight(self, value: torch.Tensor) -> None:
        self.__init__(value)

    @property
    def out_features(self) -> int:
        return self.out_dim

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self._plain)
        flat = x.reshape(-1, self.in_dim).to(self.dtype)
        isa = self.small_isa if flat.shape[0] <= SMALL_ROWS else self.isa
        y = packed_linear(flat, self.packed, self.out_dim, isa)
        return y.view(*x.shape[:-1], self.out_dim)


def unpack_weight(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """The blocked layout back to the plain [N, K] weight (tests, and `.weight` on demand)."""
    nb, k2, bn, _ = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(nb * bn, k2 * 2)[:out_features].contiguous()


def pack_dense(d: Dense, keep_plain: bool = False) -> PackedDense:
    if isinstance(d, PackedDense):
        return d
    return PackedDense(d.weight, keep_plain=keep_plain)


def pack_model(model: Model, keep_plain: bool = False,
               on_layer: Callable[[int, LayerWeights], None] | None = None) -> Model:
    """A CPU model whose projections are PackedDense (the input model is left as it was).

    `on_layer(i, packed_layer)` runs as each layer is done, so a caller can free that layer's
    plain weights before the next is packed (the peak is one copy of the model, not two)."""
    if model.device.type != "cpu":
        raise ValueError(f"pack_model needs a CPU model, got one on {model.device}")
    w = model.w
    def pk(d: Dense) -> PackedDense:
        return pack_dense(d, keep_plain)

    layers = []
    for i, lw in enumerate(w.layers):
        layers.append(dataclasses.replace(lw, qkv=pk(lw.qkv), o=pk(lw.o),
                                          gate_up=pk(lw.gate_up), down=pk(lw.down)))
        if on_layer is not None:
            on_layer(i, layers[-1])
    packed = ModelWeights(embed=w.embed, layers=layers, final_norm=w.final_norm,
                          lm_head=pk(w.lm_head))
    return Model(model.shape, packed, model.reduce if model.sharded else None)
