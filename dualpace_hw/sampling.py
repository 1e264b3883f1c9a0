"""Seeded sampling (temperature, top-k, top-p) as a perturbation of the logits.

Every executor samples with `greedy` (argmax) over the post-layer's logits, in the GPU engine,
in the CPU engine's process and in Dense Assist. Sampling is the Gumbel-max trick: the argmax
of `filtered(logits / T) + G`, with G standard Gumbel noise, is a draw from the filtered
softmax. So a sampled row only needs its logits perturbed before the argmax, wherever that
argmax runs, and greedy rows are left as they are.

The noise of a token depends only on the request's seed and the token's position, never on
which engine, batch or route produced it: a seeded request gives the same tokens on the GPU
engine, on the CPU engine under any Dense Assist route, and against a reference that applies
`perturb` to another implementation's logits.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from .model import Model


@dataclass(frozen=True)
class SamplingParams:
    """How a request samples; temperature 0 is greedy (the default, and the benchmarks')."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None  # None: drawn when the request arrives

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature {self.temperature}: must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p {self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k}: must be >= 0 (0 turns it off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def seeded(self) -> SamplingParams:
        """These parameters with a seed (a fresh one when none was given)."""
        if self.seed is not None:
            return self
        return SamplingParams(self.temperature, self.top_p, self.top_k, secrets.randbits(62))


# One sampled row: its parameters and the position of the token it samples; None: greedy.
Row = tuple[SamplingParams, int] | None


def gumbel(seed: int, position: int, n: int, device: torch.device) -> torch.Tensor:
    """Standard Gumbel noise [n] for (seed, position), the same on every device."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + position) % (1 << 63))
    u = torch.rand(n, generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
    return (-torch.log(-torch.log(u))).float().to(device)


def filtered(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row's logits / T with the tokens outside top-k and the top-p nucleus at -inf."""
    x = logits.float() / p.temperature
    if 0 < p.top_k < x.numel():
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        order = torch.argsort(x, descending=True)
        probs = torch.softmax(x[order], dim=-1)
        outside = torch.cumsum(probs, dim=-1) - probs >= p.top_p  # the top token stays
        x = x.clone()
        x[order[outside]] = float("-inf")
    return x


def perturb(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """[R, V] logits whose row-wise argmax is each row's sample (greedy rows unchanged)."""
    if not any(rows):
        return logits
    out = logits.float().clone()
    for i, row in enumerate(rows):
        if row is not None:
            p, position = row
            out[i] = filtered(logits[i], p) + gumbel(p.seed, position, out.shape[1], out.device)
    return out


def sample(logits: torch.Tensor, rows: list[Row]) -> list[int]:
    return perturb(logits, rows).argmax(dim=-1).tolist()


class Sampler:
    """The runtime's sampling parameters of its non-greedy requests (the main process).

    `cpu_rows` are the rows of the CPU engine's step in flight: its Dense Assists' post-layer
    runs on the GPU engine, which samples them as the CPU engine would have."""

    def __init__(self) -> None:
        self.params: dict[int, SamplingParams] = {}
        self.cpu_rows: list[Row] | None = None

    def add(self, req_id: int, params: SamplingParams) -> None:
        if not params.greedy:
            self.params[req_id] = params.seeded()

    def rows(self, req_ids: list[int], positions: list[int]) -> list[Row] | None:
        """Rows for requests sampling tokens at `positions`; None when all are greedy."""
        if not self.params:
            return None
        rows = [(self.params[r], pos) if r in self.params else None
                for r, pos in zip(req_ids, positions, strict=True)]
        return rows if any(rows) else None


class SamplingModel(Model):
    """A Model whose post-layer returns perturbed logits for the rows it is told of, so an
    executor's argmax samples them (the CPU engine's process sets `rows` per step)."""

    def __init__(self, model: Model) -> None:
        super().__init__(model.shape, model.w, model.reduce)
        self.rows: list[Row] | None = None

    def post_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().post_layer(hidden)
        return logits if self.rows is None else perturb(logits, self.rows)
