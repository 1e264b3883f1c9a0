"""Seeded sampling (temperature, top-k, top-p) as a perturbation of the logits.

Every executor samples with `greedy` (argmax) over the post-layer's logits, in the GPU engine,
in the CPU engine's process and in Dense Assist. So a sampled row only needs its logits
perturbed before the argmax, wherever that argmax runs, and greedy rows are left as they are:
`perturb` draws the row's token from its filtered softmax by inverse CDF and leaves the row
-inf everywhere but there.

The draw's one uniform is a hash of the request's seed and the token's position, never of
which engine, batch or route produced it: a seeded request gives the same tokens on the GPU
engine, on the CPU engine under any Dense Assist route, and against a reference that applies
`perturb` to another implementation's logits. The draw runs where the logits are, for all of
a batch's sampled rows at once. (Gumbel-max noise made row by row on the host, 128k float64
draws a row, cost milliseconds a row and tripled the decode rounds of a served run, where
every request samples.)
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


_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers whose outputs look random."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """The draw's uniform in (0, 1) for the token at `position` of the request seeded `seed`:
    52 hashed bits as (2k + 1) / 2^53, exact in float64, so never 0 or 1."""
    return (2 * (mix64(mix64(seed) + position) >> 12) + 1) / float(1 << 53)


def filtered(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[rows, V] logits / T, row i with params[i], the tokens outside its top-k and top-p
    nucleus at -inf (ties with the k-th logit stay in; the top token always stays)."""
    x = logits.to(torch.float32, copy=True)
    x.div_(torch.tensor([p.temperature for p in params], device=x.device)[:, None])
    k = [p.top_k if 0 < p.top_k < x.shape[1] else 0 for p in params]
    top_p = [p.top_p for p in params]
    if not any(k) and all(t == 1.0 for t in top_p):
        return x
    ordered, order = torch.sort(x, dim=-1, descending=True, stable=True)  # ties: by index
    rows = torch.arange(len(params), device=x.device)
    kth = ordered[rows, torch.tensor([max(v, 1) - 1 for v in k], device=x.device)]
    kth = torch.where(torch.tensor(k, device=x.device) > 0, kth, float("-inf"))
    ordered = ordered.masked_fill(ordered < kth[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    outside = torch.cumsum(probs, dim=-1) - probs >= torch.tensor(top_p, device=x.device
                                                                  )[:, None]
    ordered = ordered.masked_fill(outside, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, ordered)


def perturb(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """[R, V] logits whose row-wise argmax is each row's sample (greedy rows unchanged).

    A sampled row's token is the first whose cumulative filtered probability reaches its
    uniform (times the row's total, which rounding keeps from being exactly 1); filtered-out
    tokens add nothing to the sum, so they are never drawn."""
    picked = [i for i, row in enumerate(rows) if row is not None]
    if not picked:
        return logits
    index = torch.tensor(picked, device=logits.device)
    params = [rows[i][0] for i in picked]
    cdf = torch.softmax(filtered(logits[index], params), dim=-1).cumsum(-1, dtype=torch.float64)
    u = torch.tensor([uniform(rows[i][0].seed, rows[i][1]) for i in picked],
                     dtype=torch.float64, device=logits.device)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.shape[1] - 1)
    out = logits.clone()
    out[index] = float("-inf")
    out[index[:, None], tokens] = 0.0
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
