"""The interpolating cost model: the simulator's only knowledge of hardware.

Every simulated stage duration comes from a profile table through this module. It is on
the simulator's hot path (hundreds of thousands of calls per run), so lookups use plain
``bisect`` over precomputed Python lists rather than numpy, and integer-argument 1-D
lookups are memoized.

Interpolation is piecewise linear; an axis spanning a decade or more (max/min >= 10,
min > 0) is interpolated in log space and, when every value is positive, so are the
values (log-log), which follows power-law costs far better than linear interpolation on
log-spaced grids. Outside a table the last segment is extended in the same space, with
one warning per table.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Literal

from dualpace_sim.common.cli_support import NoteWarning
from dualpace_sim.costs.profile import (
    AssistCalibration,
    Profile,
    Table1D,
    Table2D,
    load_profile,
)

AssistKind = Literal["p", "lA", "lS"]


class CostExtrapolationWarning(NoteWarning):
    """A cost was asked for outside the profiled range of a table (named by ``table``)."""

    def __init__(self, message: str, table: str = "") -> None:
        super().__init__(message)
        self.table = table


AXIS_MEMO_SIZE = 4096  # integer queries remembered per axis: batch sizes and token counts repeat


class _Axis:
    """One interpolation axis: its points, in log space when they span a decade."""

    __slots__ = ("lo", "hi", "log", "pts", "widths", "last", "_memo")

    def __init__(self, values: Sequence[float], log: bool | None = None) -> None:
        """log: in log space (None: when the points span a decade)."""
        self.lo, self.hi = values[0], values[-1]
        self.log = self.lo > 0 and self.hi / self.lo >= 10 if log is None else log
        self.pts = pts = [math.log(v) for v in values] if self.log else list(values)
        # Each segment's width and the last segment's index, computed once: a context axis
        # misses the memo on nearly every query (NEO's scan sums whole KV lengths).
        self.widths = [b - a for a, b in pairwise(pts)]
        self.last = len(pts) - 2
        self._memo: dict[int, tuple[int, float]] = {}

    def locate(self, value: float) -> tuple[int, float]:
        """Segment index i and position t (0..1 inside, <0 or >1 when extrapolating).
        Integer queries are remembered (up to AXIS_MEMO_SIZE of them): a simulation asks for the
        same batch sizes again and again, each time paying a log and a bisection. The search is
        written out here, not in a helper: a context axis misses the memo on nearly every query
        (NEO's scan reads ~190k of them in the saturated 2k scaling point)."""
        hit = self._memo.get(value)  # type: ignore[call-overload]
        if hit is not None:
            return hit
        x = value
        if self.log:
            if x <= 0:
                raise ValueError(f"{x} must be positive on a log-interpolated axis")
            x = math.log(x)
        pts = self.pts
        i = bisect_right(pts, x) - 1
        if i < 0:
            i = 0
        elif i > self.last:
            i = self.last
        found = i, (x - pts[i]) / self.widths[i]
        if type(value) is int and len(self._memo) < AXIS_MEMO_SIZE:
            self._memo[value] = found
        return found

    def outside(self, value: float) -> bool:
        return value < self.lo or value > self.hi


class _Lookup:
    """Base for tables: warns once when a query falls outside the profiled range."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._warned = False

    def _warn(self, where: str, ranges: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                CostExtrapolationWarning(
                    f"cost table {self.name}: {where} is outside the profiled range {ranges}; "
                    "extrapolating from the last segment (further queries of this table "
                    "are not reported)",
                    self.name,
                ),
                stacklevel=4,
            )


class Interp1D(_Lookup):
    def __init__(self, name: str, table: Table1D) -> None:
        super().__init__(name)
        self.axis = _Axis(table.x)
        self.log_y = self.axis.log and min(table.y) > 0
        self.ys = [math.log(v) for v in table.y] if self.log_y else list(table.y)
        self._memo: dict[int, float] = {}

    def __call__(self, x: float) -> float:
        hit = self._memo.get(x)  # type: ignore[call-overload]
        if hit is not None:
            return hit
        axis = self.axis
        if axis.outside(x):
            self._warn(f"x={x:g}", f"[{axis.lo:g}, {axis.hi:g}]")
        i, t = axis.locate(x)
        ys = self.ys
        y = ys[i] + t * (ys[i + 1] - ys[i])
        value = math.exp(y) if self.log_y else max(y, 0.0)
        if type(x) is int:
            self._memo[x] = value
        return value


class Interp2D(_Lookup):
    """Bilinear interpolation on a grid, each axis in its own (log or linear) space.

    affine_in_y: z is affine in y, as paged decode attention is in the context it streams:
    read linearly in y and z (x keeps its space). Between context points 16x apart a log-log
    reading of such a table bows above the line through two right points: on the H200
    profile by up to a quarter inside a segment and by 5-11 % at the 100k tokens of the
    CPU-busy runs' CPU steps (docs/validation/README.md, session 24)."""

    def __init__(self, name: str, table: Table2D, affine_in_y: bool = False) -> None:
        super().__init__(name)
        self.ax = _Axis(table.x)
        self.ay = _Axis(table.y, log=False) if affine_in_y else _Axis(table.y)
        flat_min = min(min(row) for row in table.z)
        self.log_z = not affine_in_y and (self.ax.log or self.ay.log) and flat_min > 0
        self.zs = [[math.log(v) for v in row] for row in table.z] if self.log_z else table.z

    def __call__(self, x: float, y: float) -> float:
        # The range checks are `_Axis.outside` written out: NEO's scan asks for a CPU-attention
        # time per tentative decode (~190k lookups in the saturated 2k scaling point).
        ax, ay = self.ax, self.ay
        if x < ax.lo or x > ax.hi or y < ay.lo or y > ay.hi:
            self._warn(
                f"(x={x:g}, y={y:g})", f"x in [{ax.lo:g}, {ax.hi:g}], y in [{ay.lo:g}, {ay.hi:g}]"
            )
        i, t = ax.locate(x)
        j, u = ay.locate(y)
        row0, row1 = self.zs[i], self.zs[i + 1]
        z0 = row0[j] + u * (row0[j + 1] - row0[j])
        z1 = row1[j] + u * (row1[j + 1] - row1[j])
        z = z0 + t * (z1 - z0)
        return math.exp(z) if self.log_z else max(z, 0.0)


def _boundary_wait(calibration: AssistCalibration | None, kind: str) -> float:
    """The mean stage-boundary wait inside a calibrated q_x, its groups weighted equally as
    q_x's are; 0 where q_x is the handshake's (no calibration, or a path no run exercised)."""
    if calibration is None:
        return 0.0
    waits = [g.boundary_s for g in calibration.groups if g.path == kind]
    return sum(waits) / len(waits) if waits else 0.0


def _served_stretch(calibration: AssistCalibration | None, kind: str,
                    g: Callable[[float], float]) -> float:
    """How much longer an assist's CUDA interval ran in the calibration's serving runs than
    the idle GPU's g_x at the same batch-row group: the groups' equal-weight mean of
    G_x,u / g_x(u) (1 without served intervals: older calibrations, or runs off CUDA)."""
    if calibration is None:
        return 1.0
    ratios = [grp.g_s / g(grp.rows) for grp in calibration.groups
              if grp.path == kind and grp.g_s and g(grp.rows) > 0]
    return sum(ratios) / len(ratios) if ratios else 1.0


class CostModel:
    """Seconds for every primitive the simulator executes, read from one profile.

    Per-layer methods return the time of ONE transformer layer; whole-model methods say so.
    Batch sizes and token counts of 0 cost nothing.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.shape = shape = profile.model
        self.n_layers = shape.n_layers
        self.block_size = profile.block_size
        self.gpu_kv_blocks = profile.gpu.kv_capacity_blocks
        self.cpu_kv_blocks = profile.cpu.kv_capacity_blocks
        self.kv_block_bytes_per_layer = profile.block_size * shape.kv_bytes_per_token_per_layer
        self.kv_block_bytes = self.kv_block_bytes_per_layer * shape.n_layers
        self.gpu_iteration_overhead = profile.gpu.iteration_overhead_s
        self.gpu_eager_layer = profile.gpu.eager_layer_s
        beside = profile.gpu.eager_layer_beside_cpu_s
        self.gpu_eager_layer_beside_cpu = self.gpu_eager_layer if beside is None else beside
        self.cpu_iteration_overhead = profile.cpu.iteration_overhead_s
        self.poll_s = profile.assist.poll_s
        self.neo_launch_s = profile.neo.launch_s
        self.neo_eager_decode_layer = profile.neo.eager_decode_layer_s or 0.0
        prefill = profile.neo.eager_prefill_layer_s
        self.neo_eager_prefill_layer = self.gpu_eager_layer if prefill is None else prefill
        self._link = profile.link

        g, c, a = profile.gpu, profile.cpu, profile.assist
        self._g_pre_attn = Interp1D("gpu.pre_attn", g.pre_attn)
        self._g_post_attn = Interp1D("gpu.post_attn", g.post_attn)
        self._g_prefill_attn = Interp2D("gpu.prefill_attn", g.prefill_attn)
        self._g_decode_attn = Interp2D("gpu.decode_attn", g.decode_attn, affine_in_y=True)
        self._g_rank_round = (Interp1D("gpu.rank_round", g.rank_round)
                              if g.rank_round is not None else None)
        self._g_pre_layer = Interp1D("gpu.pre_layer", g.pre_layer)
        self._g_post_layer = Interp1D("gpu.post_layer", g.post_layer)
        self._c_pre_layer = Interp1D("cpu.pre_layer", c.pre_layer)
        self._c_pre_attn = Interp1D("cpu.pre_attn", c.pre_attn)
        self._c_decode_attn = Interp2D("cpu.decode_attn", c.decode_attn, affine_in_y=True)
        self._c_post_attn = Interp1D("cpu.post_attn", c.post_attn)
        self._c_post_layer = Interp1D("cpu.post_layer", c.post_layer)
        self._c_assist_write = Interp1D("cpu.assist_write", c.assist_write)
        self._c_assist_read = Interp1D("cpu.assist_read", c.assist_read)
        self._c_hidden_write = Interp1D("cpu.hidden_write", c.hidden_write)
        self._assist = {
            "p": Interp1D("assist.g_p", a.g_p),
            "lA": Interp1D("assist.g_lA", a.g_lA),
            "lS": Interp1D("assist.g_lS", a.g_lS),
        }
        self._q = a.q.model_dump()
        self._o = a.o.model_dump()
        self._q_served = {x: max(q - _boundary_wait(a.calibration, x), 0.0)
                          for x, q in self._q.items()}
        self._stretch = {x: _served_stretch(a.calibration, x, self._assist[x]) for x in self._q}

    @classmethod
    def from_file(cls, path: str | Path) -> CostModel:
        return cls(load_profile(path))

    # --- GPU-main ------------------------------------------------------------------------
    def gpu_layer(
        self,
        n_tokens: int,
        prefills: Sequence[tuple[int, int]],
        n_decodes: int,
        decode_context: int,
        beside_cpu: bool = False,
    ) -> float:
        """One transformer layer of a GPU-main batch.

        ``n_tokens`` counts every row of the batch (prefill chunk tokens + one per decode);
        ``prefills`` holds ``(chunk_tokens, context_tokens_after_the_chunk)`` per prefill;
        ``decode_context`` is the TOTAL context tokens of the ``n_decodes`` decodes.
        ``beside_cpu``: the GPU engine's host shares the box with a CPU engine (DualPace), so
        an eager batch's floor is the one measured that way.
        """
        if n_tokens <= 0:
            return 0.0
        t = self._g_pre_attn(n_tokens) + self._g_post_attn(n_tokens)
        for chunk, context in prefills:
            t += self._g_prefill_attn(chunk, context)
        if n_decodes:
            t += self._g_decode_attn(n_decodes, decode_context)
        if prefills:  # the host issues a chunked round's layers one by one: it may lag
            t = max(t, self.gpu_eager_floor(beside_cpu))
        return t

    def gpu_eager_floor(self, beside_cpu: bool = False) -> float:
        """The host's floor of one layer of a round with prefill chunks (0 where the profile
        has none)."""
        return self.gpu_eager_layer_beside_cpu if beside_cpu else self.gpu_eager_layer

    def neo_eager_floor(self, prefills: bool) -> float:
        """The host's launch floor of one layer of a NEO sub-batch, which runs eagerly
        (SwiftLLM captures no CUDA graphs): a mixed batch's with prefills, a decode batch's
        without (0 where the profile has none)."""
        return self.neo_eager_prefill_layer if prefills else self.neo_eager_decode_layer

    def gpu_linear(self, n_tokens: int) -> float:
        """All non-attention work of one layer for `n_tokens` rows (NEO's linr_T)."""
        return self._g_pre_attn(n_tokens) + self._g_post_attn(n_tokens) if n_tokens > 0 else 0.0

    def gpu_prefill_attn(self, chunk: int, context: int) -> float:
        """Prefill attention of one chunk against `context` tokens, one layer."""
        return self._g_prefill_attn(chunk, context)

    def gpu_decode_attn(self, n: int, context: int) -> float:
        """Paged decode attention of `n` requests over `context` total tokens, one layer."""
        return self._g_decode_attn(n, context) if n > 0 else 0.0

    def cpu_decode_attn(self, n: int, context: int) -> float:
        """CPU paged decode attention of `n` requests over `context` total tokens, one layer."""
        return self._c_decode_attn(n, context) if n > 0 else 0.0

    def gpu_pre_layer(self, n_tokens: int) -> float:
        """Embedding of the whole batch (whole model)."""
        return self._g_pre_layer(n_tokens) if n_tokens > 0 else 0.0

    def gpu_post_layer(self, n_rows: int) -> float:
        """Final norm + LM head + sampling over the rows that emit a token (whole model)."""
        return self._g_post_layer(n_rows) if n_rows > 0 else 0.0

    def gpu_forward(
        self,
        n_tokens: int,
        prefills: Sequence[tuple[int, int]],
        n_decodes: int,
        decode_context: int,
        n_rows: int | None = None,
    ) -> float:
        """A whole GPU-main iteration; ``n_rows`` defaults to one per prefill and decode."""
        if n_tokens <= 0:
            return 0.0
        rows = len(prefills) + n_decodes if n_rows is None else n_rows
        return (
            self.gpu_pre_layer(n_tokens)
            + self.n_layers * self.gpu_layer(n_tokens, prefills, n_decodes, decode_context)
            + self.gpu_post_layer(rows)
            + self.gpu_round_overhead(rows)
        )

    def gpu_round_overhead(self, rows: int) -> float:
        """The fixed part of a GPU-main round: its iteration overhead, plus, under GPU tensor
        parallelism, the rank group's own work for a round of `rows` rows (on the 2-GPU box
        1-2.4 ms a decode round that no stage holds: docs/validation/h200x2)."""
        if self._g_rank_round is None or rows <= 0:
            return self.gpu_iteration_overhead
        return self.gpu_iteration_overhead + self._g_rank_round(rows)

    # --- CPU decode engine ---------------------------------------------------------------
    def cpu_pre_layer(self, b: int) -> float:
        return self._c_pre_layer(b) if b > 0 else 0.0

    def cpu_pre_attn(self, b: int) -> float:
        """One layer's norm, QKV projection, RoPE and KV store on the CPU."""
        return self._c_pre_attn(b) if b > 0 else 0.0

    def cpu_layer_local(self, b: int, context: int) -> float:
        """Pre-attention + attention of one layer; ``context`` is the batch's total context."""
        return self._c_pre_attn(b) + self._c_decode_attn(b, context) if b > 0 else 0.0

    def cpu_post_attn(self, b: int) -> float:
        """t_p(b): one CPU-local post-attention stage."""
        return self._c_post_attn(b) if b > 0 else 0.0

    def cpu_post_layer(self, b: int) -> float:
        """t_l(b): final norm + LM head + sampling on the CPU (whole model)."""
        return self._c_post_layer(b) if b > 0 else 0.0

    def cpu_assist_write(self, b: int) -> float:
        """a_w(b): write residual and attention output to the Assist Buffer."""
        return self._c_assist_write(b) if b > 0 else 0.0

    def cpu_assist_read(self, b: int) -> float:
        """a_r(b): read the GPU-produced hidden state."""
        return self._c_assist_read(b) if b > 0 else 0.0

    def cpu_hidden_write(self, b: int) -> float:
        """h_w(b): write the CPU-produced final hidden state (Split-Final)."""
        return self._c_hidden_write(b) if b > 0 else 0.0

    # --- Dense Assist --------------------------------------------------------------------
    def assist_gpu(self, kind: AssistKind, b: int) -> float:
        """g_x(b): CUDA time of one assist including its data movement."""
        return self._assist[kind](b) if b > 0 else 0.0

    def assist_gpu_beside_batch(self, kind: AssistKind, b: int) -> float:
        """g_x(b) for an assist served at a stage boundary of a running GPU batch, whose
        kernels share the GPU with it: stretched as the calibration's serving runs measured
        (`_served_stretch`; g_x(b) where they measured nothing)."""
        return self._stretch[kind] * self.assist_gpu(kind, b)

    def assist_q(self, kind: AssistKind) -> float:
        """q_x: CPU-visible control-path wait of one assist beyond its CUDA time."""
        return self._q[kind]

    def assist_q_served(self, kind: AssistKind) -> float:
        """q_x less the stage-boundary wait its calibration runs saw: what the CPU waits
        beyond g_x once the GPU worker has started the assist. For the simulator, which books
        each assist at the running batch's next stage boundary itself (Algorithm 1 uses q_x)."""
        return self._q_served[kind]

    def assist_o(self, kind: AssistKind) -> float:
        """o_x: GPU-worker launch + finalization of one assist (displaces GPU-main work)."""
        return self._o[kind]

    # --- link and sizes ------------------------------------------------------------------
    def h2d_time(self, nbytes: float) -> float:
        link = self._link
        return link.latency_s + nbytes / link.h2d_bytes_per_s if nbytes > 0 else 0.0

    def d2h_time(self, nbytes: float) -> float:
        link = self._link
        return link.latency_s + nbytes / link.d2h_bytes_per_s if nbytes > 0 else 0.0

    def activation_bytes(self, b: int) -> int:
        """One hidden-state activation of b rows."""
        return b * self.shape.hidden_size * self.shape.dtype_bytes
