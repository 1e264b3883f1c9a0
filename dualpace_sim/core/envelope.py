"""The host-KV envelope (paper Eq. 2-4) and the migration reserve the GPU publishes.

    B_used + B_planned + B_growth + B_migration <= B_capacity

Both schedulers evaluate it; only the GPU round computes B_migration, the CPU round treats it as
unavailable capacity so that CPU admission can never eat the GPU's future eviction path.
"""

from __future__ import annotations

from collections.abc import Iterable


def migration_reserve(peaks_head_to_tail: Iterable[int], gpu_capacity: int) -> int:
    """B_migration: scan the GPU ownership queue from its eviction tail, moving each request's
    finish-peak into the reserve until the remaining aggregate peak fits HBM (Eq. 4)."""
    peaks = list(peaks_head_to_tail)
    return tail_reserve(reversed(peaks), sum(peaks), gpu_capacity)


def tail_reserve(peaks_tail_first: Iterable[int], total_peak: int, gpu_capacity: int) -> int:
    """B_migration from the queue's finish-peaks read from its eviction tail and their sum
    (kept as a running total): the scan stops as soon as the rest fits HBM, so it reads only
    the tail it reserves."""
    excess = total_peak - gpu_capacity
    reserve = 0
    for peak in peaks_tail_first:
        if reserve >= excess:
            break
        reserve += peak
    return reserve


def extend_reserve(reserve: int, total_peak: int, added_peak: int, gpu_capacity: int) -> int:
    """The reserve after appending one request at the eviction tail.

    The tail is scanned first, so the new minimal suffix is the new request plus the old suffix,
    or nothing when the grown queue still fits HBM.
    """
    return reserve + added_peak if total_peak + added_peak > gpu_capacity else 0


def envelope_fits(used: int, planned: int, growth: int, migration: int, capacity: int) -> bool:
    return used + planned + growth + migration <= capacity
