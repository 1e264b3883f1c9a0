"""Requests: the unit of ownership that both engines schedule.

A request has exactly one *owner* (the GPU or the CPU engine) at every instant. A request in
migration stays owned by its source until the transfer completes; it already sits in the
destination's queue, marked not *ready*, so the destination sees it but must not run it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum


class Owner(IntEnum):
    """The engine with scheduling authority over a request (also the token-owner code)."""

    GPU = 0
    CPU = 1


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `tokens` tokens."""
    return -(-tokens // block_size)


@dataclass(slots=True, eq=False)
class Request:
    """One request's scheduling state and the client-visible record of its tokens.

    `blocks` are the block ids the request holds in its current (or, while migrating, its
    destination) tier; `source_blocks` are the ids still held in the source tier until a
    swap-in's transfer lands.
    """

    req_id: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    peak_blocks: int  # finish-peak footprint b̂_r = ceil((prompt + max_tokens) / block_size)
    owner: Owner = Owner.GPU
    ready: bool = True  # False while a migration towards `transit_to` is in flight
    transit_to: Owner | None = None
    to_cpu: bool = False  # prefill destination chosen at admission: Prefill-to-CPU
    prefilled: int = 0  # prompt tokens whose KV has been computed
    computed: int = 0  # vLLM's num_computed_tokens: prompt and (re)computed output tokens
    blocks: list[int] = field(default_factory=list)
    source_blocks: list[int] = field(default_factory=list)
    marked: bool = False  # deferred swap-in mark placed by a GPU round
    token_times: list[float] = field(default_factory=list)  # emission time of every output token
    token_owners: bytearray = field(default_factory=bytearray)  # Owner of every output token
    migrations: list[tuple[float, str]] = field(default_factory=list)  # (time_s, kind)

    @classmethod
    def create(
        cls, req_id: int, arrival_s: float, prompt_tokens: int, max_tokens: int, block_size: int
    ) -> Request:
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError(f"request {req_id}: prompt and max_tokens must be >= 1")
        peak = blocks_for(prompt_tokens + max_tokens, block_size)
        return cls(req_id, arrival_s, prompt_tokens, max_tokens, peak)

    @property
    def generated(self) -> int:
        return len(self.token_times)

    @property
    def finished(self) -> bool:
        return len(self.token_times) >= self.max_tokens

    @property
    def kv_tokens_after_step(self) -> int:
        """KV length once the next decode step has appended the last generated token."""
        return self.prompt_tokens + len(self.token_times)

    def next_blocks(self, block_size: int) -> int:
        """Blocks to add so the next decode step's KV append fits (0 or 1)."""
        need = -(-(self.prompt_tokens + len(self.token_times)) // block_size) - len(self.blocks)
        return need if need > 0 else 0

    def emit(self, time_s: float, owner: Owner) -> None:
        self.token_times.append(time_s)
        self.token_owners.append(owner)


def emit_batch(reqs: Iterable[Request], time_s: float, owner: Owner) -> bool:
    """Request.emit for every request of a round, in one loop (it runs for every token of a
    run); returns whether any of them reached max_tokens."""
    code = int(owner)  # a bytearray takes a plain int faster than an IntEnum
    done = False
    for r in reqs:
        times = r.token_times
        times.append(time_s)
        r.token_owners.append(code)
        if len(times) >= r.max_tokens:
            done = True
    return done
