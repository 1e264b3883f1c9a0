"""What a serving node held, and how busy its engines were, over time: recorded from the node's
own state as it runs, not rebuilt from the per-request records.

Two logs, both lean (a few numbers per core call, in typed arrays):

- :class:`StateLog` samples the scheduler's queues and pools after each core call, a row only
  where something changed (the last of several calls at one instant wins). The simulator
  samples as it makes the calls; the real runtime samples, at each journaled call, the state
  the previous one left (every core call is journaled under the one lock, so that is the state
  until this call), which is what replaying its journal through fresh schedulers gives.
- :class:`Busy` holds, per engine, how long it worked in each of a fixed number of fine time
  bins: GPU batches and Dense Assist services, CPU rounds, and each PCIe direction's
  transfers. Utilisation over time is the share of each output bin an engine worked, in
  [0, 1]; summed over the bins it is the engine's busy time.

:class:`NodeSeries` is both, as tables; a run writes them to ``state.parquet`` and
``utilisation.parquet`` beside its records, a timeline trace draws them as counter tracks, and
`dualpace-sim plot` draws them (docs: output reference).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dualpace_sim.core.neo import NeoScheduler
from dualpace_sim.core.state import EngineState
from dualpace_sim.core.vllm import VllmScheduler
from dualpace_sim.results.outputs import replace_atomically
from dualpace_sim.results.trace_events import TraceRecorder

# Queue lengths and KV blocks, in the order a StateLog row holds them.
STATE_COLUMNS = ("waiting", "prefilling", "gpu_decoding", "cpu_waiting", "cpu_decoding",
                 "hbm_kv_blocks", "host_kv_blocks", "host_kv_growth_blocks",
                 "host_kv_migration_blocks")
ENGINES = ("gpu", "cpu", "pcie_h2d", "pcie_d2h")
# A summary's busy shares of those engines over the run (`busy_shares`, `runner.utilisation`).
UTILISATION_KEYS = tuple(f"{e}_utilisation" for e in ENGINES)
UTILISATION_BINS = 500  # time bins of a run's utilisation series
STATE_FILE, UTILISATION_FILE = "state.parquet", "utilisation.parquet"
FINE_BINS = 1 << 16  # busy-time bins an engine keeps (0.5 MiB), however long the run
FIRST_WIDTH_S = 1e-4  # their first width: 6.6 s of run before the first doubling


def state_reader(sched: EngineState | VllmScheduler | NeoScheduler
                 ) -> Callable[[], tuple[int, ...]]:
    """A function giving the :data:`STATE_COLUMNS` of a policy's scheduler state now (each
    policy's state says what its columns hold: `EngineState.state_row`)."""
    return sched.state_row


class StateLog:
    """The scheduler state after each core call: one time and one row of
    :data:`STATE_COLUMNS` where the row changed."""

    __slots__ = ("read", "times", "values", "_last")

    def __init__(self, read: Callable[[], tuple[int, ...]]) -> None:
        self.read = read
        self.times = array("d")
        self.values = array("i")  # row-major, len(STATE_COLUMNS) a row
        self._last: tuple[int, ...] | None = None

    def sample(self, t: float) -> None:
        """The state now, as of time `t` (not before the previous sample's)."""
        row = self.read()
        if row == self._last:
            return
        self._last = row
        times = self.times
        if times and times[-1] == t:  # a later call at the same instant: its state holds
            width = len(row)
            del self.values[-width:]
        else:
            times.append(t)
        self.values.extend(row)

    def frame(self) -> pd.DataFrame:
        """``time_s`` and :data:`STATE_COLUMNS`, one row per sample; each row holds until the
        next one's time."""
        values = np.frombuffer(self.values, dtype=np.int32).reshape(-1, len(STATE_COLUMNS))
        # One int64 block, made once, each column contiguous in it (Arrow then takes them as
        # they are): a dict of columns is consolidated into a second copy, and a long run at
        # low load logs millions of rows (2.8M at 200k requests, 1.5 req/s).
        columns = np.ascontiguousarray(values.T, dtype=np.int64)
        frame = pd.DataFrame(columns.T, columns=list(STATE_COLUMNS), copy=False)
        frame.insert(0, "time_s", np.frombuffer(self.times, dtype=np.float64).copy())
        return frame


class Intervals:
    """When one engine worked, as busy seconds in fixed-width time bins: memory stays
    :data:`FINE_BINS` numbers however long the run (a 200k-request run books ~10^7 layer
    copies). Bins start :data:`FIRST_WIDTH_S` wide and double, pairwise merged, whenever an
    interval ends past the last one, so the run always spans at most FINE_BINS of them. An
    engine's intervals do not overlap (one batch or assist at a time, one round, one FIFO
    transfer per direction), so each bin's busy seconds are at most its width; carried
    activations may overlap a copy, and a share is capped at 1.

    An interval is only noted when added (two appends: the simulator adds one per batch,
    assist, CPU round and layer copy, ~70 a request) and split over the bins
    :data:`PENDING` at a time in one numpy pass: in the 2k-request DualPace benchmark,
    binning each as it came took ~18 % of the CPU time, this ~8 %."""

    __slots__ = ("_width", "_busy", "_starts", "_ends")

    PENDING = 1 << 14  # intervals noted before they are binned (256 KiB)

    def __init__(self) -> None:
        self._width = FIRST_WIDTH_S
        self._busy = np.zeros(FINE_BINS)
        self._starts, self._ends = array("d"), array("d")

    def add(self, start: float, end: float) -> None:
        """Busy from `start` to `end` (nothing when `end <= start`)."""
        if end > start:
            self._starts.append(start)
            self._ends.append(end)
            if len(self._starts) >= self.PENDING:
                self._bin_pending()

    @property
    def width(self) -> float:
        """The bins' width now (every interval added so far binned)."""
        self._bin_pending()
        return self._width

    @property
    def busy(self) -> np.ndarray:
        """Busy seconds of each of the :data:`FINE_BINS` bins, every interval added so far in."""
        self._bin_pending()
        return self._busy

    def _bin_pending(self) -> None:
        """Split the noted intervals over the bins: each adds its overlap to its first and last
        bin and a whole width to every bin between."""
        if not self._starts:
            return
        starts, ends = np.frombuffer(self._starts), np.frombuffer(self._ends)
        while ends.max() > self._width * FINE_BINS:
            pairs = self._busy.reshape(-1, 2).sum(axis=1)
            self._busy = np.concatenate([pairs, np.zeros(FINE_BINS - len(pairs))])
            self._width *= 2
        width, busy = self._width, self._busy
        first = (starts // width).astype(np.int64)
        last = np.minimum((ends // width).astype(np.int64), FINE_BINS - 1)
        one = first == last
        np.add.at(busy, first[one], ends[one] - starts[one])
        many = ~one
        first, last, starts, ends = first[many], last[many], starts[many], ends[many]
        np.add.at(busy, first, (first + 1) * width - starts)
        np.add.at(busy, last, ends - last * width)
        between = np.zeros(FINE_BINS + 1, dtype=np.int64)  # +1 from first + 1, -1 from last
        np.add.at(between, first + 1, 1)
        np.add.at(between, last, -1)
        busy += np.cumsum(between[:-1]) * width
        self._starts, self._ends = array("d"), array("d")

    def total(self) -> float:
        return float(self.busy.sum())

    def covered(self, edges: np.ndarray) -> np.ndarray:
        """Busy seconds before each of `edges` (sorted), spread evenly inside each bin."""
        cumulative = np.concatenate([[0.0], np.cumsum(self.busy)])
        grid = np.arange(FINE_BINS + 1) * self._width
        return np.interp(edges, grid, cumulative)


class Busy:
    """When each engine of :data:`ENGINES` worked."""

    __slots__ = ENGINES

    def __init__(self) -> None:
        for engine in ENGINES:
            setattr(self, engine, Intervals())

    def utilisation(self, end_s: float, bins: int = UTILISATION_BINS) -> pd.DataFrame:
        """``start_s, end_s`` and the share (0-1) of each bin each engine worked, in `bins`
        equal bins from 0 to `end_s`."""
        if end_s <= 0:
            return pd.DataFrame({c: np.empty(0) for c in ("start_s", "end_s", *ENGINES)})
        edges = np.linspace(0.0, end_s, bins + 1)
        width = np.diff(edges)
        shares = {e: np.clip(np.diff(getattr(self, e).covered(edges)) / width, 0.0, 1.0)
                  for e in ENGINES}
        return pd.DataFrame({"start_s": edges[:-1], "end_s": edges[1:], **shares})


@dataclass(frozen=True)
class NodeSeries:
    """One policy's series: ``state`` (:meth:`StateLog.frame`) and ``utilisation``
    (:meth:`Busy.utilisation`)."""

    state: pd.DataFrame
    utilisation: pd.DataFrame

    @classmethod
    def of(cls, states: StateLog, busy: Busy, end_s: float) -> NodeSeries:
        return cls(states.frame(), busy.utilisation(end_s))


def busy_shares(series: NodeSeries) -> dict[str, float]:
    """Each engine's busy share (0-1) over the run its utilisation series spans:
    ``gpu_utilisation``, ``cpu_utilisation``, ``pcie_h2d_utilisation``,
    ``pcie_d2h_utilisation``. A real run's summary has these from its series, where the
    runtime counts no bytes to price against the link (NaN for an empty series)."""
    u = series.utilisation
    span = float(u["end_s"].iloc[-1] - u["start_s"].iloc[0]) if len(u) else 0.0
    widths = u["end_s"] - u["start_s"]
    return {key: float((widths * u[e]).sum() / span) if span > 0 else np.nan
            for key, e in zip(UTILISATION_KEYS, ENGINES, strict=True)}


def write_series(parts: dict[str, NodeSeries], out: Path,
                 metadata: dict[bytes, bytes] | None = None) -> None:
    """``state.parquet`` and ``utilisation.parquet`` in `out`: each policy's rows, in order,
    with a ``policy`` column first; `metadata` as each file's key-value metadata. Written one
    policy at a time from its own columns: a long run's state log has millions of rows, and a
    frame of all policies and its Arrow copy would each hold all of them at once. Nothing is
    written without a policy."""
    if not parts:
        return
    for name, attr in ((STATE_FILE, "state"), (UTILISATION_FILE, "utilisation")):

        def write(tmp: Path, attr: str = attr) -> None:
            writer: pq.ParquetWriter | None = None
            try:
                for policy, series in parts.items():
                    frame = getattr(series, attr)
                    table = pa.Table.from_pandas(frame, preserve_index=False).add_column(
                        0, "policy", pa.repeat(pa.scalar(policy, pa.large_string()), len(frame)))
                    table = table.replace_schema_metadata(metadata)
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, table.schema)
                    writer.write_table(table)
            finally:
                if writer is not None:
                    writer.close()

        replace_atomically(out / name, write)


def read_series(run_dir: Path) -> dict[str, NodeSeries]:
    """The series a run directory holds, by policy ({} when it has none: made by an older
    version); ValueError naming the file when one is unreadable."""
    paths = [Path(run_dir) / STATE_FILE, Path(run_dir) / UTILISATION_FILE]
    if not all(p.is_file() for p in paths):
        return {}
    frames = []
    for path, columns in zip(paths, (("time_s", *STATE_COLUMNS),
                                     ("start_s", "end_s", *ENGINES)), strict=True):
        try:
            df = pq.read_table(path).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"{path}: not readable ({exc}); rerun to write it again") from None
        missing = [c for c in ("policy", *columns) if c not in df.columns]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r}; rerun to write it again")
        frames.append(df)
    state, util = frames
    return {p: NodeSeries(state[state["policy"] == p].drop(columns="policy")
                          .reset_index(drop=True),
                          util[util["policy"] == p].drop(columns="policy")
                          .reset_index(drop=True))
            for p in dict.fromkeys(state["policy"])}


def held_at(state: pd.DataFrame, times: Sequence[float] | np.ndarray) -> pd.DataFrame:
    """The state at each of `times` (the last sample at or before it; zeros before the
    first), for plots of runs with millions of samples."""
    times = np.asarray(times, dtype=float)
    at = np.searchsorted(state["time_s"].to_numpy(), times, side="right") - 1
    out = {"time_s": times}
    for c in STATE_COLUMNS:
        values = state[c].to_numpy()
        out[c] = np.where(at >= 0, values[np.maximum(at, 0)], 0) if len(values) else \
            np.zeros(len(times), dtype=np.int64)
    return pd.DataFrame(out)


# Counter tracks of a timeline trace: track -> the node_series columns it draws.
COUNTER_TRACKS = {"requests": STATE_COLUMNS[:5], "KV blocks": STATE_COLUMNS[5:],
                  "utilisation": ENGINES}


def record_series_counters(trace: TraceRecorder, series: NodeSeries) -> None:
    """The series `dualpace-sim plot` draws (`dualpace_sim.results.node_series`) as counter tracks
    of the run's trace: the queues and KV blocks at every sample of the node's state, each
    engine's utilisation at the start of each bin (and 0 at the end)."""
    state = series.state
    queues, kv = (state[list(COUNTER_TRACKS[t])].to_numpy() for t in ("requests", "KV blocks"))
    for t, q, k in zip(state["time_s"].to_numpy(), queues, kv, strict=True):
        trace.counter("requests", float(t), **dict(zip(COUNTER_TRACKS["requests"],
                                                       map(int, q), strict=True)))
        trace.counter("KV blocks", float(t), **dict(zip(COUNTER_TRACKS["KV blocks"],
                                                        map(int, k), strict=True)))
    util = series.utilisation
    for row in util.itertuples(index=False):
        trace.counter("utilisation", row.start_s, **{e: round(float(getattr(row, e)), 6)
                                                     for e in ENGINES})
    if len(util):
        trace.counter("utilisation", float(util["end_s"].iloc[-1]), **dict.fromkeys(ENGINES, 0))
