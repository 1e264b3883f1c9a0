"""A GpuPlan flattened into a batch: host lists first (what a tensor-parallel rank 0 sends its
peers), then tensors on the model's device.

The rows: the decodes first (one row each: the request's last token at position
prompt + generated - 1), then the prefill chunks (prompt ids start .. start + tokens - 1), then
the external decodes whose attention is computed elsewhere (NEO's CPU). The sampled rows are the
decodes and the last row of every chunk that completes its prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import torch

from dualpace_hw.kernels import attention as ref_attn
from dualpace_hw.memory.kv import slot_mapping
from dualpace_hw.memory.tokens import TokenStore
from dualpace_sim.core.plans import GpuPlan, PrefillChunk
from dualpace_sim.core.request import Request


@dataclass
class ChunkRows:
    """A prefill chunk's rows in the batch."""

    row0: int
    n: int
    start: int
    req_id: int
    blocks: list[int]  # GPU block ids, or host block ids for a Prefill-to-CPU chunk
    to_cpu: bool
    last: bool
    table: torch.Tensor | None = None  # GPU block table (GPU-bound chunks), set by to_device
    cu: torch.Tensor | None = None  # the flash kernel's lengths on the device, set by to_device


@dataclass
class Batch:
    """A GpuPlan flattened into tensors on the model's device."""

    ids: torch.Tensor  # [T] token ids
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] slots in the GPU pool; -1 for Prefill-to-CPU rows
    n_dec: int
    block_tables: torch.Tensor  # [D, max blocks] int32 (decodes)
    context_lens: torch.Tensor  # [D] int32, tokens including the current one
    chunks: list[ChunkRows]
    sample_rows: torch.Tensor | None  # rows that sample; None = every row
    sample_req_ids: list[int]
    gpu_blocks: set[int] = field(default_factory=set)  # HBM blocks read or written
    swapped_in: bool = False  # a decode was swapped in this round
    n_ext: int = 0  # trailing decode rows whose attention is computed elsewhere (NEO's CPU)
    padded: bool = False  # rows may pad a graph's bucket: slot -1, never sampled
    cos: torch.Tensor | None = None  # [T, hd/2] fp32 (fused path)
    sin: torch.Tensor | None = None

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class FlatBatch:
    """A plan flattened into host lists (what `to_device` turns into tensors)."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    n_dec: int = 0
    chunks: list[ChunkRows] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    sample_ids: list[int] = field(default_factory=list)
    gpu_blocks: set[int] = field(default_factory=set)
    swapped_in: bool = False
    n_ext: int = 0


def flatten(plan: GpuPlan, tokens: TokenStore, block_size: int,
            external: Sequence[Request] = (), host_copies: bool = False) -> FlatBatch:
    """The plan's rows as host lists, checked against the token store. `host_copies`: the
    executor can copy a Prefill-to-CPU chunk's pages to the host (it has a migrator)."""
    f = FlatBatch()
    for r in plan.decodes:
        _add_decode(f, r, tokens.ids(r.req_id), block_size)
    f.n_dec = len(f.ids)
    for c in plan.prefills:
        _add_chunk(f, c, tokens.ids(c.req.req_id), block_size, host_copies)
    for r in external:
        _add_external(f, r, tokens.ids(r.req_id))
    swapped = {id(r) for r in plan.swap_ins}
    f.swapped_in = any(id(r) in swapped for r in plan.decodes)
    return f


def _add_decode(f: FlatBatch, r: Request, toks: list[int], bs: int) -> None:
    n = r.prompt_tokens + r.generated
    if len(toks) != n:
        raise ValueError(f"request {r.req_id}: the token store holds {len(toks)} ids, "
                         f"the core counts {n}")
    if len(r.blocks) * bs < n:
        raise ValueError(f"request {r.req_id}: {len(r.blocks)} blocks hold no {n} tokens")
    p = n - 1
    f.sample_rows.append(len(f.ids))
    f.sample_ids.append(r.req_id)
    f.ids.append(toks[p])
    f.pos.append(p)
    f.slots.append(r.blocks[p // bs] * bs + p % bs)
    used = r.blocks[: -(-n // bs)]
    f.tables.append(used)
    f.lens.append(n)
    f.gpu_blocks.update(used)


def _add_chunk(f: FlatBatch, c: PrefillChunk, toks: list[int], bs: int,
               host_copies: bool) -> None:
    r = c.req
    if len(toks) < c.start + c.tokens:
        raise ValueError(f"request {r.req_id}: chunk {c.start}+{c.tokens} past its ids")
    if c.to_cpu and not host_copies:
        raise ValueError("a Prefill-to-CPU chunk needs a host pool and a migrator")
    ch = ChunkRows(len(f.ids), c.tokens, c.start, r.req_id, list(r.blocks), c.to_cpu, c.last)
    f.ids.extend(toks[c.start:c.start + c.tokens])
    f.pos.extend(range(c.start, c.start + c.tokens))
    if c.to_cpu:
        f.slots.extend([-1] * c.tokens)
    else:
        f.slots.extend(slot_mapping(r.blocks, c.start, c.tokens, bs))
        f.gpu_blocks.update(r.blocks[: -(-(c.start + c.tokens) // bs)])
    if c.last:
        f.sample_rows.append(len(f.ids) - 1)
        f.sample_ids.append(r.req_id)
    f.chunks.append(ch)


def _add_external(f: FlatBatch, r: Request, toks: list[int]) -> None:
    """A decode with no HBM slot: its K/V and attention live elsewhere."""
    p = r.prompt_tokens + r.generated - 1
    if len(toks) != p + 1:
        raise ValueError(f"request {r.req_id}: the token store holds {len(toks)} ids, "
                         f"the core counts {p + 1}")
    f.sample_rows.append(len(f.ids))
    f.sample_ids.append(r.req_id)
    f.ids.append(toks[p])
    f.pos.append(p)
    f.slots.append(-1)
    f.n_ext += 1


def to_device(f: FlatBatch, block_size: int, device: torch.device) -> Batch:
    """The round's inputs on the model's device, as one pinned buffer copied without
    blocking. A `torch.tensor(..., device="cuda")` per input is a blocking copy that
    drains the stream: the host could not issue this round while the last one ran."""
    bs = block_size
    width = max((len(t) for t in f.tables), default=1)
    table = [0] * (len(f.tables) * width)
    for i, t in enumerate(f.tables):
        table[i * width:i * width + len(t)] = t
    sampled = len(f.sample_rows) != len(f.ids)
    parts = [f.ids, f.pos, f.slots, f.lens, f.sample_rows if sampled else [], table]
    for c in f.chunks:
        length = c.start + c.n
        parts.append([] if c.to_cpu else c.blocks[: -(-length // bs)])
        parts.append([x for pair in ref_attn.flash_lengths(c.n, length) for x in pair])
    host = torch.tensor(list(chain.from_iterable(parts)), dtype=torch.int64)
    dev = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
    views, at = [], 0
    for part in parts:
        views.append(dev[at:at + len(part)])
        at += len(part)
    ids, pos, slots, lens, rows, tab, *per_chunk = views
    for c, c_table, cu in zip(f.chunks, per_chunk[::2], per_chunk[1::2], strict=True):
        c.cu = cu.to(torch.int32).view(2, 2)
        if not c.to_cpu:
            c.table = c_table
    return Batch(
        ids=ids,
        positions=pos,
        slots=slots,
        n_dec=f.n_dec,
        block_tables=tab.to(torch.int32).view(len(f.tables), width),
        context_lens=lens.to(torch.int32),
        chunks=f.chunks,
        sample_rows=rows if sampled else None,
        sample_req_ids=f.sample_ids,
        gpu_blocks=f.gpu_blocks,
        swapped_in=f.swapped_in,
        n_ext=f.n_ext,
    )
