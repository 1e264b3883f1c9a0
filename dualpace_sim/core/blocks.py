"""Paged KV block pools, one per tier (HBM and host DRAM).

The pool owns the block ids; schedulers hold only the ids a request was handed. Ids are what the
real runtime addresses its paged KV tensors with, so there is no translation table of our own.
"""

from __future__ import annotations

from collections.abc import Iterable

from .request import Request


class BlockPool:
    """A fixed number of equally sized KV blocks with a LIFO free list (reuse keeps caches warm).

    Ids never handed out yet are not listed: they are the range ``[_fresh, capacity)``, taken
    from its low end, so a pool of any capacity costs memory only for the blocks in use, and
    the ids handed out are those of a free list that started as ``capacity-1, ..., 1, 0``.
    """

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"{name} pool: capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = capacity
        # Blocks free and handed out: plain counts kept by allocate and release, since every
        # round of every engine reads them (a 2k-request run ~130k times).
        self.free = capacity
        self.used = 0
        self._released: list[int] = []  # returned ids, reused last-in first-out
        self._fresh = 0  # ids below this have been handed out at least once

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` block ids; the caller has checked `free` (over-allocation is a bug)."""
        if n > self.free:
            raise RuntimeError(f"{self.name} pool over-allocated: want {n}, free {self.free}")
        if n == 0:
            return []
        self.free -= n
        self.used += n
        reused = len(self._released)
        if n <= reused:
            taken = self._released[-n:]
            del self._released[-n:]
            return taken
        start, self._fresh = self._fresh, self._fresh + n - reused
        taken = list(range(self._fresh - 1, start - 1, -1)) + self._released
        self._released = []
        return taken

    def release(self, blocks: list[int]) -> None:
        self._released.extend(blocks)
        n = len(blocks)
        self.free += n
        self.used -= n
        assert self.used >= 0, f"{self.name} pool: double free"


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
