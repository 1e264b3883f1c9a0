"""A policy's output tokens as round times and per-request spans of rounds.

The core books one timestamp per engine round (`core.request.RoundLog`) and, per request, the
spans of consecutive rounds in which it emitted (`Request.spans`). A 200k-request run has ~50M
tokens in ~1.5M rounds, so the metrics work on this form, never on a time per token: the
inter-token latencies are the rounds' gaps, each counted once per request that spanned it, plus
the gaps where a request moved from one span to the next; a timeline counts each round's
tokens. A records frame read back from requests.parquet is turned into the same form
(:meth:`TokenSpans.from_frame`), so each metric has one definition whatever its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

GPU, CPU = 0, 1  # owner codes (core.request.Owner), as stored per round
LETTERS = np.frombuffer(b"GC", dtype=np.uint8)  # owner code -> its letter in token_owners
FROM_REQUESTS_CHUNK = 16_384  # requests whose spans are read at once (TokenSpans.from_requests)


class SpannedRequest(Protocol):
    """What :meth:`TokenSpans.from_requests` reads of a request (core.request.Request)."""

    spans: list


@dataclass(frozen=True)
class Weighted:
    """A sample given as values and how many times each occurs: every ITL gap of a run, as
    the rounds' gaps and the number of requests that spanned each. Its percentiles are numpy's
    linear ones of the expanded sample, exactly; its mean and std are the same sums taken in
    another order (so they may differ from numpy's in the last bits)."""

    values: np.ndarray  # float64
    counts: np.ndarray  # int64, each >= 1

    @property
    def size(self) -> int:
        return int(self.counts.sum())

    def mean(self) -> float:
        return float(np.dot(self.values, self.counts) / self.size)

    def std(self) -> float:
        """Population standard deviation, as numpy's default."""
        deviation = self.values - self.mean()
        return float(np.sqrt(np.dot(deviation * deviation, self.counts) / self.size))

    def percentile(self, qs: Sequence[float]) -> np.ndarray:
        """np.percentile(self.expand(), qs) without expanding: the same virtual index, the
        same two order statistics and the same interpolation formula as numpy's "linear"."""
        order = np.argsort(self.values, kind="stable")
        values, last = self.values[order], np.cumsum(self.counts[order]) - 1
        n = self.size
        virtual = (n - 1) * np.true_divide(np.asarray(qs, dtype=float), 100)
        below = np.floor(virtual)
        lo = np.clip(below, 0, n - 1).astype(np.int64)
        hi = np.clip(below + 1, 0, n - 1).astype(np.int64)
        a = values[np.searchsorted(last, lo)]  # the lo-th value of the sorted expansion
        b = values[np.searchsorted(last, hi)]
        gamma = virtual - below
        diff = b - a
        out = a + diff * gamma
        np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
        return out

    def expand(self) -> np.ndarray:
        """Every value as often as it occurs (for plots of a distribution)."""
        return np.repeat(self.values, self.counts)


@dataclass(frozen=True)
class TokenSpans:
    """The tokens of one policy's requests. Rounds are numbered across all of them (the
    rounds of each engine, one after the other); a span covers rounds first..end-1, all of
    one engine, and gives its request one token in each."""

    round_times: np.ndarray  # float64: when each round emitted
    round_owner: np.ndarray  # uint8: the engine of each round (GPU 0, CPU 1)
    row: np.ndarray  # int64: the request (records row) of each span; by row, then in time order
    first: np.ndarray  # int64: each span's first round
    end: np.ndarray  # int64: one past its last round

    @classmethod
    def from_requests(cls, requests: Sequence[SpannedRequest]) -> TokenSpans:
        """The spans of `requests` (rows in that order), against the round logs they index.
        Read FROM_REQUESTS_CHUNK requests at a time: the spans' fields pass through Python
        lists, and a saturated NEO run's requests hold ~28 spans each."""
        bases: dict[int, int] = {}  # id(a round-time array) -> its first round's number
        arrays, owners = [], []
        parts: list[tuple[np.ndarray, np.ndarray]] = []  # (first, end) of each chunk's spans
        for start in range(0, len(requests), FROM_REQUESTS_CHUNK):
            flat = [x for r in requests[start:start + FROM_REQUESTS_CHUNK] for x in r.spans]
            for owner, times in zip(flat[0::4], flat[1::4], strict=True):
                if id(times) not in bases:
                    bases[id(times)] = sum(len(a) for a in arrays)
                    arrays.append(times)
                    owners.append(owner)
            base = np.fromiter((bases[id(a)] for a in flat[1::4]), dtype=np.int64,
                               count=len(flat) // 4)
            parts.append((base + np.array(flat[2::4], dtype=np.int64),
                          base + np.array(flat[3::4], dtype=np.int64)))
        first, end = ((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
                      if parts else (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)))
        return cls(
            round_times=np.concatenate([np.frombuffer(a, dtype=np.float64) for a in arrays])
            if arrays else np.empty(0),
            round_owner=np.repeat(np.array(owners, dtype=np.uint8),
                                  [len(a) for a in arrays]),
            row=np.repeat(np.arange(len(requests), dtype=np.int64),
                          [len(r.spans) // 4 for r in requests]),
            first=first,
            end=end,
        )

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> TokenSpans:
        """The spans of a records frame's token columns: each engine's distinct token times are
        its rounds, and a span ends where a request's next token is not in the next round."""
        lengths = np.fromiter((len(t) for t in df["token_times_s"]), dtype=np.int64,
                              count=len(df))
        times = (np.concatenate([np.asarray(t, dtype=float) for t in df["token_times_s"]])
                 if lengths.sum() else np.empty(0))
        owner = (np.frombuffer("".join(df["token_owners"]).encode("ascii"), dtype=np.uint8)
                 == ord("C")).astype(np.uint8)
        if owner.size != times.size:
            raise ValueError("records frame: token_owners and token_times_s differ in length")
        rounds = [np.unique(times[owner == code]) for code in (GPU, CPU)]
        index = np.where(owner == GPU, np.searchsorted(rounds[GPU], times),
                         len(rounds[GPU]) + np.searchsorted(rounds[CPU], times))
        token_row = np.repeat(np.arange(len(df), dtype=np.int64), lengths)
        starts = np.ones(times.size, dtype=bool)
        starts[1:] = ((token_row[1:] != token_row[:-1]) | (owner[1:] != owner[:-1])
                      | (index[1:] != index[:-1] + 1))
        starts = np.flatnonzero(starts)
        lasts = np.append(starts[1:], times.size)[:starts.size] - 1
        return cls(
            round_times=np.concatenate(rounds),
            round_owner=np.repeat(np.array([GPU, CPU], dtype=np.uint8),
                                  [len(r) for r in rounds]),
            row=token_row[starts], first=index[starts], end=index[lasts] + 1)

    @property
    def n_rounds(self) -> int:
        return len(self.round_times)

    def round_tokens(self) -> np.ndarray:
        """Tokens each round emitted: the spans covering it."""
        n = self.n_rounds
        cover = np.bincount(self.first, minlength=n + 1) - np.bincount(self.end, minlength=n + 1)
        return np.cumsum(cover)[:n]

    def cpu_tokens(self) -> int:
        """Tokens the CPU engine emitted."""
        cpu = self.round_owner[self.first] == CPU
        return int((self.end - self.first)[cpu].sum())

    def itl(self) -> Weighted:
        """Every gap between consecutive tokens of a request: within a span, the gap between
        two of its rounds (counted once per span covering both); between two spans of one
        request, from the last token of one to the first of the next."""
        n = self.n_rounds
        both = np.bincount(self.first + 1, minlength=n + 1) - np.bincount(self.end,
                                                                           minlength=n + 1)
        counts = np.cumsum(both)[1:n]  # spans covering rounds k - 1 and k, for k = 1..n-1
        spanned = counts > 0
        same = self.row[1:] == self.row[:-1]
        jumps = (self.round_times[self.first[1:][same]]
                 - self.round_times[self.end[:-1][same] - 1])
        return Weighted(np.concatenate([np.diff(self.round_times)[spanned], jumps]),
                        np.concatenate([counts[spanned], np.ones(jumps.size, np.int64)]))

    def timeline(self, max_points: int) -> pd.DataFrame:
        """Cumulative tokens and cumulative CPU tokens at each distinct round time, sampled
        at ``max_points`` evenly spaced times (always keeping the last) when longer."""
        # Each array made once and summed in place: a 200k-request run has 4.7M rounds, and
        # this ran at the peak memory of its `dualpace-sim run`.
        tokens = self.round_tokens()
        emitted = np.flatnonzero(tokens > 0)
        order = emitted[np.argsort(self.round_times[emitted], kind="stable")]
        del emitted
        times = self.round_times[order]
        tokens = tokens[order]
        cpu = np.where(self.round_owner[order] == CPU, tokens, 0)
        del order
        total = np.cumsum(tokens, out=tokens)
        np.cumsum(cpu, out=cpu)
        last_of_time = np.flatnonzero(np.append(times[1:] != times[:-1], True)
                                      if times.size else np.zeros(0, bool))
        if len(last_of_time) > max_points:
            pick = np.unique(np.linspace(0, len(last_of_time) - 1, max_points).round()
                             .astype(int))
            last_of_time = last_of_time[pick]
        return pd.DataFrame({"time_s": times[last_of_time],
                             "total_tokens": total[last_of_time].astype(np.int64),
                             "cpu_tokens": cpu[last_of_time].astype(np.int64)})

    def cpu_round_times(self) -> np.ndarray:
        """The times at which the CPU engine emitted tokens, sorted."""
        emitted = (self.round_tokens() > 0) & (self.round_owner == CPU)
        return np.sort(self.round_times[emitted])

    def request_ends(self, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row of ``n_rows``: tokens, first token time and last token time (NaN without)."""
        counts = np.bincount(self.row, weights=self.end - self.first,
                             minlength=n_rows).astype(np.int64)
        first, last = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
        if self.row.size:
            opens = np.append(True, self.row[1:] != self.row[:-1])
            closes = np.append(self.row[1:] != self.row[:-1], True)
            first[self.row[opens]] = self.round_times[self.first[opens]]
            last[self.row[closes]] = self.round_times[self.end[closes] - 1]
        return counts, first, last

    def token_columns(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, bytes]:
        """Rows start..stop-1 spelled out: each row's token count, every token time in row
        order and every owner letter (the records file's token columns)."""
        lo, hi = np.searchsorted(self.row, [start, stop])
        first = self.first[lo:hi]
        counts = self.end[lo:hi] - first
        offsets = np.cumsum(counts) - counts
        index = np.repeat(first - offsets, counts)
        index += np.arange(index.size)  # in place: a row group has millions of tokens
        letters = np.repeat(LETTERS[self.round_owner[first]], counts).tobytes()
        lengths = np.bincount(self.row[lo:hi] - start, weights=counts,
                              minlength=stop - start).astype(np.int64)
        return lengths, self.round_times[index], letters
