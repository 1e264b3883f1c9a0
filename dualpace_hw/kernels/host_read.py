"""The host's memory read bandwidth, as the CPU engine's threads reach it.

The CPU engine's memory-bound stages (pre-attention at a few rows, decode attention at large
batches) run at the speed the host streams memory, and two machines of one kind can differ
there by 2x (85, 93 and 187 GB/s in three device calls of one session on the H200 box's
kind): a profile made on one machine then
prices runs on another wrongly. `dualpace-hw profile` records this figure in the profile and
`dualpace-hw run` in each run's summary, so `dualpace-sim validate` can tell when they differ.
"""

from __future__ import annotations

import statistics
import time

import torch

from dualpace_hw.hostinfo import last_level_cache_bytes
from dualpace_hw.kernels.cpu_attention import stream_read

READ_SPAN = 4  # the buffer, in last-level caches: a pass reads at most a quarter from cache
MIN_READ_BYTES = 256 << 20  # where sysfs names no cache (64 MiB assumed, as the profiler does)
READ_PASSES = 5


def read_buffer_bytes(cache_bytes: int) -> int:
    """How much a pass reads: READ_SPAN last-level caches, at least MIN_READ_BYTES."""
    return max(READ_SPAN * cache_bytes, MIN_READ_BYTES)


def host_read_bytes_per_s(nbytes: int | None = None, passes: int = READ_PASSES) -> float:
    """Bytes per second of a streaming read (`stream_read`, the C++ extension's, with all of
    the calling thread's OpenMP threads: run it on the CPU engine's cores, with as many
    threads) of `nbytes` (by default `read_buffer_bytes` of this host's cache), the median of
    `passes` passes. The buffer is written first, so no pass reads unmapped pages."""
    n = read_buffer_bytes(last_level_cache_bytes()) if nbytes is None else nbytes
    buf = torch.ones(n, dtype=torch.uint8)
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        stream_read(buf)
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)
