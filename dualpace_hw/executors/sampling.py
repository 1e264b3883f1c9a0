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

from dualpace_hw.executors.model import Model


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


# Tokens a top-k / top-p row sorts first: its highest logits, found by a partial sort. A nucleus
# that ends inside them needs no sort of the whole vocabulary (128k tokens for Llama 3).
CANDIDATES = 1024


def filtered(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[rows, V] logits / T, row i with params[i], the tokens outside its top-k and top-p
    nucleus at -inf. Ranks are by logit, ties by token id; ties with the k-th logit stay in,
    and the top token always stays.

    Rows are filtered over their CANDIDATES highest logits, where that is exact: where what
    they keep lies above the lowest candidate's logit (so no tie with it is left out), with
    the probabilities normalised over the whole row. The other rows sort the whole row."""
    temps = [p.temperature for p in params]
    x = logits.float()  # (never written in place below: it may be `logits` itself)
    if any(t != temps[0] for t in temps):
        x = x / torch.tensor(temps, device=x.device)[:, None]
    elif temps[0] != 1.0:  # one temperature, the API's default 1 most often: no copy to make
        x = x / temps[0]
    k = [p.top_k if 0 < p.top_k < x.shape[1] else 0 for p in params]
    top_p = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]  # inf: no nucleus
    if not any(k) and all(t == float("inf") for t in top_p):
        return x
    n = max(CANDIDATES, *k)
    if n >= x.shape[1]:
        return _filtered_sorted(x, k, top_p)
    values, ids = torch.topk(x, n, dim=-1)
    ids, by_id = torch.sort(ids, dim=-1)
    values, order = torch.sort(values.gather(1, by_id), dim=-1, descending=True, stable=True)
    ids = ids.gather(1, order)  # the candidates as the whole row's stable sort ranks them
    kept, kept_values = _keep(values, x, k, top_p)
    out = torch.full_like(x, float("-inf")).scatter_(1, ids, kept_values)
    exact = (~kept | (values > values[:, -1:])).all(dim=-1)
    redo = (~exact).nonzero().flatten().tolist()
    if redo:
        out[redo] = _filtered_sorted(x[redo], [k[i] for i in redo], [top_p[i] for i in redo])
    return out


def _keep(ordered: torch.Tensor, x: torch.Tensor, k: list[int], top_p: list[float]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of each row's leading `ordered` logits (descending, ties by id) its top-k and
    top-p keep, and those logits with the rest at -inf; probabilities are over all of x."""
    rows = torch.arange(len(k), device=x.device)
    kth = ordered[rows, torch.tensor([max(v, 1) - 1 for v in k], device=x.device)]
    kth = torch.where(torch.tensor(k, device=x.device) > 0, kth, float("-inf"))[:, None]
    top = ordered[:, :1]
    total = torch.exp(x - top).masked_fill_(x < kth, 0.0).sum(dim=-1, keepdim=True)
    probs = torch.exp(ordered - top).masked_fill_(ordered < kth, 0.0) / total
    kept = (ordered >= kth) & (torch.cumsum(probs, dim=-1) - probs
                                < torch.tensor(top_p, device=x.device)[:, None])
    return kept, ordered.masked_fill(~kept, float("-inf"))


def _filtered_sorted(x: torch.Tensor, k: list[int], top_p: list[float]) -> torch.Tensor:
    """`filtered` by sorting whole rows (x already / T)."""
    ordered, order = torch.sort(x, dim=-1, descending=True, stable=True)  # ties: by index
    return torch.empty_like(x).scatter_(1, order, _keep(ordered, x, k, top_p)[1])


def draw(logits: torch.Tensor, rows: list[Row]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The sampled rows' tokens: (their row index, None when every row samples; [n] tokens).

    A row's token is the first whose cumulative filtered probability reaches its uniform
    (times the row's total, which rounding keeps from being exactly 1); filtered-out tokens
    add nothing to the sum, so they are never drawn. The uniforms travel to the device in
    one copy, beside the index of the sampled rows where some rows are greedy."""
    picked = [i for i, row in enumerate(rows) if row is not None]
    index = None if len(picked) == len(rows) else torch.tensor(picked, device=logits.device)
    params = [rows[i][0] for i in picked]
    u = torch.tensor([uniform(rows[i][0].seed, rows[i][1]) for i in picked],
                     dtype=torch.float64, device=logits.device)
    x = filtered(logits if index is None else logits[index], params)
    cdf = torch.softmax(x, dim=-1).cumsum(-1, dtype=torch.float64)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.shape[1] - 1)
    return index, tokens.squeeze(1)


def perturb(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """[R, V] logits whose row-wise argmax is each row's sample: a sampled row is -inf but at
    its drawn token (greedy rows unchanged). For post-layers whose argmax runs elsewhere."""
    if not any(rows):
        return logits
    index, tokens = draw(logits, rows)
    out = logits.clone()
    rows_of = torch.arange(len(rows), device=logits.device) if index is None else index
    out[rows_of] = float("-inf")
    out[rows_of, tokens] = 0.0
    return out


def sample(logits: torch.Tensor, rows: list[Row]) -> list[int]:
    """Each row's token: its draw where it samples, its argmax where it is greedy."""
    if not any(rows):
        return logits.argmax(dim=-1).tolist()
    index, tokens = draw(logits, rows)
    if index is None:
        return tokens.tolist()
    out = logits.argmax(dim=-1)
    out[index] = tokens
    return out.tolist()


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
