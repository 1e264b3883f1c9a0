"""Prepacked oneDNN linears for the CPU executor (AMX on CPUs that have it).

`PackedDense` is a drop-in replacement for `model.Dense`: its weight is reordered once into
oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`) and every call runs the
oneDNN inner product on it (`torch.ops.mkldnn._linear_pointwise`), so oneDNN picks its AMX
kernels (brgemm avx512_core_amx) on Sapphire/Emerald Rapids and AVX512-BF16 ones elsewhere, and
no call pays to reformat the weight. Plain `torch.matmul` on a bf16 CPU tensor also reaches
oneDNN, but with the weight in its plain layout, so each call repacks it on the fly.

These are the ops PyTorch's own Inductor CPU backend emits for frozen bf16 linears; they exist in
torch 2.4 through 2.13 at least (checked on 2.11 on the accelerator machine and 2.13 here).
Where they are missing, or oneDNN has no bf16 kernels for this CPU, or packing fails,
`PackedDense` falls back to `F.linear` and logs why once.

`pack_model(model)` returns a CPU `Model` whose projections (qkv, o, gate_up, down, lm_head) are
`PackedDense`; the embedding and norms are shared with the input model. Packed weights are
oneDNN tensors: they cannot be sent to another process, so a CPU engine in its own process packs
its model there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import Dense, LayerWeights, Model, ModelWeights

log = logging.getLogger("dualpace_hw.packed")
_warned: set[str] = set()
_checked: set[torch.dtype] = set()


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


def _pack_ops_available() -> str | None:
    """None when the oneDNN prepacked-linear ops exist, else the reason they don't."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    for name in ("_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(torch.ops.mkldnn, name):
            return f"torch.ops.mkldnn.{name} is missing in torch {torch.__version__}"
    return None


class PackedDense(Dense):
    """y = x @ W^T with W prepacked for oneDNN (falls back to F.linear where it cannot be).

    `batch_hint`: the row count the layout is tuned for (None lets oneDNN choose; the format it
    picks serves every batch size without a per-call reorder, checked with ONEDNN_VERBOSE).
    `keep_plain`: keep the plain weight too (twice the memory) so `.weight` is free.
    `max_rows`: run inputs of more rows in chunks of this many rows. On the accelerator
    machine's Xeon, oneDNN's packed inner product ran 64 rows at 4-5 TFLOP/s but fell off a
    cliff at 128 and 256 (benchmarks/results/h200-spr16-cpu_kernels.md); 64-row chunks are the
    fix those numbers suggest, not yet measured there, so it is off by default.
    """

    def __init__(
        self, weight: torch.Tensor, batch_hint: int | None = None, keep_plain: bool = False,
        max_rows: int | None = None,
    ) -> None:
        self.max_rows = max_rows
        self._plain: torch.Tensor | None = weight
        self.out_dim, self.in_dim = weight.shape
        self.dtype = weight.dtype
        self.packed: torch.Tensor | None = None
        self.fallback_reason: str | None = None
        reason = _pack_ops_available()
        if reason is None and weight.device.type != "cpu":
            reason = f"the weight is on {weight.device}, not the CPU"
        if reason is None and weight.dtype == torch.bfloat16 and not _mkldnn_bf16_supported():
            reason = "oneDNN has no bf16 kernels for this CPU (needs AVX512BW/VL/DQ or AMX)"
        if reason is None and weight.dtype not in (torch.bfloat16, torch.float32):
            reason = f"dtype {weight.dtype} is not packed (bf16 and fp32 are)"
        if reason is None:
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(
                    weight.contiguous(), batch_hint)
                self._self_check(weight)
            except Exception as e:
                self.packed = None
                reason = f"packing failed: {type(e).__name__}: {e}"
        if reason is not None:
            self.fallback_reason = reason
            _warn_once(reason)
        elif not keep_plain:
            self._plain = None

    def _self_check(self, weight: torch.Tensor) -> None:
        """Once per dtype per process: the packed op agrees with F.linear on a few rows."""
        if weight.dtype in _checked:
            return
        x = torch.randn(3, self.in_dim, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = self._packed_call(x).float()
        ref = F.linear(x.float(), weight.float())
        tol = 2e-2 if weight.dtype == torch.bfloat16 else 1e-4
        err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
        if not err < tol:
            raise RuntimeError(f"packed linear disagrees with F.linear (relative error {err:.3g})")
        _checked.add(weight.dtype)

    def _packed_call(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    @property
    def is_packed(self) -> bool:
        return self.packed is not None

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The plain [out, in] weight (unpacked on demand, which copies, unless keep_plain)."""
        if self._plain is not None:
            return self._plain
        return self.packed.to_dense()

    @weight.setter
    def weight(self, value: torch.Tensor) -> None:
        self.__init__(value, max_rows=self.max_rows)

    @property
    def out_features(self) -> int:
        return self.out_dim

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self._plain)
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        rows = x.numel() // self.in_dim if self.in_dim else 0
        if self.max_rows and rows > self.max_rows:
            flat = x.reshape(rows, self.in_dim)
            y = torch.cat([self._packed_call(c) for c in flat.split(self.max_rows)])
            return y.view(*x.shape[:-1], self.out_dim)
        return self._packed_call(x)


def pack_dense(d: Dense, batch_hint: int | None = None, keep_plain: bool = False,
               max_rows: int | None = None) -> PackedDense:
    if isinstance(d, PackedDense):
        return d
    return PackedDense(d.weight, batch_hint=batch_hint, keep_plain=keep_plain, max_rows=max_rows)


def pack_model(model: Model, batch_hint: int | None = None, keep_plain: bool = False,
               max_rows: int | None = None,
               on_layer: Callable[[int, LayerWeights], None] | None = None) -> Model:
    """A CPU model whose projections are PackedDense (the input model is left as it was).

    `on_layer(i, packed_layer)` runs as each layer is done, so a caller can free that layer's
    plain weights before the next is packed (the peak is one copy of the model, not two)."""
    if model.device.type != "cpu":
        raise ValueError(f"pack_model needs a CPU model, got one on {model.device}")
    w = model.w
    def pk(d: Dense) -> PackedDense:
        return pack_dense(d, batch_hint, keep_plain, max_rows)

    layers = []
    for i, lw in enumerate(w.layers):
        layers.append(dataclasses.replace(lw, qkv=pk(lw.qkv), o=pk(lw.o),
                                          gate_up=pk(lw.gate_up), down=pk(lw.down)))
        if on_layer is not None:
            on_layer(i, layers[-1])
    packed = ModelWeights(embed=w.embed, layers=layers, final_norm=w.final_norm,
                          lm_head=pk(w.lm_head))
    return Model(model.shape, packed, model.reduce)
