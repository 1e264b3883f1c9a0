"""q_x and o_x measured through the runtime's Dense Assist control path (profiler/handshake.py):
a client process publishes through the shared control block, the runtime's AssistServer serves."""

from __future__ import annotations

import pytest
import torch

from dualpace_hw.executors.gpu import GpuExecutor
from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.memory.tokens import TokenStore
from dualpace_hw.profiler import handshake
from dualpace_hw.profiler.handshake import measure_handshake
from dualpace_sim.costs.shapes import BUILTIN_SHAPES

SHAPE = BUILTIN_SHAPES["tiny-llama"]
BATCHES = [1, 4]


pytestmark = pytest.mark.usefixtures("keep_the_cores")


def _executor() -> GpuExecutor:
    weights = ModelWeights.random(SHAPE, seed=0, device=torch.device("cpu"))
    return GpuExecutor(Model(SHAPE, weights), PagedKVPool(SHAPE, 4, 16, device="cpu"),
                       TokenStore())


def test_every_kind_pays_a_round_trip_beyond_its_compute():
    """With g = 0 the whole round trip is q and the whole service is o: both positive, and the
    client's wait (publish to GPU-Done) holds the server's service."""
    zero = {k: [0.0] * len(BATCHES) for k in ("p", "lA", "lS")}
    hs = measure_handshake(SHAPE, _executor(), BATCHES, zero, None, None, warmups=1, repeats=3)
    for k in ("p", "lA", "lS"):
        assert hs.o[k] > 0 and hs.q[k] >= hs.o[k]


def test_what_g_already_holds_is_taken_out_and_never_below_zero():
    huge = {k: [10.0] * len(BATCHES) for k in ("p", "lA", "lS")}
    hs = measure_handshake(SHAPE, _executor(), BATCHES, huge, None, None, warmups=1, repeats=3)
    assert set(hs.q.values()) == {0.0} and set(hs.o.values()) == {0.0}


def test_a_client_that_dies_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(handshake, "_client_main", _dies)
    zero = {k: [0.0] * len(BATCHES) for k in ("p", "lA", "lS")}
    with pytest.raises(RuntimeError, match="handshake client stopped after 0 of"):
        measure_handshake(SHAPE, _executor(), BATCHES, zero, None, None, warmups=1, repeats=1,
                          timeout_s=20)


def _dies(conn, spec) -> None:
    raise SystemExit(3)
