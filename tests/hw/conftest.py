"""The hw tests need torch (the `hw` extra); they run on CUDA when DUALPACE_TEST_DEVICE=cuda."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="dualpace_hw needs the hw extra (torch)")


@pytest.fixture(scope="session")
def device() -> str:
    """Where the 'GPU path' runs: the CPU device in CI, CUDA on the accelerator machine."""
    return os.environ.get("DUALPACE_TEST_DEVICE", "cpu")
