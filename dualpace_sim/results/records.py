"""Per-request records of a run, as a DataFrame and as Parquet.

One row per request keeps every client-observed token time and its owner, so any metric (and any
metric invented later) can be recomputed from the file without rerunning the simulation. Writing
goes through one fixed Arrow schema with no pandas or time metadata, so identical runs give
byte-identical files and results can be compared with a checksum.

A run holds its records as :class:`PolicyRecords`: the per-request columns and the token spans
(`dualpace_sim.results.token_spans`), not a time per token. The token columns are spelled out only
while the file is written, one row group at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dualpace_sim.results.node_series import NodeSeries
from dualpace_sim.results.outputs import replace_atomically
from dualpace_sim.results.token_spans import TokenSpans

MIGRATION_KINDS = frozenset({"swap_out", "swap_in", "prefill_to_cpu", "preempt_recompute"})
OWNER_LETTERS = {0: "G", 1: "C"}  # token_owners byte -> letter: GPU engine, CPU engine

RECORDS_SCHEMA = pa.schema([
    ("policy", pa.string()),
    ("request_id", pa.int64()),
    ("arrival_s", pa.float64()),
    ("prompt_tokens", pa.int64()),
    ("max_tokens", pa.int64()),
    ("n_tokens", pa.int64()),
    ("first_token_s", pa.float64()),
    ("finish_s", pa.float64()),
    ("token_times_s", pa.list_(pa.float64())),
    ("token_owners", pa.string()),
    ("migration_times_s", pa.list_(pa.float64())),
    ("migration_kinds", pa.list_(pa.string())),
])

# Requests per Parquet row group: the token columns of one group (~4M tokens at the paper's
# output lengths, 35 MB of times) are all that exists of them at once while a file is written.
ROW_GROUP_ROWS = 16_384

_OWNER_TABLE = bytes(ord(OWNER_LETTERS.get(b, "?")) for b in range(256))


class FinishedRequest(Protocol):
    """What :func:`records_frame` reads of each request: the core's Request (its token lists
    read off its spans; the real runtime's records go this way) or any object with these
    fields. A simulated run takes the leaner :class:`PolicyRecords`."""

    req_id: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    token_times: Sequence[float]
    token_owners: bytes | bytearray
    migrations: Sequence[tuple[float, str]]


def records_frame(requests: Iterable[FinishedRequest], policy: str) -> pd.DataFrame:
    """One row per request, sorted by request id, with the columns of :data:`RECORDS_SCHEMA`
    (:func:`records_table` as a DataFrame: lists as numpy arrays, as a reloaded file gives)."""
    return records_table(requests, policy).to_pandas()


def records_table(requests: Iterable[FinishedRequest], policy: str) -> pa.Table:
    """One row per request, sorted by request id, as an Arrow table of :data:`RECORDS_SCHEMA`.

    ``finish_s`` is the last token's time (whether or not the request reached ``max_tokens``);
    requests without tokens have empty lists and NaN first/finish times. The token columns are
    built as one flat array of every token time and one of every owner letter, with the
    requests' offsets into them.
    """
    reqs = sorted(requests, key=lambda r: r.req_id)
    n = len(reqs)
    lengths = np.fromiter((len(r.token_times) for r in reqs), dtype=np.int64, count=n)
    times = np.fromiter(chain.from_iterable(r.token_times for r in reqs), dtype=np.float64,
                        count=int(lengths.sum()))
    letters = b"".join(_owner_letters(r, int(k)) for r, k in zip(reqs, lengths, strict=True))
    ends = np.cumsum(lengths)
    has = lengths > 0
    first = np.full(n, math.nan)
    finish = np.full(n, math.nan)
    first[has] = times[(ends - lengths)[has]]
    finish[has] = times[ends[has] - 1]
    return _assemble(policy, _request_columns(reqs, lengths, first, finish),
                     lengths, times, letters)


def _request_columns(reqs: Sequence, n_tokens: np.ndarray, first: np.ndarray,
                     finish: np.ndarray) -> dict:
    """The per-request columns of :data:`RECORDS_SCHEMA` (all but the token ones)."""
    return {
        "request_id": np.array([int(r.req_id) for r in reqs], dtype=np.int64),
        "arrival_s": np.array([float(r.arrival_s) for r in reqs], dtype=np.float64),
        "prompt_tokens": np.array([int(r.prompt_tokens) for r in reqs], dtype=np.int64),
        "max_tokens": np.array([int(r.max_tokens) for r in reqs], dtype=np.int64),
        "n_tokens": n_tokens, "first_token_s": first, "finish_s": finish,
        "migration_times_s": [[float(t) for t, _ in r.migrations] for r in reqs],
        "migration_kinds": [_migration_kinds(r) for r in reqs],
    }


def _assemble(policy: str, rows: dict, lengths: np.ndarray, times: np.ndarray,
              letters: bytes) -> pa.Table:
    """A table of :data:`RECORDS_SCHEMA` from the per-request columns and the token columns
    as one flat array of times and one of owner letters, with the rows' offsets into them:
    no Python object per token."""
    n = len(lengths)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    offsets_buf = pa.py_buffer(offsets)
    columns = {
        "policy": pa.array([policy] * n, pa.string()),
        **{name: pa.array(rows[name], RECORDS_SCHEMA.field(name).type)
           for name in ("request_id", "arrival_s", "prompt_tokens", "max_tokens", "n_tokens",
                        "first_token_s", "finish_s")},
        "token_times_s": pa.ListArray.from_buffers(
            pa.list_(pa.float64()), n, [None, offsets_buf], children=[pa.array(times)]),
        "token_owners": pa.StringArray.from_buffers(n, offsets_buf, pa.py_buffer(letters)),
        "migration_times_s": pa.array(rows["migration_times_s"], pa.list_(pa.float64())),
        "migration_kinds": pa.array(rows["migration_kinds"], pa.list_(pa.string())),
    }
    return pa.Table.from_pydict(columns, schema=RECORDS_SCHEMA)


@dataclass(frozen=True)
class PolicyRecords:
    """One policy's records as a run holds them: ``requests``, the per-request columns of
    :data:`RECORDS_SCHEMA` but the two token ones, in request-id order, and ``tokens``, the
    spans those are read off (a 200k-request run has 50M tokens and 1.5M rounds), and
    ``series``, what the node held and how busy it was over time, when the run recorded them
    (`dualpace_sim.results.node_series`; written beside the records, not in them)."""

    policy: str
    requests: pd.DataFrame
    tokens: TokenSpans
    series: NodeSeries | None = None

    @classmethod
    def from_requests(cls, requests: Iterable, policy: str,
                      series: NodeSeries | None = None) -> PolicyRecords:
        """The records of the core's requests (`core.request.Request`: their spans)."""
        reqs = sorted(requests, key=lambda r: r.req_id)
        tokens = TokenSpans.from_requests(reqs)
        rows = _request_columns(reqs, *tokens.request_ends(len(reqs)))
        return cls(policy, pd.DataFrame({"policy": [policy] * len(reqs), **rows}), tokens,
                   series)

    def table(self, start: int, stop: int) -> pa.Table:
        """Rows start..stop-1 with every column, the token ones spelled out."""
        lengths, times, letters = self.tokens.token_columns(start, stop)
        rows = {name: column.to_numpy()[start:stop] for name, column in self.requests.items()}
        return _assemble(self.policy, rows, lengths, times, letters)

    def frame(self) -> pd.DataFrame:
        """Every column, as :func:`read_records` gives them (for what needs each request's
        token times: the state series of a trace, a validation's comparisons)."""
        return self.table(0, len(self.requests)).to_pandas()


def _owner_letters(req: FinishedRequest, n_tokens: int) -> bytes:
    owners = bytes(req.token_owners)
    if len(owners) != n_tokens:
        raise ValueError(
            f"request {req.req_id}: {len(owners)} token owners for {n_tokens} token times"
        )
    letters = owners.translate(_OWNER_TABLE)
    if b"?" in letters:
        raise ValueError(f"request {req.req_id}: token owners must be 0 (GPU) or 1 (CPU)")
    return letters


def _migration_kinds(req: FinishedRequest) -> list[str]:
    kinds = [str(kind) for _, kind in req.migrations]
    unknown = set(kinds) - MIGRATION_KINDS
    if unknown:
        raise ValueError(
            f"request {req.req_id}: unknown migration kind {sorted(unknown)[0]!r}; "
            f"expected one of {', '.join(sorted(MIGRATION_KINDS))}"
        )
    return kinds


def write_records(
    df: pd.DataFrame, path: str | Path, metadata: dict[bytes, bytes] | None = None
) -> None:
    """Write a records frame (one or several policies) to Parquet, deterministically and
    atomically (`dualpace_sim.results.outputs`): a run rewrites its records after each policy, and
    an
    interruption then must not destroy the policies already written.

    ``metadata`` becomes the file's key-value metadata (the run's provenance,
    :func:`dualpace_sim.results.provenance.parquet_metadata`); without it the file has none."""
    missing = [name for name in RECORDS_SCHEMA.names if name not in df.columns]
    if missing:
        raise ValueError(f"records frame lacks column {missing[0]!r}; build it with records_frame")
    table = pa.Table.from_pandas(df[RECORDS_SCHEMA.names], schema=RECORDS_SCHEMA,
                                 preserve_index=False)
    groups = (table.slice(start, ROW_GROUP_ROWS)
              for start in range(0, max(len(table), 1), ROW_GROUP_ROWS))
    _write_groups(path, groups, metadata)


def write_policy_records(parts: Sequence[PolicyRecords], path: str | Path,
                         metadata: dict[bytes, bytes] | None = None) -> None:
    """Write the records of one or several policies, in that order, as :func:`write_records`
    writes their frames (the same bytes), building one row group at a time."""
    _write_groups(path, _row_groups(parts), metadata)


def _row_groups(parts: Sequence[PolicyRecords]) -> Iterator[pa.Table]:
    """The policies' rows in tables of ROW_GROUP_ROWS (the last one shorter, and one empty
    table when there are no rows), each table built only when the previous one is written."""
    pending: list[pa.Table] = []
    rows, wrote = 0, False
    for part in parts:
        n, start = len(part.requests), 0
        while start < n:
            stop = min(n, start + ROW_GROUP_ROWS - rows)
            pending.append(part.table(start, stop))
            rows += stop - start
            start = stop
            if rows == ROW_GROUP_ROWS:
                yield pa.concat_tables(pending).combine_chunks()
                pending, rows, wrote = [], 0, True
    if pending or not wrote:
        yield (pa.concat_tables(pending).combine_chunks() if pending
               else RECORDS_SCHEMA.empty_table())


def _write_groups(path: str | Path, groups: Iterable[pa.Table],
                  metadata: dict[bytes, bytes] | None) -> None:
    """One Parquet row group per table of ``groups``, atomically; ``metadata`` as the file's
    key-value metadata."""
    schema = RECORDS_SCHEMA if metadata is None else RECORDS_SCHEMA.with_metadata(metadata)

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for group in groups:
                writer.write_table(group.replace_schema_metadata(metadata))

    replace_atomically(path, write)


def read_records(path: str | Path) -> pd.DataFrame:
    """Read a file written by :func:`write_records`."""
    table = pq.read_table(Path(path))
    problem = f"{path}: not a DualPace records file"
    if table.schema.names != RECORDS_SCHEMA.names:
        raise ValueError(f"{problem} (columns {', '.join(table.schema.names)}); rewrite it")
    try:
        table = table.cast(RECORDS_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"{problem} (column types differ); rewrite it") from exc
    return table.to_pandas()


def partial_policies(run_dir: str | Path) -> dict[str, str]:
    """policy -> how it was stopped, for the policies a run directory's summary.json marks
    `"partial": true` (a real run stopped by SIGINT, SIGTERM or an engine failure writes what
    it did and says so); {} when there is no readable summary or nothing is partial."""
    import json

    try:
        summaries = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(summaries, list):
        return {}
    return {str(s.get("policy")): str(s.get("stopped_by", "stopped"))
            for s in summaries if isinstance(s, dict) and s.get("partial")}


def read_metadata(path: str | Path) -> dict[str, str]:
    """The key-value metadata of a records file, decoded (empty when it has none)."""
    raw = pq.read_schema(Path(path)).metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items()}
