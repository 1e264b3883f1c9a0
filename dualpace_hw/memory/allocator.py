"""Keep freed memory in the process, so the CPU engine's per-step temporaries stop faulting.

A CPU decode step allocates and frees the same few-megabyte temporaries every layer (RoPE's
float32 copies of q and k, norms' outputs, attention outputs). glibc's malloc serves blocks
above its mmap threshold (128 KiB at start, adapted up to 32 MiB) with fresh mappings and
returns them, and heap tops above its trim threshold, to the kernel on free, so every such
temporary is page-faulted in again, 4 KiB at a time: on this project's 2-core machine, RoPE on
128 rows of Llama-3.1-8B's q and k took 5.2 ms that way (1,504 minor faults a call) against
1.8 ms with freed memory kept (`benchmarks/cpu_step/temporaries.py --threads 2`), and the cost grows
with the rows. With both thresholds
raised once, freed blocks stay in the heap and the next step reuses them; the price is a heap
that stays at its high-water mark, which a long-lived engine reaches in its first steps anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # blocks above this (model-sized) are still mapped on their own
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Raise glibc malloc's mmap and trim thresholds for this process (idempotent). Returns
    whether it could: False where the C library is not glibc (musl, macOS), which the engine
    runs on as before."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
