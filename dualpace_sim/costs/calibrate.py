"""End-to-end calibration of Dense Assist's control-path costs (paper Appendix B).

The profiler's handshake microbenchmark times an assist through the control block on an idle
GPU (2-10 us beyond its CUDA time). In serving, the CPU-visible wait of an assist also holds
the wait for the busy GPU engine to reach a stage boundary, which no microbenchmark sees, so
Appendix B takes q_x and o_x from serving runs: for each call i of path x (p, l_A, l_S) in
batch-row group u, W the CPU-visible wait, G the CUDA interval, L and F the GPU worker's host
launch and finalization,

    Q_x,u = mean_i [W - G]+        O_x,u = mean_i (L + F)
    q_x   = mean_u Q_x,u           o_x   = mean_u O_x,u

each group weighted equally, so the calibration workload's mix of batch sizes does not become
a prior of the routing fit.

Q_x,u holds the wait for the GPU engine's next stage boundary, B = [W - G - (L + F)]+, and so
it should for Algorithm 1, whose route scores have no other place for it. The simulator books
each assist at the running GPU batch's next stage boundary itself, so it charges the CPU only
q_x less the groups' mean B beyond g_x once the service starts (`CostModel.assist_q_served`):
charging all of q_x there counts the boundary wait twice.

The runs also give each group's served CUDA interval, G_x,u = mean_i G. An assist served at a
stage boundary of a running GPU batch shares the GPU with that batch's kernels (the assist
stream runs beside the compute stream), and on the H200 box its interval was 1.3-1.9x the
idle GPU's g_x(u) in serving (docs/validation/README.md, session 16). The simulator charges
such an assist g_x(b) times the groups' equal-weight mean of G_x,u / g_x(u)
(`CostModel.assist_gpu_beside_batch`); one served on an idle GPU keeps g_x(b).

The real runtime writes one row per assist to ``assists-<policy>.csv.gz`` in its run directory
(`dualpace-hw run`), W measured from CPU-Ready to GPU-Done on the shared control block and
L + F as the GPU worker's service time less the call's CUDA interval. Pure Python: the
simulator's side reads and computes, the runtime's side writes.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .profile import AssistCalibration, AssistGroup, PerAssistPath, Profile
from .record_csv import read_rows, record_file, write_rows

ASSISTS_FILE = "assists-{policy}.csv.gz"
COLUMNS = ("path", "rows", "wait_s", "cuda_s", "host_s")
PATHS = ("p", "lA", "lS")


class CalibrationError(ValueError):
    """Assist records that cannot be read or used; the message is one line naming the file."""


@dataclass(frozen=True, slots=True)
class AssistCall:
    """One Dense Assist as the runtime served it."""

    path: str  # p: post-attention; lA: the final Fused-Assist call; lS: Split-Final post-layer
    rows: int  # the CPU batch's rows
    wait_s: float  # W: CPU-Ready to GPU-Done, the CPU-visible wait
    cuda_s: float  # G: the call's CUDA interval (0 off CUDA)
    host_s: float  # L + F: the GPU worker's service less G


def write_assist_calls(calls: Iterable[AssistCall], path: Path) -> None:
    write_rows(path, COLUMNS, ((c.path, c.rows, c.wait_s, c.cuda_s, c.host_s) for c in calls))


def read_assist_calls(path: Path) -> list[AssistCall]:
    """The rows of one assists CSV; CalibrationError (file, line, field) on a bad one."""
    calls = []
    for line, row in read_rows(path, COLUMNS, CalibrationError):
        kind, *numbers = row
        if kind not in PATHS:
            raise CalibrationError(f"{path}:{line}: path {kind!r}: one of {', '.join(PATHS)}")
        try:
            rows_n, wait, cuda, host = int(numbers[0]), *map(float, numbers[1:])
        except ValueError:
            raise CalibrationError(f"{path}:{line}: rows must be an integer and the times "
                                   f"numbers, got {','.join(numbers)}") from None
        if rows_n < 1 or min(wait, cuda, host) < 0:
            raise CalibrationError(f"{path}:{line}: rows must be >= 1 and times >= 0")
        calls.append(AssistCall(kind, rows_n, wait, cuda, host))
    return calls


def run_assist_calls(run_dir: Path, policy: str = "dualpace") -> list[AssistCall]:
    """A run directory's assist records; CalibrationError when it has none."""
    path = record_file(Path(run_dir), ASSISTS_FILE, policy)
    if not path.is_file():
        raise CalibrationError(f"{run_dir}: no {path.name}; give the --out directory of a "
                               "`dualpace-hw run` of DualPace (runs before session 9 did not "
                               "record their assists)")
    return read_assist_calls(path)


def row_group(rows: int, batch_sizes: Sequence[int]) -> int:
    """The batch-row group u of a call: the smallest profiled batch size >= its rows (the
    largest one for calls beyond the grid)."""
    return next((b for b in batch_sizes if b >= rows), batch_sizes[-1])


@dataclass
class Calibration:
    q: dict[str, float]  # path -> q_x, s, for the paths with calls
    o: dict[str, float]  # path -> o_x, s
    groups: list[AssistGroup]


def calibrate(calls: Iterable[AssistCall], batch_sizes: Sequence[int]) -> Calibration:
    """Q_x,u, O_x,u per (path, group) and their equal-weight means q_x, o_x (module docstring)."""
    sizes = sorted(set(batch_sizes))
    if not sizes:
        raise CalibrationError("no batch sizes to group the calls by")
    by_group: dict[tuple[str, int], list[AssistCall]] = {}
    for c in calls:
        by_group.setdefault((c.path, row_group(c.rows, sizes)), []).append(c)
    groups = [AssistGroup(path=path, rows=u, calls=len(cs),
                          q_s=statistics.fmean(max(c.wait_s - c.cuda_s, 0.0) for c in cs),
                          o_s=statistics.fmean(c.host_s for c in cs),
                          boundary_s=statistics.fmean(
                              max(c.wait_s - c.cuda_s - c.host_s, 0.0) for c in cs),
                          g_s=statistics.fmean(c.cuda_s for c in cs))
              for (path, u), cs in sorted(by_group.items(),
                                          key=lambda kv: (PATHS.index(kv[0][0]), kv[0][1]))]
    q = {x: statistics.fmean(g.q_s for g in groups if g.path == x)
         for x in PATHS if any(g.path == x for g in groups)}
    o = {x: statistics.fmean(g.o_s for g in groups if g.path == x) for x in q}
    return Calibration(q, o, groups)


def with_calibration(profile: Profile, cal: Calibration, runs: Sequence[str],
                     date: str | None = None, workload: str | None = None) -> Profile:
    """A copy of `profile` whose assist q and o are the calibration's for the paths it has
    (the others keep the handshake's values), with the calibration recorded beside them."""
    if not cal.q:
        raise CalibrationError("the runs hold no Dense Assist calls: nothing to calibrate "
                               "(a run whose CPU batches all route Full-CPU makes none)")
    a = profile.assist
    q = PerAssistPath(**{x: cal.q.get(x, getattr(a.q, x)) for x in PATHS})
    o = PerAssistPath(**{x: cal.o.get(x, getattr(a.o, x)) for x in PATHS})
    record = AssistCalibration(runs=list(runs), date=date or dt.date.today().isoformat(),
                               groups=cal.groups, kept=[x for x in PATHS if x not in cal.q],
                               workload=workload)
    assist = a.model_copy(update={"q": q, "o": o, "calibration": record})
    return profile.model_copy(update={"assist": assist})
