"""Python's cyclic garbage collector while a run serves: young collections only.

A full (generation 2) collection walks every object the process holds. The GPU engine's process
holds more and more as it serves (journal entries, token lists, records), and on the H200 box a
full pass stalled it for 0.19-0.54 s at the same points of every run: decode rounds of 1-5 rows
at about 33, 36, 100 and 172 s into sustained-r3, its CPU engine waiting on its Dense Assists
meanwhile (docs/validation/README.md, session 24). Requests that arrived in one made the real
P99 TTFT tail, which the simulator, rightly, did not have. So while a run serves, the engines'
processes keep the young collections (cycles among new objects are still freed), skip the full
ones, and leave what loading and the warm-up made out of every pass (`gc.freeze`). The
collections and their pauses are counted for the run's summary.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

# The full generation's threshold while serving: a count of young collections never reached.
NEVER = 1 << 30


@dataclass
class Collections:
    """The collections made while serving and what they paused the process for."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])  # per generation
    pause_s: float = 0.0
    longest_s: float = 0.0


class ServingCollector:
    """A context: young collections only, the objects made before it frozen, each collection
    timed; thresholds, callbacks and frozen objects as they were after it."""

    def __init__(self) -> None:
        self.seen = Collections()
        self._started = 0.0
        self._threshold = (0, 0, 0)  # the thresholds on entry, restored on exit

    def _time(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.seen.counts[info["generation"]] += 1
        self.seen.pause_s += pause
        self.seen.longest_s = max(self.seen.longest_s, pause)

    def __enter__(self) -> ServingCollector:
        gc.collect()
        gc.freeze()
        self._threshold = gc.get_threshold()
        young, middle, _ = self._threshold
        gc.set_threshold(young, middle, NEVER)
        gc.callbacks.append(self._time)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._time)
        gc.set_threshold(*self._threshold)
        gc.unfreeze()
