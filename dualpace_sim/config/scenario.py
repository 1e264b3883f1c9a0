"""The YAML scenario: schema, validation with one-line errors, and what a run is built from.

A scenario names the box (a calibration profile, or a roofline synthesized from a hardware spec
and a model), the workload, the policies and any scheduler overrides. Every error says which
file, which field and what is allowed, because users edit these files by hand.
"""

from __future__ import annotations

import difflib
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dualpace_sim.common.inputs import InputFileError, load_yaml, read_text
from dualpace_sim.config.budgets import GpuBudget, dualpace_budget, unequal_budget_note, with_budget
from dualpace_sim.config.overrides import merged
from dualpace_sim.core import SchedulerConfig, check_thresholds
from dualpace_sim.core.policies import POLICIES, POLICY_NAMES, PolicyConfig, policy_named
from dualpace_sim.costs import CostModel, ModelShape, Profile, load_profile, load_spec, synthesize
from dualpace_sim.costs.fit import fit_controls
from dualpace_sim.costs.profile import check_magnitudes
from dualpace_sim.workload import RequestSpec, WorkloadConfig, build_requests, with_rate

PolicyName = Literal[POLICY_NAMES]  # the registered policies (`core.policies`)

CONTROLS = ("route_p", "route_f", "gpu_token_limit", "cpu_batch_limit")


class ScenarioError(ValueError):
    """A scenario that cannot run; the message is one line naming file, field and fix."""


class RooflineSource(BaseModel):
    """A profile synthesized from published specs instead of read from a file (the roofline
    synthesizer, `dualpace_sim/costs/roofline.py`); never a measurement."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    hardware: str = Field(description="packaged spec name or path to a hardware spec YAML")
    model: str = Field(description="built-in model name or path to a HF config.json")
    host_kv_gib: float | None = Field(None, gt=0, description=(
        "host KV pool, GiB; default: host memory less the CPU's copy of the weights and an OS "
        "reserve"))
    gpu_mem_util: float = Field(0.9, gt=0, le=1, description=(
        "share of GPU memory for weights, workspaces and KV; the rest is left free"))


class SchedulerOverrides(BaseModel):
    """Anything left out comes from the profile (capacities, fitted controls) or the defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    gpu_kv_blocks: int | None = Field(None, ge=1, description=(
        "HBM KV capacity in blocks; default: the profile's gpu.kv_capacity_blocks"))
    host_kv_blocks: int | None = Field(None, ge=1, description=(
        "host KV capacity in blocks; default: the profile's cpu.kv_capacity_blocks"))
    gpu_max_rows: int = Field(256, ge=1, description="GPU row limit: requests in one GPU batch")
    gpu_token_limit: int | None = Field(None, ge=1, description=(
        "profiled GPU batched-token limit (paper §4.3); default: the profile's controls, else "
        "its fit"))
    gpu_hard_token_limit: int = Field(8192, ge=1, description=(
        "hard cap on tokens in one GPU batch"))
    staging_blocks: int = Field(512, ge=0, description=(
        "single-layer GPU staging blocks for Prefill-to-CPU copies, per GPU round"))
    cpu_batch_limit: int | None = Field(None, ge=1, description=(
        "CPU decode batch limit (paper §4.3); default: the profile's controls, else its fit"))
    host_max_requests: int = Field(4096, ge=1, description=(
        "host decode-admission limit: requests owned by, or bound for, the CPU engine at once"))
    route_p: int | None = Field(None, ge=0, description=(
        "P of Eq. 5: a CPU batch larger than P is Fused-Assist; default: the profile's "
        "controls, else its fit (Algorithm 1)"))
    route_f: int | None = Field(None, ge=0, description=(
        "F of Eq. 5: a CPU batch up to F is Full-CPU, one up to P Split-Final; (P, F) is "
        "(0, 0) or 0 <= F < P; default as for route_p"))


class VllmSection(BaseModel):
    """vLLM v1's two batch limits; required, because vLLM's defaults differ by version and GPU
    (BASELINES.md §B0), and a comparison must say which it used."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    max_num_batched_tokens: int = Field(ge=1, description=(
        "tokens per step, shared by decodes and prefill chunks"))
    max_num_seqs: int = Field(ge=1, description="running requests at most")


class NeoSection(BaseModel):
    """NEO's limits; defaults are NEO's own (swiftllm/engine_config.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    max_batch_size: int = Field(512, ge=1, description="requests in one iteration")
    max_tokens_in_batch: int = Field(3072, ge=1, description=(
        "tokens in one iteration; NEO prefills whole prompts, so it must exceed the longest"))
    itm_blocks: int | None = Field(None, ge=0, description=(
        "staging pool for CPU-bound prefills, blocks; default: the GPU pool's size, as in NEO"))
    launch_s: float | None = Field(None, ge=0, description=(
        "CPU launch term lnch_T, s; default: the profile's neo.launch_s"))
    linr_s_threshold: int = Field(128, ge=0, description=(
        "sub-batch width (tokens) kept when trimming CPU prefills"))
    swap_in_fraction: float = Field(0.95, gt=0, le=1, description=(
        "swap in only while the GPU pool stays at or below this share"))


class SweepSpec(BaseModel):
    """What a `dualpace-sim sweep` runs: every policy at every offered rate, for every
    combination of the grid's values, once per seed."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    rates: list[float] = Field(min_length=2, description="offered req/s, strictly increasing")
    grid: dict[str, list[float | int | str | bool | None]] = Field(
        default_factory=dict, description=(
            "other fields to sweep: a dotted scenario key (`scheduler.host_kv_blocks`) -> its "
            "values; every combination runs at every rate, and sweep.csv and sustainable.csv "
            "get a column per key"))
    seeds: list[int] | None = Field(None, min_length=1, description=(
        "workload seeds: every point runs once per seed, and sweep_ci.csv and sustainable.csv "
        "give bootstrap 95% confidence intervals over them; default: the workload's own seed"))

    @model_validator(mode="after")
    def _increasing(self) -> SweepSpec:
        if any(r <= 0 for r in self.rates):
            raise ValueError("rates must all be > 0 (requests per second)")
        if any(b <= a for a, b in zip(self.rates, self.rates[1:], strict=False)):
            raise ValueError("rates must be strictly increasing")
        for key, values in self.grid.items():
            if key in ("workload.rate", "workload.seed") or key.startswith("sweep"):
                raise ValueError(f"grid: {key} cannot be a grid key; sweep rates with rates "
                                 f"and seeds with seeds")
            if not values or len(set(map(repr, values))) != len(values):
                raise ValueError(f"grid: {key} needs distinct values, at least one")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self


# The percentiles reported for every latency unless a scenario's metrics.percentiles says
# otherwise: those of vLLM's serving benchmark (`--metric-percentiles`), plus the median.
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


class MetricsSection(BaseModel):
    """How latencies are summarized (summary.json, sweep.csv)."""

    model_config = ConfigDict(extra="forbid")
    percentiles: list[float] = Field(
        default_factory=lambda: list(DEFAULT_PERCENTILES), min_length=1, description=(
            "percentiles reported for TTFT, TPOT, ITL and end-to-end latency, as "
            "p<P>_<latency>_s (vLLM's benchmark: --metric-percentiles)"))

    @model_validator(mode="after")
    def _in_range(self) -> MetricsSection:
        if any(not 0 < p <= 100 for p in self.percentiles):
            raise ValueError("percentiles must each be in (0, 100]")
        return self


class Targets(BaseModel):
    """Latency targets for the sustainable request rate (paper defaults)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    normalized_latency_s: float = Field(1.0, gt=0, description=(
        "mean over requests of end-to-end latency / output tokens, s per token"))
    p99_ttft_s: float = Field(5.0, gt=0, description="99th percentile time to first token, s")
    p99_itl_s: float = Field(1.5, gt=0, description=(
        "99th percentile of all client-observed inter-token gaps, s"))
    p99_tpot_s: float = Field(1.0, gt=0, description=(
        "99th percentile over requests of (e2e - TTFT) / (output tokens - 1), s"))


class Scenario(BaseModel):
    """A what-if study: the box (a calibration profile, or a roofline synthesized from specs),
    the workload, the policies to compare and any overrides. Give exactly one of `profile` and
    `roofline`."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: `true` is no count
    name: str = Field("scenario", description="the study's name, in progress bars and summaries")
    description: str = Field("", description="free text for the reader")
    profile: str | None = Field(None, description=(
        "calibration profile (YAML or JSON), relative to this file"))
    roofline: RooflineSource | None = Field(None, description=(
        "synthesize the profile from a hardware spec and a model instead"))
    policies: list[PolicyName] = Field(
        default_factory=lambda: ["dualpace"], min_length=1,
        description="the policies to simulate, each once, all on the same profile",
    )
    workload: WorkloadConfig = Field(description="the requests: their lengths and arrivals")
    scheduler: SchedulerOverrides = Field(default_factory=SchedulerOverrides, description=(
        "DualPace's scheduler limits and controls"))
    vllm: VllmSection | None = Field(None, description=(
        "vLLM's batch limits; required when policies has vllm"))
    neo: NeoSection = Field(default_factory=NeoSection, description="NEO's limits")
    shared_gpu_budget: PolicyName | None = Field(None, description=(
        "give every policy this policy's GPU batch budget, so that a comparison differs in "
        "scheduling only: its tokens per GPU batch (DualPace: scheduler.gpu_token_limit as "
        "resolved, capped by gpu_hard_token_limit; vLLM: vllm.max_num_batched_tokens; NEO: "
        "neo.max_tokens_in_batch) and its requests per GPU batch (scheduler.gpu_max_rows, "
        "vllm.max_num_seqs, neo.max_batch_size) replace the others'; default: each its own, "
        "and `run` and `sweep` print a note when they differ"))
    sweep: SweepSpec | None = Field(None, description=(
        "offered rates; required by `dualpace-sim sweep`, ignored by `run`"))
    targets: Targets = Field(default_factory=Targets, description=(
        "latency targets for the sustainable request rate; the goodput counts the requests "
        "meeting the TTFT, TPOT and normalized-latency ones on their own values"))
    metrics: MetricsSection = Field(default_factory=MetricsSection, description=(
        "which latency percentiles to report"))

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if (self.profile is None) == (self.roofline is None):
            raise ValueError("give exactly one of profile (a calibration file) or roofline "
                             "(hardware + model)")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("each policy may appear once")
        if "vllm" in self.policies and self.vllm is None:
            raise ValueError("policy vllm needs a vllm section with max_num_batched_tokens and "
                             "max_num_seqs")
        if self.shared_gpu_budget is not None and self.shared_gpu_budget not in self.policies:
            raise ValueError(f"shared_gpu_budget: {self.shared_gpu_budget} is not one of the "
                             f"policies ({', '.join(self.policies)}); name one of them")
        return self


@dataclass
class ControlChoice:
    value: int
    source: str  # "scenario", "profile controls" or "fit of the profile"


@dataclass
class LoadedScenario:
    """Everything one `run` needs, resolved and validated."""

    path: Path
    spec: Scenario
    profile: Profile
    profile_source: str
    cost: CostModel
    config: SchedulerConfig  # DualPace's; the baselines' configs derive from the same pools
    controls: dict[str, ControlChoice]
    requests: list[RequestSpec]

    def policy_config(self, policy: str) -> PolicyConfig:
        """The policy's configuration over the same KV pools and block size, with its GPU
        batch budget (its own, or the shared one)."""
        entry, budget = policy_named(policy), self.gpu_budget(policy)
        return entry.config(self.config, budget.tokens, budget.rows,
                            getattr(self.spec, entry.section))

    def gpu_budget(self, policy: str) -> GpuBudget:
        """What one GPU batch of ``policy`` may carry as it runs: the shared budget when the
        scenario names one (DualPace's config already carries it), else its own."""
        if policy == "dualpace":
            return dualpace_budget(self.config)
        shared = self.spec.shared_gpu_budget
        if shared is not None and shared != policy:
            return self.gpu_budget(shared)
        return section_budget(self.spec, policy)

    def budget_note(self) -> str | None:
        """The note `run` and `sweep` print when the policies' GPU batch budgets differ."""
        return unequal_budget_note({p: self.gpu_budget(p) for p in self.spec.policies})

    @property
    def neo_launch_s(self) -> float:
        given = self.spec.neo.launch_s
        return self.cost.neo_launch_s if given is None else given


def section_budget(spec: Scenario, policy: str) -> GpuBudget:
    """A baseline's own GPU batch budget, from its section of the scenario."""
    registered = POLICIES[policy]
    section = getattr(spec, registered.section)
    tokens, rows = registered.budget
    return GpuBudget(getattr(section, tokens), getattr(section, rows))


def _section_model(loc: tuple) -> type[BaseModel] | None:
    """The model whose keys are allowed at ``loc`` (a validation error's location, its last
    part the offending key): Scenario, or the section the path leads into."""
    model: type[BaseModel] | None = Scenario
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return None
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and
                      issubclass(c, BaseModel)), None)
    return model


def _unknown_key(loc: tuple) -> str:
    """'unknown key; did you mean X?', or the keys allowed there when nothing is close."""
    model = _section_model(loc)
    if model is None:
        return "unknown key"
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]}?"
    return f"unknown key; allowed here: {', '.join(known)} (docs: reference/scenario.md)"


def _format_validation(path: Path | str, err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(top level)"
    # A validator's message comes as "Value error, ..."; the prefix says nothing to a user.
    msg = first["msg"].removeprefix("Value error, ")
    value = first.get("input")
    if first["type"] == "extra_forbidden":
        msg = _unknown_key(first["loc"])
    elif first["type"] == "literal_error":
        msg = f"{msg} (got {value!r})"
    elif "input" in first and first["type"] != "missing" and not isinstance(value, dict):
        msg = f"{msg} (got {value!r})"  # a whole section (a mapping) is not echoed
    return f"{path}: {field}: {msg}"


def _dotted(changes: Mapping, prefix: str = "") -> list[str]:
    """``{"scheduler": {"host_kv_blocks": 8}}`` -> ``["scheduler.host_kv_blocks=8"]``."""
    out = []
    for key, value in changes.items():
        if isinstance(value, Mapping) and value:
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={value!r}")
    return out


def read_scenario(path: Path, changes: Mapping | None = None) -> Scenario:
    """Parse and validate the YAML file without loading anything it refers to.

    ``changes`` (the scenario's own keys, nested like the YAML) are applied before validation,
    so a changed field is checked exactly as if it had been written in the file; an error then
    names the changes as well as the file.
    """
    try:
        raw = load_yaml(read_text(path, "scenario file"), str(path))
    except InputFileError as e:
        raise ScenarioError(str(e)) from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: expected a mapping of scenario fields at the top level")
    where = path
    if changes:
        raw = merged(raw, changes)
        where = f"{path} with {', '.join(_dotted(changes))}"
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(_format_validation(where, e)) from None


def _resolve(base: Path, name: str) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() else base / p


def _load_profile(path: Path, spec: Scenario) -> tuple[Profile, str]:
    base = path.parent
    if spec.profile is not None:
        ppath = _resolve(base, spec.profile)
        if not ppath.exists():
            raise ScenarioError(f"{path}: profile: file {ppath} does not exist; give a path "
                                "relative to the scenario file")
        try:
            profile = load_profile(ppath)
            check_magnitudes(profile, str(ppath))
        except ValueError as e:
            raise ScenarioError(f"{path}: profile: {e}") from None
        return profile, str(ppath)
    src = spec.roofline
    try:
        hw = src.hardware
        hw_spec = load_spec(_resolve(base, hw) if hw.endswith((".yaml", ".yml")) else hw)
        model = src.model
        shape = (ModelShape.from_hf_config(_resolve(base, model)) if model.endswith(".json")
                 else ModelShape.from_name(model))
        profile = synthesize(hw_spec, shape, gpu_mem_util=src.gpu_mem_util,
                             host_kv_gib=src.host_kv_gib)
    except (ValueError, OSError) as e:
        raise ScenarioError(f"{path}: roofline: {e}") from None
    return profile, f"roofline:{src.hardware}/{src.model}"


@functools.lru_cache(maxsize=16)
def _fitted(source: str, stamp: float, profile_json: str) -> dict[str, int]:
    """Fit the controls once per profile and process (sweep workers load many points)."""
    return fit_controls(Profile.model_validate_json(profile_json)).controls()


def _controls(spec: Scenario, profile: Profile, source: str) -> dict[str, ControlChoice]:
    """Each control from the scenario if given, else the profile's stored fit, else a fit of
    the profile computed now (paper §4.3: Algorithm 1, plateau and batch-limit fits)."""
    stored = profile.controls
    stamp = Path(source).stat().st_mtime if Path(source).is_file() else 0.0
    computed: dict[str, int] | None = None
    out = {}
    for name in CONTROLS:
        given = getattr(spec.scheduler, name)
        from_profile = getattr(stored, name, None) if stored is not None else None
        if given is not None:
            out[name] = ControlChoice(given, "scenario")
        elif from_profile is not None:
            out[name] = ControlChoice(from_profile, "profile controls")
        else:
            if computed is None:
                computed = _fitted(source, stamp, profile.model_dump_json())
            out[name] = ControlChoice(computed[name], "fit of the profile")
    return out


def load_scenario(
    path: Path | str,
    rate: float | None = None,
    changes: Mapping | None = None,
    profile: Profile | None = None,
) -> LoadedScenario:
    """Read, validate and resolve a scenario.

    `rate` overrides the offered load (sweeps); `changes` overrides fields as
    :func:`read_scenario` describes (what-if studies, e.g. ``{"scheduler": {"host_kv_blocks":
    15360}}``); `profile` replaces the scenario's calibration profile with one built in code,
    e.g. synthesized from a changed hardware spec, which a YAML field cannot name.
    """
    path = Path(path)
    spec = read_scenario(path, changes)
    if rate is not None:
        try:
            spec = spec.model_copy(update={"workload": with_rate(spec.workload, rate)})
        except ValueError as e:
            raise ScenarioError(f"{path}: workload: {e}") from None
    if profile is None:
        profile, source = _load_profile(path, spec)
    else:
        source = f"in memory:{profile.provenance.method}:{profile.box.name}/{profile.model.name}"
        try:
            check_magnitudes(profile, source)
        except ValueError as e:
            raise ScenarioError(f"{path}: the profile given in its place: {e}") from None
    try:
        controls = _controls(spec, profile, source)
    except ValueError as e:  # FitError: a profile that validates but cannot be fitted
        raise ScenarioError(f"{path}: profile: {source}: cannot fit the controls it lacks: {e}; "
                            "give them under scheduler") from None
    s = spec.scheduler
    for tier, field_name, given in (("gpu", "gpu_kv_blocks", s.gpu_kv_blocks),
                                    ("cpu", "host_kv_blocks", s.host_kv_blocks)):
        if given is None and getattr(profile, tier).kv_capacity_blocks < 1:
            raise ScenarioError(
                f"{path}: profile: {source}: {tier}.kv_capacity_blocks is 0, so this box has no "
                f"KV pool there; set scheduler.{field_name} or re-profile with a KV budget")
    try:
        check_thresholds(controls["route_p"].value, controls["route_f"].value)
        config = SchedulerConfig(
            gpu_kv_blocks=s.gpu_kv_blocks or profile.gpu.kv_capacity_blocks,
            host_kv_blocks=s.host_kv_blocks or profile.cpu.kv_capacity_blocks,
            block_size=profile.block_size,
            gpu_max_rows=s.gpu_max_rows,
            gpu_token_limit=controls["gpu_token_limit"].value,
            gpu_hard_token_limit=s.gpu_hard_token_limit,
            staging_blocks=s.staging_blocks,
            cpu_batch_limit=controls["cpu_batch_limit"].value,
            host_max_requests=s.host_max_requests,
            route_p=controls["route_p"].value,
            route_f=controls["route_f"].value,
        )
    except ValueError as e:
        raise ScenarioError(f"{path}: scheduler: {e}") from None
    shared = spec.shared_gpu_budget
    if shared in ("vllm", "neo"):  # DualPace runs with that baseline's budget
        budget = section_budget(spec, shared)
        config = with_budget(config, budget)
        controls["gpu_token_limit"] = ControlChoice(budget.tokens, f"shared_gpu_budget: {shared}")
    try:
        requests = build_requests(spec.workload, path.parent)
    except ValueError as e:
        raise ScenarioError(f"{path}: workload: {e}") from None
    loaded = LoadedScenario(path, spec, profile, source, CostModel(profile), config, controls,
                            requests)
    _check_fits(path, requests, loaded)
    return loaded


def _check_fits(path: Path, requests: list[RequestSpec], loaded: LoadedScenario) -> None:
    """Refuse up front a request that some policy of the scenario could never finish, rather
    than letting that run stall (`dualpace_sim.core.servable`: DualPace's finish-peak must fit
    the host pool, vLLM's HBM, and NEO must stage its prompt and swap it back in)."""
    policies = [(p, POLICIES[p], loaded.policy_config(p)) for p in loaded.spec.policies]
    shared = loaded.spec.shared_gpu_budget
    for _, registered, config in policies:  # pools that refuse every request: say so first
        reason = registered.pool_refusal and registered.pool_refusal(config)
        if reason is not None:
            raise ScenarioError(f"{path}: scheduler: {reason}")
    for i, r in enumerate(requests):
        for policy, registered, config in policies:
            reason = registered.refusal(config, r.prompt_tokens, r.max_tokens)
            if reason is not None:
                if shared not in (None, policy):
                    reason += (f" ({policy}'s GPU batch budget is {shared}'s here, from "
                               "shared_gpu_budget)")
                raise ScenarioError(f"{path}: workload: request {i} {reason}")
