"""The runtime's benchmarks need torch (the `hw` extra): their tests run each script end to end
on the CPU device with a tiny model, so that it keeps working between runs on the box."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the runtime's benchmarks need the hw extra (torch)")
