"""While a run serves, its processes make young garbage collections only: a full one walks every
object the process holds, and stalled the GPU engine for 0.2-0.5 s on the H200 box."""

from __future__ import annotations

import gc
import weakref

from dualpace_hw.runtime.collector import ServingCollector


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_serving_makes_young_collections_but_no_full_one():
    before = gc.get_threshold()
    with ServingCollector() as collector:
        kept = []
        for _ in range(60):  # many long-lived objects, as a serving run's records are
            kept.append([[i] for i in range(10_000)])
        cycle = Node()
        gone = weakref.ref(cycle)
        del cycle
        for _ in range(5_000):
            Node()  # young garbage, as serving makes
        young, middle, full = collector.seen.counts
        assert young > 0 and full == 0, collector.seen
        assert gone() is None  # young collections still free new cycles
        assert collector.seen.longest_s <= collector.seen.pause_s
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert ServingCollector._time not in gc.callbacks


def test_without_it_the_same_work_makes_full_collections():
    """What the test above guards against: the same allocations do trigger full passes."""
    seen = []

    def count(phase: str, info: dict) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        kept = []
        for _ in range(60):
            kept.append([[i] for i in range(10_000)])
        for _ in range(5_000):
            Node()
    finally:
        gc.callbacks.remove(count)
    assert 2 in seen
