"""Checks of `dualpace-hw`'s command-line arguments, made before anything is loaded or measured.

A profile measures for many minutes and a real run loads a model and allocates its KV pools,
so an argument that cannot work (cores this process may not run on, a device torch does not
have, a KV pool larger than the host's memory, an output path that is a file or a device) must
fail first, as one line naming the option and the fix, and never after the work or as a
traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from dualpace_hw import hostinfo
from dualpace_sim.costs.shapes import ModelShape

GIB = 2**30
DEVICES = "'cuda', 'cuda:N' or 'cpu' (tests)"


class ArgumentError(ValueError):
    """An argument that cannot work; the message is one line naming the option and the fix."""


def check_cpu_cores(cores: int | None) -> None:
    """``--cpu-cores``: left out means every core this process may run on; given, it must be
    between 1 and that many (0 or a negative count used to mean "all" silently)."""
    if cores is None:
        return
    usable = hostinfo.usable_cores()
    if cores < 1:
        raise ArgumentError(f"--cpu-cores {cores}: must be at least 1; leave it out to use all "
                            f"{usable} cores this process may run on")
    if cores > usable:
        raise ArgumentError(f"--cpu-cores {cores}: this process may run on {usable} cores (its "
                            f"CPU affinity); give at most {usable}")


def check_device(device: str, option: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ArgumentError(f"{option} {device}: not a device this runtime has; give {DEVICES}")


def check_out_dir(out: Path) -> None:
    """A results directory: absent (it is created) or a directory."""
    _check_ancestors(out, "--out")
    if out.exists() and not out.is_dir():
        raise ArgumentError(f"--out {out}: is a file; give a directory for the results")


def check_out_file(out: Path, option: str = "--out") -> None:
    """A file to write: absent or a regular file, in a folder that is (or can be) a folder;
    not a directory and not a device such as /dev/full (written to after all the work)."""
    _check_ancestors(out, option)
    if out.is_dir():
        raise ArgumentError(f"{option} {out}: is a directory; give a file path in it")
    if out.exists() and not out.is_file():
        raise ArgumentError(f"{option} {out}: not a regular file (a device?); give a file path")


def _check_ancestors(path: Path, option: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ArgumentError(f"{option} {path}: {parent} is a file, not a folder")
            return


def check_host_kv(host_kv_blocks: int, block_size: int, shape: ModelShape, source: str) -> None:
    """The host KV pool the run would allocate must fit the host's memory beside the CPU
    engine's copy of the weights; it is refused here rather than by the OOM killer."""
    block_bytes = block_size * shape.kv_bytes_per_token
    need = host_kv_blocks * block_bytes
    have = hostinfo.available_memory_bytes()
    if have and need + shape.weight_bytes > have:
        fits = max(int((have - shape.weight_bytes) // block_bytes), 0)
        raise ArgumentError(
            f"{source}: the host KV pool of {host_kv_blocks:,} blocks needs {need / GIB:,.1f} GiB "
            f"and the weights {shape.weight_bytes / GIB:,.1f} GiB, but this host has "
            f"{have / GIB:,.1f} GiB available; set scheduler.host_kv_blocks to at most {fits:,}")


def check_kv_gib(gpu_kv_gib: float | None, host_kv_gib: float | None) -> None:
    """``profile --gpu-kv-gib / --host-kv-gib``: positive, and the host's within its memory."""
    for option, value in (("--gpu-kv-gib", gpu_kv_gib), ("--host-kv-gib", host_kv_gib)):
        if value is not None and not value > 0:
            raise ArgumentError(f"{option} {value:g}: must be > 0 (GiB); leave it out to size "
                                "the pool from the free memory")
    have = hostinfo.available_memory_bytes() / GIB
    if host_kv_gib is not None and have and host_kv_gib > have:
        raise ArgumentError(f"--host-kv-gib {host_kv_gib:g}: this host has {have:,.1f} GiB "
                            "available; give less, or leave it out to size the pool from it")
