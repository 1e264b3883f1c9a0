"""Calibration-profile file format (``dualpace-profile/1``).

A profile is everything the simulator knows about one (box, model, parallelism): latency
tables for the GPU, CPU and Dense Assist primitives, link bandwidths, KV capacities, and
where the numbers came from. The schema is strict (unknown keys are errors) because a
typo in a hand-edited profile would otherwise silently fall back to a default and skew
every result computed from it. All times are in seconds.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dualpace_sim.common.inputs import InputFileError, load_yaml, read_text
from dualpace_sim.core.routing import legal_thresholds
from dualpace_sim.costs.shapes import ModelShape

PROFILE_FORMAT = "dualpace-profile/1"
# What `dualpace-hw profile --quick` appends to a profile's provenance notes.
QUICK_NOTE = "QUICK grids and protocol"
# libyaml when available: profiles hold thousands of numbers and pure-Python YAML is slow.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class ProfileError(ValueError):
    """A profile or hardware-spec file that cannot be used; the message names file and field."""


class StrictModel(BaseModel):
    """Base of every file-backed model: unknown keys and NaN/inf are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _strictly_increasing(values: list[float]) -> list[float]:
    if len(values) < 2:
        raise ValueError("needs at least 2 points")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError("must be strictly increasing")
    return values


def _non_negative(values: list[float]) -> None:
    if any(v < 0 for v in values):
        raise ValueError("must be >= 0")


class Table1D(StrictModel):
    """y(x), sampled at strictly increasing x."""

    x: list[float] = Field(description="the argument, strictly increasing, at least 2 points")
    y: list[float] = Field(description="the value at each x, >= 0")

    _check_x = field_validator("x")(_strictly_increasing)

    @field_validator("y")
    @classmethod
    def _check_y(cls, y: list[float], info: ValidationInfo) -> list[float]:
        x = info.data.get("x")
        if x is not None and len(y) != len(x):
            raise ValueError(f"has {len(y)} values but x has {len(x)}")
        _non_negative(y)
        return y


class Table2D(StrictModel):
    """z(x, y) on the grid x × y; ``z[i][j]`` is the value at ``(x[i], y[j])``."""

    x: list[float] = Field(description="the first argument, strictly increasing, at least 2")
    y: list[float] = Field(description="the second argument, strictly increasing, at least 2")
    z: list[list[float]] = Field(description="one row per x, one value per y in each row, >= 0")

    _check_axes = field_validator("x", "y")(_strictly_increasing)

    @field_validator("z")
    @classmethod
    def _check_z(cls, z: list[list[float]], info: ValidationInfo) -> list[list[float]]:
        x, y = info.data.get("x"), info.data.get("y")
        if x is not None and len(z) != len(x):
            raise ValueError(f"has {len(z)} rows but x has {len(x)} values")
        if y is not None and any(len(row) != len(y) for row in z):
            raise ValueError(f"every row must have {len(y)} values (one per y)")
        for row in z:
            _non_negative(row)
        return z


class Provenance(StrictModel):
    """Where the numbers came from. Roofline profiles are never presented as measurements."""

    method: Literal["measured", "roofline"] = Field(
        description="measured on a box by `dualpace-hw profile`, or synthesized from specs")
    date: str = Field(description="when the numbers were made (ISO date)")
    command: str | None = Field(None, description="the command that wrote the profile")
    notes: str | None = Field(None, description="free text")
    quick: bool | None = Field(
        None, description="measured: made by `dualpace-hw profile --quick` (tiny grids, few "
                          "repeats: for tests, not for studies); absent in older profiles, "
                          "whose command or notes say it")
    host: str | None = Field(None, description="measured: the box's host name")
    cpu_model: str | None = Field(None, description="measured: CPU model name")
    gpu_model: str | None = Field(None, description="measured: GPU model name")
    cpu_cores: int | None = Field(None, description="measured: CPU cores (threads) profiled")
    amx: bool | None = Field(None, description="measured: whether the CPU has AMX")
    memory_gib: float | None = Field(None, description="measured: host memory, GiB")
    torch_version: str | None = Field(None, description="measured: PyTorch version")
    cuda_version: str | None = Field(None, description="measured: CUDA version")
    onednn_version: str | None = Field(None, description="measured: oneDNN version")
    host_read_bytes_per_s: PositiveFloat | None = Field(
        None, description="measured: the host's memory read bandwidth on the profiled cores, "
                          "bytes/s (a streaming read of four last-level caches with as many "
                          "threads, the median of 5 passes). The CPU engine's memory-bound "
                          "stages run at this speed; `dualpace-hw run` measures it again at "
                          "start-up and `dualpace-sim validate` notes a run served on a host "
                          "more than 5 % off it. Absent in older profiles")
    spec_name: str | None = Field(None, description="roofline: the hardware spec's name")
    spec: dict[str, Any] | None = Field(None, description="roofline: the whole hardware spec")
    efficiency: dict[str, float] | None = Field(
        None, description="roofline: the efficiency factors applied to the spec's peaks")
    parameters: dict[str, int | float | None] | None = Field(
        None, description="roofline: the synthesizer's keyword arguments")
    generator_version: str | None = Field(
        None, description="roofline: version of the synthesizer that wrote the profile")

    def is_quick(self) -> bool:
        """Whether the profiler's --quick grids made the numbers. Profiles written before the
        `quick` field say it in their command (`... --quick`) or, made through the Python
        API (no command), in the line the profiler appends to the notes."""
        if self.quick is not None:
            return self.quick
        return ("--quick" in (self.command or "").split()
                or QUICK_NOTE in (self.notes or ""))

    @field_validator("date", mode="before")
    @classmethod
    def _date_to_str(cls, value: Any) -> Any:
        # YAML turns an unquoted 2026-01-31 into a date object; keep the ISO text.
        return value.isoformat() if isinstance(value, dt.date) else value


class Box(StrictModel):
    """The serving node the numbers describe."""

    name: str = Field(description="the box's name, e.g. `h200-spr16`")
    gpu: str = Field(description="GPU model")
    gpu_count: PositiveInt = Field(1, description="GPUs serving the model")
    tensor_parallel: PositiveInt = Field(1, description="GPU tensor-parallel degree")
    cpu: str = Field(description="CPU model")
    cpu_cores: PositiveInt = Field(description="CPU cores the CPU engine uses")
    cpu_tensor_parallel: PositiveInt = Field(
        1, description="CPU tensor-parallel ranks of the CPU engine (its cores split among them)")


class RoundOverheadCalibration(StrictModel):
    """Where the GPU iteration overhead came from when it came from serving runs: the
    profiler's timing corrected by the median excess of the runs' decode-only rounds with the
    CPU engine idle over their model (`dualpace_sim.results.served_rounds`)."""

    runs: list[str] = Field(description="the run directories whose rounds were used")
    rounds: PositiveInt = Field(description="decode-only rounds with the CPU engine idle")
    measured_s: NonNegativeFloat = Field(
        description="the overhead that priced the rounds (the profiler's timing), s")
    served_s: NonNegativeFloat = Field(
        description="measured_s plus the rounds' median excess over their model, s (the "
                    "profile's iteration_overhead_s)")


class GpuCosts(StrictModel):
    """GPU-main primitives; per transformer layer unless the name says otherwise."""

    pre_attn: Table1D = Field(
        description="pre-attention stage (RMSNorm, QKV projection, RoPE) by tokens in the batch")
    post_attn: Table1D = Field(
        description="post-attention stage (output projection, residual, RMSNorm, MLP) by tokens")
    prefill_attn: Table2D = Field(
        description="prefill attention of one chunk by (chunk tokens, context after the chunk)")
    decode_attn: Table2D = Field(
        description="paged decode attention by (decode requests, their total context tokens)")
    pre_layer: Table1D = Field(description="whole model: the embedding, by tokens")
    post_layer: Table1D = Field(
        description="whole model: final RMSNorm, LM head and sampling, by sampled rows")
    iteration_overhead_s: NonNegativeFloat = Field(
        description="fixed cost of every GPU iteration (building the batch's device inputs)")
    iteration_overhead_calibration: RoundOverheadCalibration | None = Field(
        default=None,
        description="set when iteration_overhead_s comes from served rounds (the calibration "
                    "runs) rather than the profiler's one-shot timing")
    eager_layer_s: NonNegativeFloat = Field(
        default=0.0,
        description="host time to issue one layer of a batch with prefill chunks as the "
                    "runtime runs it (its layer graphs around eager attention on one GPU, "
                    "eagerly under tensor parallelism), so its layers take at least this long "
                    "(the stage tables are graph-replayed GPU times); 0 = no floor")
    eager_layer_beside_cpu_s: NonNegativeFloat | None = Field(
        default=None,
        description="the same floor with the GPU engine's host on the cores the CPU engine "
                    "leaves while the CPU engine decodes on its own (as DualPace runs them); "
                    "none = eager_layer_s")
    rank_round: Table1D | None = Field(
        default=None,
        description="under GPU tensor parallelism, what a whole decode round costs beyond "
                    "its stages and iteration overhead (the rank group's hand-off and token "
                    "check, and each layer's extra time inside a round over its stages timed "
                    "alone), by the round's rows; none with one GPU")
    kv_capacity_blocks: NonNegativeInt = Field(
        description="HBM KV capacity in blocks of `block_size` tokens")


class CpuCosts(StrictModel):
    """CPU decode primitives per CPU batch size b; per layer unless whole-model."""

    pre_layer: Table1D = Field(description="whole model: the embedding, by b")
    pre_attn: Table1D = Field(description="pre-attention stage by b")
    decode_attn: Table2D = Field(
        description="paged decode attention over host KV by (b, total context tokens)")
    post_attn: Table1D = Field(description="t_p(b): the post-attention stage on the CPU")
    post_layer: Table1D = Field(
        description="t_l(b), whole model: final RMSNorm, LM head and sampling on the CPU")
    assist_write: Table1D = Field(
        description="a_w(b): write the residual and attention output to the Assist Buffer")
    assist_read: Table1D = Field(
        description="a_r(b): read the GPU-produced hidden state from the Assist Buffer")
    hidden_write: Table1D = Field(
        description="h_w(b): write the final hidden state for a Split-Final post-layer assist")
    iteration_overhead_s: NonNegativeFloat = Field(
        description="fixed cost of every CPU iteration")
    kv_capacity_blocks: NonNegativeInt = Field(
        description="host KV capacity in blocks of `block_size` tokens")


class PerAssistPath(StrictModel):
    """One constant per Dense Assist path (paper Appendix B: p, l_A, l_S)."""

    p: NonNegativeFloat = Field(description="a non-final post-attention assist")
    lA: NonNegativeFloat = Field(
        description="the final Fused-Assist call (last post-attention stage and the post-layer)")
    lS: NonNegativeFloat = Field(description="the Split-Final post-layer call")


class AssistGroup(StrictModel):
    """One (path, batch-row group) of an end-to-end calibration (paper Appendix B)."""

    path: Literal["p", "lA", "lS"] = Field(description="the assist path x")
    rows: PositiveInt = Field(description="the batch-row group u: the profiled batch size the "
                                          "calls' row counts round up to")
    calls: PositiveInt = Field(description="calls in the group")
    q_s: NonNegativeFloat = Field(description="Q_x,u = mean over the calls of [W - G]+, s")
    o_s: NonNegativeFloat = Field(description="O_x,u = mean over the calls of L + F, s")
    boundary_s: NonNegativeFloat = Field(
        description="mean over the calls of [W - G - (L + F)]+, s: CPU-Ready to GPU-Running, "
                    "the wait for the busy GPU engine's stage boundary inside Q_x,u (the "
                    "simulator books that wait itself; `dualpace-sim profile calibrate` "
                    "recomputes it from the runs)")
    g_s: NonNegativeFloat | None = Field(
        None, description="G_x,u = mean over the calls of G, s: the served CUDA interval, "
                          "which the GPU engine's kernels running beside the assist stretch "
                          "beyond the idle GPU's g_x(u) (None in calibrations before session "
                          "16; 0 off CUDA)")


class AssistCalibration(StrictModel):
    """Where q_x and o_x came from when they came from serving runs (paper Appendix B): q_x and
    o_x are the means of the groups' Q_x,u and O_x,u, each group weighted equally."""

    runs: list[str] = Field(description="the run directories whose assist records were used")
    date: str = Field(description="when the calibration was computed (ISO date)")
    groups: list[AssistGroup] = Field(description="every (path, batch-row group) and its means")
    kept: list[Literal["p", "lA", "lS"]] = Field(
        default_factory=list,
        description="paths no run exercised: their q and o are the handshake microbenchmark's")
    workload: str | None = Field(
        None, description="what the runs served, when `dualpace-hw profile` served them itself")


class AssistCosts(StrictModel):
    """Dense Assist (paper Appendix B): the CPU waits q_x + g_x(b) for one assisted stage, and
    the GPU-main work it displaces is o_x + g_x(b)."""

    g_p: Table1D = Field(
        description="CUDA time of a non-final post-attention assist by b, transfers included")
    g_lA: Table1D = Field(description="CUDA time of the final Fused-Assist call by b")
    g_lS: Table1D = Field(description="CUDA time of the Split-Final post-layer call by b")
    q: PerAssistPath = Field(description="CPU-visible control-path wait per call, s")
    o: PerAssistPath = Field(description="GPU-worker launch and finalization per call, s")
    poll_s: NonNegativeFloat = Field(
        description="GPU worker's check for a ready assist at each stage boundary")
    calibration: AssistCalibration | None = Field(
        None, description="set when q and o come from end-to-end calibration runs (Appendix B) "
                          "rather than the handshake microbenchmark")


class LinkCosts(StrictModel):
    """Host <-> GPU transfers (full duplex): time = latency + bytes / bandwidth."""

    h2d_bytes_per_s: PositiveFloat = Field(
        description="host-to-GPU bandwidth of the whole tensor-parallel group")
    d2h_bytes_per_s: PositiveFloat = Field(
        description="GPU-to-host bandwidth of the whole tensor-parallel group")
    latency_s: NonNegativeFloat = Field(description="fixed cost of one transfer")


class NeoCosts(StrictModel):
    """What only the NEO baseline uses."""

    # NEO hard-codes its CPU launch term to 0.8 ms (swiftllm perfpredictor `lnch_T`).
    launch_s: NonNegativeFloat = Field(
        0.0008, description="NEO's CPU launch term lnch_T in its overlap checks (paper Eq. 1)")
    eager_decode_layer_s: NonNegativeFloat | None = Field(
        default=None,
        description="host time to issue one layer of a decode-only batch without CUDA graphs: "
                    "NEO (SwiftLLM) runs every iteration eagerly, so each sub-batch without "
                    "prefills holds a layer at least this long (one with prefills: "
                    "eager_prefill_layer_s); none = no floor for those")
    eager_prefill_layer_s: NonNegativeFloat | None = Field(
        default=None,
        description="host time to issue one layer of a batch with prefill chunks without "
                    "CUDA graphs, the floor of NEO's sub-batches with prefills (where the "
                    "runtime's chunked rounds replay layer graphs, gpu.eager_layer_s is "
                    "theirs); none = gpu.eager_layer_s")


class ControlsFit(StrictModel):
    """The parameters `dualpace-sim profile fit --write` used (paper §4.3, Algorithm 1)."""

    epsilon: NonNegativeFloat = Field(description="regret tolerance ε of Algorithm 1")
    lambda_gpu: NonNegativeFloat = Field(
        description="λ_GPU: weight of displaced GPU-main service in the route score (Eq. 6)")
    k: PositiveInt = Field(description="fitted points averaged into the GPU throughput plateau")
    delta: float = Field(ge=0, lt=1, description="relative distance δ from the plateau or best")
    date: str = Field(description="when the fit ran (ISO date)")
    max_iteration_s: PositiveFloat | None = Field(
        None, description="latency cap on one CPU iteration, if the CPU limit was capped")
    iteration_context: PositiveInt | None = Field(
        None, description="context tokens per request assumed with max_iteration_s")

    @field_validator("date", mode="before")
    @classmethod
    def _date_to_str(cls, value: Any) -> Any:
        return value.isoformat() if isinstance(value, dt.date) else value


class Controls(StrictModel):
    """Profile-guided controls (paper §4.3); filled by the fits, optional here."""

    route_p: NonNegativeInt | None = Field(
        None, description="P of Eq. 5: above it a CPU batch is Fused-Assist")
    route_f: NonNegativeInt | None = Field(
        None, description="F of Eq. 5: up to it Full-CPU; (P, F) is (0, 0) or F < P")
    gpu_token_limit: PositiveInt | None = Field(None, description="GPU batched-token limit")
    cpu_batch_limit: PositiveInt | None = Field(None, description="CPU decode batch limit")
    fit: ControlsFit | None = Field(None, description="how the controls were fitted")

    @model_validator(mode="after")
    def _legal_thresholds(self) -> Controls:
        p, f = self.route_p, self.route_f
        if p is not None and f is not None and not legal_thresholds(p, f):
            raise ValueError(f"(route_p, route_f) = ({p}, {f}) must be (0, 0) or F < P")
        return self


class Profile(StrictModel):
    """Everything the simulator knows about one (box, model, parallelism)."""

    format: Literal["dualpace-profile/1"] = Field(description="the file format and its version")
    provenance: Provenance = Field(description="where the numbers came from")
    model: ModelShape = Field(description="the model's shape")
    box: Box = Field(description="the serving node")
    block_size: PositiveInt = Field(16, description="KV block size in tokens")
    gpu: GpuCosts = Field(description="GPU-main primitives")
    cpu: CpuCosts = Field(description="CPU decode primitives")
    assist: AssistCosts = Field(description="Dense Assist primitives and constants")
    link: LinkCosts = Field(description="the PCIe link")
    neo: NeoCosts = Field(default_factory=NeoCosts, description="NEO's own constant")
    controls: Controls | None = Field(
        None, description="fitted scheduler controls; a scenario fits them when absent")

    def save(self, path: str | Path) -> None:
        """Write YAML (or JSON when the suffix is ``.json``)."""
        path = Path(path)
        data = self.model_dump(mode="json", exclude_none=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(data, indent=1) + "\n")
            return
        header = f"# {PROFILE_FORMAT}: {self.box.name} / {self.model.name}"
        if self.provenance.method == "roofline":
            header += " (roofline-derived from published specs; NOT a measurement)"
        body = yaml.dump(data, Dumper=_DUMPER, sort_keys=False, default_flow_style=None, width=100)
        path.write_text(f"{header}\n{body}")


_M = TypeVar("_M", bound=BaseModel)


def _one_line(source: str, err: ValidationError) -> str:
    errors = err.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "<top level>"
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def validate_file_data(model: type[_M], data: Any, source: str) -> _M:
    """Validate parsed file contents, turning pydantic's report into a one-line ProfileError."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ProfileError(_one_line(source, err)) from None


def read_file_data(path: str | Path) -> Any:
    """Parse a YAML (or ``.json``) file; a file that is not a readable, bounded UTF-8 text and
    syntax errors become a ProfileError naming the file (`dualpace_sim.common.inputs`)."""
    path = Path(path)
    try:
        text = read_text(path)
        if path.suffix != ".json":
            return load_yaml(text, str(path))
    except InputFileError as err:
        raise ProfileError(str(err)) from None
    # Not through YAML: YAML 1.1 reads JSON's 3e-06 as a string.
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{path}: invalid JSON (line {err.lineno}): {err.msg}") from None
    except RecursionError:
        raise ProfileError(f"{path}: nested too deeply to be a profile or spec") from None


def load_profile(path: str | Path) -> Profile:
    return validate_file_data(Profile, read_file_data(path), str(path))


# --- plausibility of magnitudes ----------------------------------------------------------------
# A profile that validates can still be in the wrong unit (milliseconds where seconds are expected
# make every GPU layer 1000x slower). No real layer-level primitive takes 10 s at any profiled
# shape, or 0.1 s at the smallest one; no whole-model stage takes 100 s, or 1 s at its smallest.
_PER_LAYER_TABLES = (
    "gpu.pre_attn", "gpu.post_attn", "gpu.prefill_attn", "gpu.decode_attn",
    "cpu.pre_attn", "cpu.decode_attn", "cpu.post_attn", "cpu.assist_write", "cpu.assist_read",
    "cpu.hidden_write", "assist.g_p", "assist.g_lA", "assist.g_lS",
)
_WHOLE_MODEL_TABLES = ("gpu.pre_layer", "gpu.post_layer", "cpu.pre_layer", "cpu.post_layer")
_CONSTANTS = (
    "gpu.iteration_overhead_s", "gpu.eager_layer_s", "gpu.eager_layer_beside_cpu_s",
    "cpu.iteration_overhead_s", "assist.q.p",
    "assist.q.lA", "assist.q.lS", "assist.o.p", "assist.o.lA", "assist.o.lS", "assist.poll_s",
    "link.latency_s", "neo.launch_s", "neo.eager_decode_layer_s", "neo.eager_prefill_layer_s",
)
PER_LAYER_MAX_S, PER_LAYER_FIRST_MAX_S = 10.0, 0.1
WHOLE_MODEL_MAX_S, WHOLE_MODEL_FIRST_MAX_S = 100.0, 1.0
CONSTANT_MAX_S = 1.0
# A table whose largest shape costs less than a quarter of its smallest has its values reversed:
# a cost grows with its shape, and measurement noise (a warm-up, a busy box) never makes it fall
# that far, though it can make a few-point table of a tiny model fall somewhat.
REVERSED_RATIO = 4.0
MIN_LINK_BYTES_PER_S = 1e6


def _get(profile: Profile, dotted: str) -> Any:
    obj: Any = profile
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def magnitude_problems(profile: Profile) -> list[str]:
    """``field: message`` for every value whose magnitude says it is not in seconds (bytes/s),
    and for every table that is all zero or costs less at its largest shape than at its smallest
    (reversed values): such a profile would simulate, with latencies that mean nothing."""
    problems = []

    def check_table(name: str, limit: float, first_limit: float, what: str) -> None:
        table = _get(profile, name)
        if isinstance(table, Table1D):
            field, values = f"{name}.y", list(zip(table.x, table.y, strict=True))
            first, first_at = table.y[0], f"x={table.x[0]:g}"
            last, last_at = table.y[-1], f"x={table.x[-1]:g}"
            where = {v: f"x={x:g}" for x, v in values}
            peak = max(table.y)
        else:
            field = f"{name}.z"
            first, first_at = table.z[0][0], f"(x={table.x[0]:g}, y={table.y[0]:g})"
            last, last_at = table.z[-1][-1], f"(x={table.x[-1]:g}, y={table.y[-1]:g})"
            peak, where = -1.0, {}
            for i, row in enumerate(table.z):
                for j, v in enumerate(row):
                    if v > peak:
                        peak, where = v, {v: f"(x={table.x[i]:g}, y={table.y[j]:g})"}
        if peak == 0:
            problems.append(f"{field}: every value is 0; a measured cost is > 0 (re-profile, or "
                            "take the table from a roofline profile)")
        elif last * REVERSED_RATIO < first:
            problems.append(
                f"{field}: falls from {first:g} at the smallest shape {first_at} to {last:g} at "
                f"the largest {last_at}; a cost grows with its shape (are the values reversed?)")
        elif peak > limit:
            problems.append(
                f"{field}: {peak:g} at {where[peak]} is implausible for {what} (over {limit:g} s); "
                "expected seconds (is it in milliseconds?)")
        elif first > first_limit:
            problems.append(
                f"{field}: {first:g} at the smallest shape {first_at} is implausible for {what} "
                f"(over {first_limit:g} s); expected seconds (is it in milliseconds?)")

    for name in _PER_LAYER_TABLES:
        check_table(name, PER_LAYER_MAX_S, PER_LAYER_FIRST_MAX_S, "one layer")
    for name in _WHOLE_MODEL_TABLES:
        check_table(name, WHOLE_MODEL_MAX_S, WHOLE_MODEL_FIRST_MAX_S, "a whole-model stage")
    for name in _CONSTANTS:
        value = _get(profile, name)
        if value is not None and value > CONSTANT_MAX_S:
            problems.append(f"{name}: {value:g} is implausible (over {CONSTANT_MAX_S:g} s); "
                            "expected seconds (is it in milliseconds?)")
    for name in ("link.h2d_bytes_per_s", "link.d2h_bytes_per_s"):
        value = _get(profile, name)
        if value < MIN_LINK_BYTES_PER_S:
            problems.append(f"{name}: {value:g} is implausibly slow; expected bytes per second "
                            "(is it in GB/s?)")
    return problems


def check_magnitudes(profile: Profile, source: str) -> None:
    """Raise a one-line ProfileError naming file and field when a value is in the wrong unit."""
    problems = magnitude_problems(profile)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ProfileError(f"{source}: {problems[0]}{more}")
