"""Rank 0's commands to the other GPU ranks, in shared memory.

A tensor-parallel GPU engine runs in lockstep: rank 0 releases each stage of a round to the
other ranks as it issues its own (gpu_ranks.py), and every all-reduce waits for the later rank.
Down a pipe, each release cost tens of microseconds (pickling, a system call, and the reader's
wake-up from a blocking wait): on the 2-GPU box about 1 ms of a 7 ms decode round. Here a
command is four int64s in a ring that the other ranks spin on, so rank 0's store reaches them
within a microsecond or so. x86 keeps stores in order, so a record written before the head moves
is complete when a reader sees the new head (the Dense Assist control block relies on the same).
What does not fit in four integers (a round's batch) still goes by pipe, sent before its record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dualpace_hw.memory.shm import ArenaHandle, SharedArena, TensorRef

OPS = ("round", "s", "end", "a", "copies", "warm", "graph", "stop")
_NAP_S = 50e-6  # past its spin budget a reader checks every ~50 us (a writer with a full ring too)


@dataclass(frozen=True)
class RingRefs:
    """What a reader process needs to map the ring (picklable)."""

    arena: ArenaHandle
    counts: TensorRef  # int64 [1 + readers]: records written, then each reader's records taken
    records: TensorRef  # int64 [slots, 4]: op, then up to three arguments


class CommandRing:
    """The writer's side (rank 0): one ordered stream of commands that every reader takes."""

    def __init__(self, readers: int, slots: int = 4096) -> None:
        shapes = [((1 + readers,), torch.int64), ((slots, 4), torch.int64)]
        self.arena = SharedArena(SharedArena.bytes_for(shapes), "dualpace-commands")
        counts, counts_ref = self.arena.empty(*shapes[0])
        records, records_ref = self.arena.empty(*shapes[1])
        self.counts, self.records, self.slots = counts.numpy(), records.numpy(), slots
        self.refs = RingRefs(self.arena.handle(), counts_ref, records_ref)

    def write(self, op: str, *args: int, readers_alive: Callable[[], bool]) -> None:
        """Append a command; waits while the slowest reader is a whole ring behind."""
        c, n = self.counts, int(self.counts[0])
        while n - int(c[1:].min()) >= self.slots:
            if not readers_alive():
                raise EOFError("a reader of the command ring is gone")
            time.sleep(_NAP_S)
        rec = self.records[n % self.slots]
        rec[0] = OPS.index(op)
        rec[1:] = (*args, *[0] * (3 - len(args)))
        c[0] = n + 1  # last: the record is whole before any reader can see it

    def close(self) -> None:
        self.arena.close()


class RingReader:
    """A reader's side (rank r, index r - 1): takes each command once, in order."""

    def __init__(self, refs: RingRefs, index: int, spin_s: float) -> None:
        """spin_s: how long to spin on an empty ring before napping between checks; spinning
        is polite only on cores of one's own."""
        self.arena = SharedArena.attach(refs.arena)
        self.counts = self.arena.view(refs.counts).numpy()
        self.records = self.arena.view(refs.records).numpy()
        self.slot, self.spin_s = 1 + index, spin_s

    def take(self, writer_gone: Callable[[], bool]) -> tuple[str, int, int, int]:
        """The next command: (op, three arguments). Raises EOFError if the writer is gone."""
        c, n = self.counts, int(self.counts[self.slot])
        spins, spin_until = 0, time.perf_counter() + self.spin_s
        while c[0] <= n:
            spins += 1
            if spins % 256 == 0:
                if writer_gone():
                    raise EOFError("rank 0 is gone")
                if time.perf_counter() > spin_until:
                    time.sleep(_NAP_S)
        op, a, b, d = (int(x) for x in self.records[n % len(self.records)])
        c[self.slot] = n + 1  # after the copy: the writer may reuse the slot from now
        return OPS[op], a, b, d

    def close(self) -> None:
        self.arena.close()
