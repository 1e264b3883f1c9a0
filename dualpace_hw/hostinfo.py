"""What the box is: CPU model and flags, cores, AMX, memory, torch / CUDA / oneDNN versions.
One place for the profiler's provenance, the kernel builds and the benchmarks."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import torch


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def has_amx() -> bool:
    return {"amx_bf16", "amx_tile"} <= cpu_flags()


def memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def onednn_version() -> str | None:
    for line in torch.__config__.show().splitlines():
        if "oneDNN" in line or "MKLDNN" in line:
            return line.strip().lstrip("- ")
    return None


def provenance(device: torch.device, threads: int, command: str, date: str) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (GPU path on CPU)"
    return {
        "method": "measured",
        "date": date,
        "command": command,
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "gpu_model": gpu,
        "cpu_cores": threads,
        "amx": has_amx(),
        "memory_gib": round(memory_gib(), 1),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "onednn_version": onednn_version(),
    }
