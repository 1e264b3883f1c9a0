"""Plain plan and result dataclasses: the only things that cross the core/backend boundary.

Backends (the SimPy simulator, the real runtime) execute a plan and hand back a result; they
never call into a scheduler in the middle of a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request
from .routing import Route


@dataclass(slots=True)
class PrefillChunk:
    """One prompt chunk in a GPU batch."""

    req: Request
    start: int  # prompt tokens already computed before this chunk
    tokens: int  # tokens computed by this chunk
    to_cpu: bool  # Prefill-to-CPU: copy each layer's K/V to the reserved host blocks
    last: bool  # completes the prompt, so the batch samples the request's first token


@dataclass(frozen=True, slots=True)
class BlockMoves:
    """The KV copies a committed round makes before its forward: block ids paired in order,
    (source, destination). The commit hands a swap-out host blocks in place of its HBM ones,
    so these are what the backend copies between."""

    swap_out: tuple[list[int], list[int]] = ([], [])  # (HBM blocks, host blocks)
    swap_in: tuple[list[int], list[int]] = ([], [])  # (host blocks, HBM blocks)

    @property
    def any(self) -> bool:
        return bool(self.swap_out[0] or self.swap_in[0])


@dataclass(slots=True)
class GpuPlan:
    """What one GPU round does: migrations first, then at most one GPU-main batch."""

    swap_outs: list[Request] = field(default_factory=list)  # GPU -> host, before the forward
    swap_ins: list[Request] = field(default_factory=list)  # host -> GPU, before the forward
    swap_out_blocks: int = 0  # KV blocks carried D2H by the swap-outs
    swap_in_blocks: int = 0  # KV blocks carried H2D by the swap-ins
    decodes: list[Request] = field(default_factory=list)  # includes this round's swap-ins
    prefills: list[PrefillChunk] = field(default_factory=list)
    marks: list[Request] = field(default_factory=list)  # deferred swap-in marks placed
    decode_context: int = 0  # Σ KV tokens the decodes attend to (after appending)
    wait_for_copies: bool = False  # step 1: the previous Prefill-to-CPU copy group is in flight
    migration_reserve: int = 0  # B_migration this round publishes when committed (step 3)

    @property
    def has_forward(self) -> bool:
        return bool(self.decodes or self.prefills)

    @property
    def has_migrations(self) -> bool:
        return bool(self.swap_outs or self.swap_ins)

    @property
    def is_empty(self) -> bool:
        return not (self.has_forward or self.has_migrations or self.marks or self.wait_for_copies)

    @property
    def n_tokens(self) -> int:
        return len(self.decodes) + sum(c.tokens for c in self.prefills)

    @property
    def n_sampled(self) -> int:
        """Rows that sample a token in the post-layer."""
        return len(self.decodes) + sum(1 for c in self.prefills if c.last)

    @property
    def copy_chunks(self) -> list[PrefillChunk]:
        return [c for c in self.prefills if c.to_cpu]


@dataclass(slots=True)
class GpuResult:
    end_s: float  # when the batch's sampled tokens reach the client
    tokens: dict[int, int] = field(default_factory=dict)  # req_id -> sampled token id (real runs)


@dataclass(slots=True)
class CpuPlan:
    """What one CPU round does: at most one CPU decode batch and its post-attention route."""

    batch: list[Request] = field(default_factory=list)
    route: Route = Route.FULL_CPU
    context: int = 0  # Σ KV tokens the batch attends to (after appending)
    wait_for: Request | None = None  # step 4: the unready head the engine waits on
    held_back: list[Request] = field(default_factory=list)  # running requests sent to waiting
    admitted: int = 0  # how many waiting requests (a FIFO prefix) join the batch

    @property
    def is_empty(self) -> bool:
        return not self.batch


@dataclass(slots=True)
class CpuResult:
    end_s: float  # when the batch's sampled tokens reach the client
    tokens: dict[int, int] = field(default_factory=dict)  # req_id -> sampled token id (real runs)
