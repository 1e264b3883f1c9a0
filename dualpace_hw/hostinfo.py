"""What the box is: CPU model and flags, cores, AMX, memory, torch / CUDA / oneDNN versions.
One place for the profiler's provenance, the kernel builds and the benchmarks."""

from __future__ import annotations

import os
import platform
import re
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


def available_memory_bytes() -> int:
    """MemAvailable: what can be allocated without swapping; 0 where /proc says nothing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest cache level's size as sysfs gives it ("32768K"); 0 where it says nothing."""
    best = (0, 0)
    for d in root.glob("index[0-9]*"):
        try:
            level = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit():
            best = max(best, (level, int(digits) * scale))
    return best[1]


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> list[set[int]]:
    """The cores of each NUMA node (one node holding every core where sysfs says nothing)."""
    nodes = []
    for d in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            text = (d / "cpulist").read_text().strip()
        except OSError:
            continue
        cores: set[int] = set()
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
        if cores:
            nodes.append(cores)
    return nodes or [set(range(os.cpu_count() or 1))]


def rank_cores(cores: list[int], world: int, nodes: list[set[int]] | None = None
               ) -> list[tuple[int, ...]]:
    """Split `cores` among `world` tensor-parallel ranks, each its own range. Where the cores
    span several NUMA nodes, ranks are spread over the nodes and no rank straddles two: a
    rank's weights and activations then stay in its node's memory (first touch), and its
    threads read them at local bandwidth. Otherwise (one node, or more ranks than nodes can
    hold whole) consecutive equal ranges."""
    if world > len(cores):
        raise ValueError(f"{world} ranks need at least {world} cores, got {len(cores)}")
    nodes = numa_nodes() if nodes is None else nodes
    local = [sorted(set(cores) & n) for n in nodes]
    local = [c for c in local if c]
    if len(local) > 1 and world % len(local) == 0:
        per_node = world // len(local)
        per = min(len(c) for c in local) // per_node
        if per >= 1:
            return [tuple(c[i * per:(i + 1) * per]) for c in local for i in range(per_node)]
    per = len(cores) // world
    return [tuple(cores[r * per:(r + 1) * per]) for r in range(world)]


def onednn_version(config: str | None = None) -> str | None:
    """The oneDNN version torch was built with, e.g. ``3.12.0``, from its build configuration
    (``torch.__config__.show()``: "Intel(R) MKL-DNN v3.12.0 (Git Hash ...)", or "oneDNN" in
    other builds); None when torch was built without it."""
    text = torch.__config__.show() if config is None else config
    found = re.search(r"(?:oneDNN|MKL-DNN)\s+v?(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


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
