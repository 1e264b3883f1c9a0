"""A round as plain data, and its forward as the paper's stage tasks.

`Forward` is what the runtime drives: [pre-layer, layer 0 .. N-1, post-layer] over one shared
`ForwardState`, called in order (the runtime services Dense Assist between them), then
`result()`. The whole-forward path and the stage-by-stage path are the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dualpace_hw.executors.gpu.batch import FlatBatch
from dualpace_hw.memory.migrate import CopyGroup


class ForwardState:
    """What a forward's stages hand each other: the hidden states, then the logits and the
    sampled tokens (the profiler's stage timings drive the stages with one too)."""

    hidden: torch.Tensor
    logits: torch.Tensor
    tokens: torch.Tensor


class Forward:
    """One plan's stage tasks; iterate and call them in order, then read `result()`."""

    def __init__(self, stages: list[Callable[[], None]], finish: Callable[[], dict[int, int]],
                 state: ForwardState, copies: CopyGroup, n_sampled: int) -> None:
        self.stages = stages
        self.n_sampled = n_sampled
        self._finish = finish
        self.state = state
        self.copies = copies  # Prefill-to-CPU layer copies issued by this forward

    def __iter__(self):
        return iter(self.stages)

    def result(self) -> dict[int, int]:
        """Sampled token per request (decodes and completing chunks); syncs with the GPU."""
        return self._finish()

    def wrapped(self, stage: Callable[[Callable[[], None]], Callable[[], None]],
                finish: Callable[[dict[int, int]], None]) -> Forward:
        """The same forward with each stage passed through `stage` and `finish` called on the
        result (a tensor-parallel rank 0 releases the other ranks' stages and checks them)."""
        def done() -> dict[int, int]:
            tokens = self._finish()
            finish(tokens)
            return tokens

        return Forward([stage(s) for s in self.stages], done, self.state, self.copies,
                       self.n_sampled)

    @property
    def logits(self) -> torch.Tensor:
        """[sampled rows, V] fp32 logits, in the order of `result()`."""
        return self.state.logits[: self.n_sampled]


@dataclass
class Round:
    """One GPU round as plain data: its flattened batch and its swaps. Rank 0 of a
    tensor-parallel GPU engine builds it from the core's plan; the other ranks run it as sent."""

    flat: FlatBatch | None  # None: a round of migrations only
    swap_out: tuple[list[int], list[int]]  # (GPU blocks, host blocks), pairwise
    swap_in: tuple[list[int], list[int]]  # (host blocks, GPU blocks), pairwise

    @property
    def has_migrations(self) -> bool:
        return bool(self.swap_out[0] or self.swap_in[0])
