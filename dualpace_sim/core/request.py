"""Requests: the unit of ownership that both engines schedule.

A request has exactly one *owner* (the GPU or the CPU engine) at every instant. A request in
migration stays owned by its source until the transfer completes; it already sits in the
destination's queue, marked not *ready*, so the destination sees it but must not run it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class Owner(IntEnum):
    """The engine with scheduling authority over a request (also the token-owner code)."""

    GPU = 0
    CPU = 1


class RoundLog:
    """When each engine's rounds emitted their tokens: one timestamp per round, not per token.

    A run emits ~50 tokens per round (a 200k-request run has 50M tokens in 1.5M rounds), so
    requests keep spans of rounds (:attr:`Request.spans`) instead of a time per token.
    ``times[owner]`` is that engine's array of round times; rounds that emit at the same time
    (a GPU round's decodes, then its finishing prefills) share one entry.
    """

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: tuple[array, array] = (array("d"), array("d"))  # by Owner


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
    generated: int = 0  # output tokens emitted so far
    # Runs of consecutive rounds of one engine in which the request emitted a token, as flat
    # quadruples (owner, that engine's RoundLog.times array, first round, one past the last).
    spans: list = field(default_factory=list)
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
    def finished(self) -> bool:
        return self.generated >= self.max_tokens

    @property
    def token_times(self) -> list[float]:
        """The emission time of every output token, read off the spans' round times."""
        s = self.spans
        return [t for i in range(0, len(s), 4) for t in s[i + 1][s[i + 2]:s[i + 3]]]

    @property
    def token_owners(self) -> bytes:
        """The Owner of every output token, one byte each."""
        s = self.spans
        return b"".join(bytes([s[i]]) * (s[i + 3] - s[i + 2]) for i in range(0, len(s), 4))

    @property
    def kv_tokens_after_step(self) -> int:
        """KV length once the next decode step has appended the last generated token."""
        return self.prompt_tokens + self.generated

    def next_blocks(self, block_size: int) -> int:
        """Blocks to add so the next decode step's KV append fits (0 or 1)."""
        need = -(-(self.prompt_tokens + self.generated) // block_size) - len(self.blocks)
        return need if need > 0 else 0

    def emit(self, time_s: float, owner: Owner, rounds: RoundLog) -> None:
        emit_batch((self,), time_s, owner, rounds)


def emit_batch(reqs: Sequence[Request], time_s: float, owner: Owner, rounds: RoundLog) -> bool:
    """One token for every request of a round of `owner`'s engine ending at `time_s`, booked
    as that round in `rounds` and one more round in each request's last span (it runs for
    every token of a run); returns whether any of them reached max_tokens."""
    if not reqs:
        return False
    code = int(owner)  # a list takes a plain int faster than an IntEnum
    times = rounds.times[code]
    if not times or times[-1] != time_s:
        times.append(time_s)
    k = len(times) - 1
    end = k + 1
    done = False
    for r in reqs:
        s = r.spans
        if s and s[-1] == k and s[-3] is times:
            s[-1] = end
        else:
            s += (code, times, k, end)
        g = r.generated + 1
        r.generated = g
        if g >= r.max_tokens:
            done = True
    return done
