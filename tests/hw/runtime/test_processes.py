"""Child processes of the runtime: `as_cpu_engine` runs a function with the CPU engine's thread
placement, in a process of its own, so the caller keeps its cores and threads."""

from __future__ import annotations

import os

import pytest
import torch

from dualpace_hw.runtime.processes import as_cpu_engine


def placement() -> tuple[set[int], int]:
    return os.sched_getaffinity(0), torch.get_num_threads()


def fails() -> None:
    raise ValueError("no such table")


def test_the_function_runs_on_the_engines_cores_and_the_caller_keeps_its_own():
    mine = placement()
    core = min(mine[0])
    assert as_cpu_engine(placement, (), [core], "test-engine") == ({core}, 1)
    assert as_cpu_engine(placement, (), None, "test-engine")[0] == mine[0]  # unpinned: all
    assert placement() == mine


def test_a_failure_in_the_child_is_raised_in_the_caller_with_its_message():
    with pytest.raises(RuntimeError, match="test-engine: ValueError: no such table"):
        as_cpu_engine(fails, (), None, "test-engine")


def test_every_thread_of_the_process_is_placed_again():
    """The profiler pins its OpenMP threads for the CPU stages and lets them go before it
    serves the calibration workload: a thread pinned elsewhere gets the given cores back."""
    import threading

    from dualpace_hw.runtime.processes import place_all_threads

    mine = os.sched_getaffinity(0)
    started, release = threading.Event(), threading.Event()
    tid = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        os.sched_setaffinity(0, {min(mine)})  # pinned, as pin_threads leaves a worker
        started.set()
        release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    try:
        assert os.sched_getaffinity(tid[0]) == {min(mine)}
        place_all_threads(mine)
        assert os.sched_getaffinity(tid[0]) == mine
    finally:
        release.set()
        t.join()
