"""A stand-in CPU engine for the profiler: decode work on the CPU engine's cores, in a process of
its own, while the main process times the GPU engine's host beside it.

DualPace's GPU engine shares the box with the CPU engine, which decodes on most of the cores and
whose OpenMP threads spin between steps. On the H200 box, DualPace's small prefill rounds, bound
by the host issuing kernels, took about 20 % longer per layer than vLLM's (docs/validation). The
eager floor measured beside this load (`gpu.eager_layer_beside_cpu_s`) is the simulator's floor
for DualPace. The load is one decoder layer's CPU decode step: pre-attention, paged attention
over 16 requests of 1,024 tokens and post-attention, with the CPU executor's kernels, back to
back.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

import torch

from dualpace_hw.executors.model import Model, ModelWeights
from dualpace_hw.memory.kv import PagedKVPool
from dualpace_hw.runtime.processes import spawn, stop
from dualpace_sim.costs.shapes import ModelShape

ROWS, CONTEXT = 16, 1024


@dataclass(frozen=True)
class LoadSpec:
    shape: ModelShape
    seed: int
    block_size: int
    cores: tuple[int, ...]


def _load_main(conn, spec: LoadSpec) -> None:
    from dualpace_hw.executors.packed import pack_model
    from dualpace_hw.kernels.cpu_attention import cpu_paged_decode_attention, pin_threads

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.sched_setaffinity(0, spec.cores)
        torch.set_num_threads(len(spec.cores))
        pin_threads(list(spec.cores))
        s = spec.shape
        model = pack_model(Model(s, ModelWeights.random(s, spec.seed, "cpu", n_layers=1)))
        per = -(-CONTEXT // spec.block_size)
        pool = PagedKVPool(s, ROWS * per, spec.block_size, "cpu", n_layers=1)
        kc, vc = pool.layer(0)
        tables = torch.arange(ROWS * per, dtype=torch.int32).view(ROWS, per)
        lens = torch.full((ROWS,), CONTEXT, dtype=torch.int32)
        x = torch.randn(ROWS, s.hidden_size, dtype=torch.bfloat16)
        pos = torch.full((ROWS,), CONTEXT - 1)
        conn.send(("ready",))
        while not conn.poll():
            q, _, _ = model.pre_attn(0, x, pos)
            attn = cpu_paged_decode_attention(q, kc, vc, tables, lens)
            model.post_attn(0, attn.reshape(ROWS, -1), x)
    except (EOFError, BrokenPipeError):
        return
    except BaseException as e:  # noqa: BLE001 - reported to the profiler
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise


@contextlib.contextmanager
def cpu_engine_load(shape: ModelShape, seed: int, block_size: int, cores: list[int]):
    """Run the stand-in CPU engine on `cores` for the duration of the block."""
    proc, conn = spawn(_load_main, LoadSpec(shape, seed, block_size, tuple(cores)),
                       "dualpace-profile-cpu-load")
    try:
        msg = conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"the profiler's CPU load failed: {msg[1]}")
        yield
    except EOFError as e:
        raise RuntimeError(f"the profiler's CPU load died (exit code {proc.exitcode})") from e
    finally:
        stop([proc], [conn])
