"""The CPU engine keeps freed memory: its per-layer temporaries stop being faulted in again.

Counted in minor page faults per call of RoPE on Llama-3.1-8B's q and k at 256 rows (a few MB
of float32 temporaries), each in a fresh process: malloc's settings are the process's."""

from __future__ import annotations

import statistics
import subprocess
import sys
import textwrap

import pytest

from dualpace_hw.memory.allocator import keep_freed_memory

SETUP = {
    "defaults": "",
    "kept": "from dualpace_hw.memory.allocator import keep_freed_memory; keep_freed_memory()",
    "the CPU executor's": textwrap.dedent("""
        from dualpace_hw.executors.cpu_executor import CpuExecutor
        from dualpace_hw.memory.kv import PagedKVPool
        from dualpace_hw.executors.model import Model, ModelWeights
        tiny = ModelShape.from_name("tiny-llama")
        CpuExecutor(Model(tiny, ModelWeights.random(tiny, 0, "cpu")),
                    PagedKVPool(tiny, 4, 16, "cpu"), tokens=None).configure_thread()"""),
}

CODE = """
import resource, torch
from dualpace_hw.executors.model import Rope
from dualpace_sim.costs.shapes import ModelShape
{setup}
shape = ModelShape.from_name("llama-3.1-8b")
rope, pos = Rope(shape), torch.arange(256) + 1000
q = torch.randn(256, shape.n_heads, shape.head_dim).to(torch.bfloat16)
k = torch.randn(256, shape.n_kv_heads, shape.head_dim).to(torch.bfloat16)
for _ in range(10):  # the heap reaches its high-water mark
    rope.apply(q, pos), rope.apply(k, pos)
for _ in range(7):  # windows of 5 calls: now and then the heap still grows a few MB in one
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        rope.apply(q, pos), rope.apply(k, pos)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5)
"""


def faults_per_call(setup: str) -> float:
    """The median window's minor faults per call: a steady state, not one window in which the
    heap still grew (a CI run once counted 90 a call over a single window of 10 calls)."""
    done = subprocess.run([sys.executable, "-c", CODE.format(setup=SETUP[setup])],
                          capture_output=True, text=True, timeout=300, check=True)
    return statistics.median(float(line) for line in done.stdout.strip().splitlines()[-7:])


@pytest.mark.skipif(not keep_freed_memory(), reason="glibc's malloc only")
def test_kept_freed_memory_stops_the_temporaries_faulting():
    assert faults_per_call("defaults") > 200  # the cause: every temporary faulted in again
    assert faults_per_call("kept") < 10


@pytest.mark.skipif(not keep_freed_memory(), reason="glibc's malloc only")
def test_the_cpu_executor_keeps_freed_memory():
    assert faults_per_call("the CPU executor's") < 10
