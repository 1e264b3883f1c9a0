"""CUDA graphs of decode-only rounds, and what every graph capture shares.

Decode-only batches replay per-stage CUDA graphs captured once per (batch, table width) bucket;
the executor keeps them in a small LRU and warms the buckets a run can reach before the clock.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from dualpace_hw.executors.gpu.batch import Batch, FlatBatch
from dualpace_hw.executors.gpu.forward import Forward, ForwardState
from dualpace_hw.executors.gpu.stages import StageKernels
from dualpace_hw.memory.migrate import CopyGroup


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest of `sizes` that holds `n`; past the largest, a multiple of it."""
    for s in sizes:
        if n <= s:
            return s
    return -(-n // sizes[-1]) * sizes[-1]


BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
TABLE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
WARM_GRAPHS = 128  # at most this many decode graphs captured before the clock
WARM_FREE_BYTES = 4 << 30  # and only while this much GPU memory stays free


def decode_graph_keys(max_rows: int, max_context: int, block_size: int,
                      most: int = WARM_GRAPHS) -> list[tuple[int, int]]:
    """The (batch, table width) buckets a run's decode-only rounds can reach, with at most
    `max_rows` requests decoding and `max_context` tokens in any one: small batches first, and
    no more than `most` (the rest are captured on first use, as before)."""
    rows = sorted({bucket(n, BATCH_BUCKETS) for n in range(1, max(1, max_rows) + 1)})
    widths = sorted({bucket(w, TABLE_BUCKETS)
                     for w in range(1, max(1, -(-max_context // block_size)) + 1)})
    return [(r, w) for r in rows for w in widths][:most]


def decode_graph_key(flat: FlatBatch) -> tuple[int, int]:
    """The bucket of a decode-only round."""
    need = max(len(t) for t in flat.tables)
    return bucket(flat.n_dec, BATCH_BUCKETS), bucket(need, TABLE_BUCKETS)


@contextmanager
def no_collection() -> Iterator[None]:
    """Python's garbage collector held off while CUDA graphs are captured. A collection that
    frees another graph mid-capture resets it, which CUDA forbids while a stream captures:
    on the H200 box that aborted the process (the tests' executors of earlier cases). Each
    capture collects first (`torch.cuda.graph` does), so nothing is left waiting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_stages(fns: Sequence[Callable[[], None]], device: torch.device, pool
                   ) -> list[torch.cuda.CUDAGraph]:
    """One CUDA graph per stage of `fns`, in the shared memory `pool`, after one eager run of
    them on a side stream (Triton compiles, cuBLAS picks its kernels). Replay them in order."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool), no_collection():
            f()
        graphs.append(g)
    return graphs


class DecodeGraph:
    """Per-stage CUDA graphs of a decode-only batch of a fixed (rows, table width) bucket.

    Static inputs are padded: extra rows have context 0 (attention writes zeros) and slot -1
    (nothing stored); their sampled tokens are dropped."""

    def __init__(self, kernels: StageKernels, rows: int, width: int) -> None:
        dev = kernels.device
        self.device = dev
        self.rows, self.width = rows, width
        self.ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros(rows, width, dtype=torch.int32, device=dev)
        self.lens = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.batch = Batch(self.ids, self.positions, self.slots, rows, self.tables, self.lens,
                           [], None, [])
        self.state = ForwardState()
        fns = kernels.stage_fns(self.batch, self.state, CopyGroup())
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs = capture_stages(fns, dev, self.mempool)
        self.host = torch.empty(4 * rows + rows * width, dtype=torch.int64, pin_memory=True)
        self.h2d_done: torch.cuda.Event | None = None

    def release(self) -> None:
        for g in self.graphs:
            g.reset()
        self.graphs.clear()

    def forward(self, f: FlatBatch) -> Forward:
        d = f.n_dec
        dev_in = self._upload(f)
        rows, width = self.rows, self.width

        def load_and_pre() -> None:
            self.ids.copy_(dev_in[:rows])
            self.positions.copy_(dev_in[rows:2 * rows])
            self.slots.copy_(dev_in[2 * rows:3 * rows])
            self.lens.copy_(dev_in[3 * rows:4 * rows])
            self.tables.copy_(dev_in[4 * rows:].view(rows, width))
            self.graphs[0].replay()

        stages: list[Callable[[], None]] = [load_and_pre]
        stages += [g.replay for g in self.graphs[1:]]

        def finish() -> dict[int, int]:
            return dict(zip(f.sample_ids, self.state.tokens[:d].tolist(), strict=True))

        return Forward(stages, finish, self.state, CopyGroup(), d)

    def _upload(self, f: FlatBatch) -> torch.Tensor:
        """The round's inputs, padded to the bucket, on their way to the device through the
        graph's pinned buffer (once the previous forward's inputs have left it)."""
        rows, d = self.rows, f.n_dec
        if self.h2d_done is not None:
            self.h2d_done.synchronize()  # the previous forward's inputs left the buffer
        host = self.host
        host[:rows].zero_()
        host[rows:2 * rows].zero_()
        host[2 * rows:3 * rows].fill_(-1)
        host[3 * rows:].zero_()
        host[:d] = torch.tensor(f.ids, dtype=torch.int64)
        host[rows:rows + d] = torch.tensor(f.pos, dtype=torch.int64)
        host[2 * rows:2 * rows + d] = torch.tensor(f.slots, dtype=torch.int64)
        host[3 * rows:3 * rows + d] = torch.tensor(f.lens, dtype=torch.int64)
        tab = host[4 * rows:].view(rows, self.width)
        for i, t in enumerate(f.tables):
            tab[i, : len(t)] = torch.tensor(t, dtype=torch.int64)
        dev_in = host.to(self.device, non_blocking=True)
        self.h2d_done = torch.cuda.Event()
        self.h2d_done.record()
        return dev_in
