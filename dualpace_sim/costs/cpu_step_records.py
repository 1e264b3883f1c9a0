"""The real CPU engine's steps, phase by phase: the record `dualpace-hw run` writes for DualPace.

The profile prices a CPU step from stage tables timed alone (pre-attention, attention, the
assist buffers, post-attention, post-layer). In serving, the step runs beside the GPU engine and
inside the runtime's worker loop; on the H200 box its own work ran 1.0-1.18x those tables in the
session-16 runs (docs/validation/README.md). One row per step, with the executor's clock split
by phase, says which stage runs slower than its table and by how much, for the plan the journal
holds at the same position (`dualpace_sim/validation/analysis/cpu_step_parts.py`). Pure Python: the
runtime writes, the analyses read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from .record_csv import read_rows, write_rows

CPU_STEPS_FILE = "cpu-steps-{policy}.csv.gz"


class CpuStepRecordError(ValueError):
    """A step record that cannot be read; the message is one line naming the file and line."""


@dataclass(frozen=True, slots=True)
class CpuStepRecord:
    """One CPU engine step as the runtime ran it (seconds; phases on the worker's clock, the
    slowest rank's under CPU tensor parallelism)."""

    route: str  # Full-CPU, Split-Final or Fused-Assist
    rows: int  # the batch's requests
    context: int  # the batch's total context, tokens
    step_s: float  # the worker's whole step
    setup_s: float  # positions, block tables and slots
    pre_layer_s: float  # embedding
    pre_attn_s: float  # N x (norm, QKV, RoPE)
    kv_write_s: float  # N x the new token's K, V into the host pool
    attention_s: float  # N x paged decode attention
    assists_s: float  # Dense Assists end to end (buffers in, wait, result out)
    post_s: float  # the CPU's own post-attention stages and post-layer


COLUMNS = tuple(f.name for f in fields(CpuStepRecord))


def write_cpu_steps(records: Iterable[CpuStepRecord], path: Path) -> None:
    write_rows(path, COLUMNS, (astuple(r) for r in records))


def read_cpu_steps(path: Path) -> list[CpuStepRecord]:
    """The rows of one CPU-step record; CpuStepRecordError (file, line) on a bad one."""
    out = []
    for line, row in read_rows(path, COLUMNS, CpuStepRecordError):
        try:
            route, rows_n, context, *times = row
            rec = CpuStepRecord(route, int(rows_n), int(context), *map(float, times))
        except ValueError:
            raise CpuStepRecordError(f"{path}:{line}: rows and context must be integers and "
                                     f"the times numbers, got {','.join(row)}") from None
        if rec.rows < 1 or min(astuple(rec)[3:]) < 0:
            raise CpuStepRecordError(f"{path}:{line}: rows must be >= 1 and times >= 0")
        out.append(rec)
    return out
