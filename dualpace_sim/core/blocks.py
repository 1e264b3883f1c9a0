"""Paged KV block pools, one per tier (HBM and host DRAM).

The pool owns the block ids; schedulers hold only the ids a request was handed. Ids are what the
real runtime addresses its paged KV tensors with, so there is no translation table of our own.
"""

from __future__ import annotations

from collections.abc import Iterable

from .request import Request


class BlockPool:
    """A fixed number of equally sized KV blocks with a LIFO free list (reuse keeps caches warm)."""

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"{name} pool: capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` block ids; the caller has checked `free` (over-allocation is a bug)."""
        if n > len(self._free):
            raise RuntimeError(f"{self.name} pool over-allocated: want {n}, free {len(self._free)}")
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        return taken

    def release(self, blocks: list[int]) -> None:
        self._free.extend(blocks)
        assert len(self._free) <= self.capacity, f"{self.name} pool: double free"


def retire_finished(
    queue: Iterable[Request], pool: BlockPool, finished: list[Request]
) -> list[Request]:
    """Move the finished requests of `queue` to `finished`, releasing their blocks to `pool`;
    return the others in their order."""
    keep = []
    for r in queue:
        if r.finished:
            pool.release(r.blocks)
            r.blocks = []
            finished.append(r)
        else:
            keep.append(r)
    return keep
