"""Timeline traces in the Chrome/Perfetto Trace Event Format, for ui.perfetto.dev or
chrome://tracing.

One `TraceRecorder` holds the events of one serving node (one policy's run): complete slices on
named tracks (threads in the format), and flow arrows that tie a request's migration to the
round that next computes it. `write_trace` puts several recorders in one file, one process
each, so policies sit side by side on the same time axis.

Times go in as seconds since the run's start; the file holds microseconds. This module imports
only the standard library, because the simulator (`dualpace-sim run`) and the real runtime
(`dualpace-hw run`) both write their timelines through it and must produce the same tracks.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path

from dualpace_sim.results.outputs import replace_atomically

# The tracks both backends use; a recorder accepts other names too (they sort after these).
GPU_ENGINE = "GPU engine"  # GPU rounds: migration waits and GPU-main forwards
DENSE_ASSIST = "Dense Assist"  # assists the GPU worker services for the CPU engine
CPU_ENGINE = "CPU engine"  # CPU rounds (DualPace) or CPU attention (NEO), and CPU waits
PCIE_H2D = "PCIe H2D"  # host -> GPU copies: swap-ins
PCIE_D2H = "PCIe D2H"  # GPU -> host copies: swap-outs, Prefill-to-CPU layer copies
TRACKS = (GPU_ENGINE, DENSE_ASSIST, CPU_ENGINE, PCIE_H2D, PCIE_D2H)

MIGRATION = "migration"  # name of the flow arrows from a transfer to the next round

_FLOW_IDS_PER_PROCESS = 1 << 32  # flow ids must be unique in the file, not just per process
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # as json.dumps with these separators
_BATCH_EVENTS = 10_000


class TraceRecorder:
    """The timeline of one node. Recording is append-only and cheap; `write_trace` formats it.

    Slices on one track must not partially overlap (they may nest): viewers drop slices that
    break nesting, so callers record one engine's sequential rounds, or one link direction's
    FIFO transfers, per track. Threads may share a recorder (the real runtime's engine threads).
    """

    def __init__(self, process: str) -> None:
        self.process = process
        self._lock = threading.Lock()
        # One slice per index, formatted only when written. Columns rather than a tuple per
        # slice: the cyclic garbage collector rescans every live tuple at each full collection,
        # and a tuple per slice made a traced 2,000-request run about 15% slower.
        self._tracks: list[str] = []
        self._names: list[str] = []
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._args: list[dict] = []
        # (source track, source s, destination track, destination s) per arrow
        self._flows: list[tuple[str, float, str, float]] = []
        self._open_flows: dict[Hashable, tuple[str, float]] = {}  # key -> (source track, s)
        self._counters: list[tuple[str, float, dict]] = []  # (counter track, s, {series: value})

    def complete(self, track: str, name: str, start_s: float, end_s: float, **args) -> None:
        """A slice from `start_s` to `end_s` on `track`; `args` show in the viewer's details."""
        if end_s < start_s:
            raise ValueError(f"trace slice {name!r} on {track!r} ends at {end_s} before its "
                             f"start {start_s}")
        with self._lock:
            self._tracks.append(track)
            self._names.append(name)
            self._starts.append(start_s)
            self._ends.append(end_s)
            self._args.append(args)

    def flow_from(self, key: Hashable, track: str, at_s: float) -> None:
        """Open an arrow from the slice on `track` that contains `at_s` (e.g. a swap-out's
        transfer); `key` (e.g. the request id) names it until `flow_to`. Opening a key again
        replaces the arrow that never arrived (the request migrated back first)."""
        with self._lock:
            self._open_flows[key] = (track, at_s)

    def flow_to(self, key: Hashable, track: str, at_s: float) -> None:
        """End the arrow `key` at the slice on `track` that contains `at_s` (the round that
        next computes the request); does nothing when no arrow is open under `key`."""
        with self._lock:
            source = self._open_flows.pop(key, None)
            if source is not None:
                self._flows.append((*source, track, at_s))

    def counter(self, name: str, at_s: float, **values: float) -> None:
        """A sample of the counter track ``name`` (Perfetto draws it as a step plot): each of
        ``values`` is one series of the track, holding until the next sample."""
        with self._lock:
            self._counters.append((name, at_s, values))

    def events(self, pid: int) -> list[dict]:
        """This node's events in the Trace Event Format, as process `pid`. Times are rounded to
        whole nanoseconds, each instant once, so slices that touch still touch exactly."""
        with self._lock:
            return list(self._format(pid))

    def write_events(self, pid: int, write: Callable[[str], object], first: bool) -> None:
        """Write this node's events as process `pid`, comma-separated JSON, one batch of
        text at a time: a trace file is hundreds of MB, never held whole in memory. `first`:
        nothing was written before these (no leading comma)."""
        with self._lock:
            batch: list[str] = []
            for event in self._format(pid):
                batch.append(_ENCODE(event))
                if len(batch) == _BATCH_EVENTS:
                    write(("" if first else ",") + ",".join(batch))
                    batch, first = [], False
            if batch:
                write(("" if first else ",") + ",".join(batch))

    def write(self, path: Path) -> None:
        write_trace(path, [self])

    def _format(self, pid: int) -> Iterator[dict]:
        used = set(self._tracks)
        tids = {track: i + 1 for i, track in enumerate(TRACKS)}
        for track in sorted(used - tids.keys()):
            tids[track] = len(tids) + 1
        yield _meta(pid, 0, "process_name", {"name": self.process})
        yield _meta(pid, 0, "process_sort_index", {"sort_index": pid})
        for track, tid in tids.items():
            if track in used:
                yield _meta(pid, tid, "thread_name", {"name": track})
                yield _meta(pid, tid, "thread_sort_index", {"sort_index": tid})
        for track, name, start_s, end_s, args in zip(self._tracks, self._names, self._starts,
                                                     self._ends, self._args, strict=True):
            start = _ns(start_s)
            event = {"ph": "X", "pid": pid, "tid": tids[track], "name": name,
                     "ts": start / 1000, "dur": (_ns(end_s) - start) / 1000}
            if args:
                event["args"] = args
            yield event
        for name, at_s, values in self._counters:
            yield {"ph": "C", "pid": pid, "name": name, "ts": _ns(at_s) / 1000, "args": values}
        for n, (src_track, src_s, dst_track, dst_s) in enumerate(self._flows):
            flow = {"name": MIGRATION, "cat": MIGRATION, "id": pid * _FLOW_IDS_PER_PROCESS + n,
                    "pid": pid}
            yield {**flow, "ph": "s", "tid": tids[src_track], "ts": _ns(src_s) / 1000}
            yield {**flow, "ph": "f", "bp": "e", "tid": tids[dst_track], "ts": _ns(dst_s) / 1000}


def write_trace(path: Path, recorders: Sequence[TraceRecorder]) -> None:
    """Write one trace file holding each recorder as its own process (pid 1, 2, ...); gzip
    when the name ends in ``.gz`` (Perfetto opens it as it is), with no timestamp in the gzip
    header, so identical runs still give identical files.

    Streamed, event batch by event batch, so memory stays that of the recorders; written to a
    temporary name and renamed, so a trace rewritten after each policy keeps the earlier
    policies' when interrupted. The bytes are those of one ``json.dumps`` of the whole trace.
    """
    path.parent.mkdir(parents=True, exist_ok=True)

    def events(write: Callable[[str], object]) -> None:
        write('{"traceEvents":[')
        for pid, rec in enumerate(recorders, 1):  # each writes its process's names at least
            rec.write_events(pid, write, first=pid == 1)
        write('],"displayTimeUnit":"ms"}')

    def write(tmp: Path) -> None:
        if path.suffix == ".gz":
            with tmp.open("wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0,
                                                     filename="") as gz:
                events(lambda text: gz.write(text.encode()))
        else:
            with tmp.open("w", encoding="utf-8") as f:
                events(f.write)

    replace_atomically(path, write)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _meta(pid: int, tid: int, kind: str, args: dict) -> dict:
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": args}
