"""The hw tests need torch (the `hw` extra); they run on CUDA when DUALPACE_TEST_DEVICE=cuda."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="dualpace_hw needs the hw extra (torch)")


@pytest.fixture(scope="session")
def device() -> str:
    """Where the 'GPU path' runs: the CPU device in CI, CUDA on the accelerator machine."""
    return os.environ.get("DUALPACE_TEST_DEVICE", "cpu")


@pytest.fixture
def keep_the_cores():
    """Code under test that pins this process (the profiler, the handshake's server) gets the
    cores and thread count back for the next test."""
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    yield
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
