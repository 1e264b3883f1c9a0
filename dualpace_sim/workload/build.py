"""The scenario's ``workload:`` section and the request list it describes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dualpace_sim.workload.arrivals import poisson_arrivals, trace_arrivals
from dualpace_sim.workload.default import sample_lengths
from dualpace_sim.workload.distributions import LengthDistribution, draw_lengths
from dualpace_sim.workload.fetch import trace_path
from dualpace_sim.workload.registry import TRACES, trace_entry
from dualpace_sim.workload.rescale import rescale_to_mean
from dualpace_sim.workload.spec import RequestSpec, WorkloadError
from dualpace_sim.workload.traces import LOADERS, TraceRows

# A bound on a run's requests: each costs ~1 KB while simulated, and 2 million take hours; a
# typo such as 100000000 would otherwise exhaust memory after a minute instead of failing now.
MAX_REQUESTS = 2_000_000


class WorkloadConfig(BaseModel):
    """Where request lengths come from and how requests arrive.

    ``source``: ``default`` samples the embedded Azure length tables (works offline); ``azure``
    replays an Azure LLM Inference Trace 2023 file (``path``, or downloaded and cached when
    absent); ``vidur`` and ``mooncake`` replay a Vidur processed trace or a Mooncake JSON-lines
    trace at ``path``; ``trace`` replays the registered public trace named by ``trace`` (see
    `dualpace-sim traces list`), downloaded and cached on first use; ``synthetic`` draws
    ``num_requests`` lengths from the named distributions ``prompt`` and ``output``, each fitted
    to the mean, median or P99 it is given (independently of each other). Traces use their first
    ``num_requests`` rows; ``prompt_mean`` and ``output_mean`` rescale a trace's lengths to other
    means while keeping its shape. ``arrival: poisson`` offers ``rate`` req/s (normalized
    exponential gaps); ``arrival: trace`` replays the trace's timestamps with every gap multiplied
    by ``time_scale``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # `true` is no count

    source: Literal["default", "azure", "vidur", "mooncake", "trace", "synthetic"] = Field(
        "default", description=(
            "where lengths come from: `default` (embedded length tables, offline); `azure`, "
            "`vidur` or `mooncake` (a trace file at `path`; azure without path: the 2023 "
            "trace, downloaded); `trace` (a registered public trace named by `trace`); "
            "`synthetic` (drawn from the distributions `prompt` and `output`)"))
    prompt: LengthDistribution | None = Field(None, description=(
        "source synthetic (required): the distribution of prompt lengths"))
    output: LengthDistribution | None = Field(None, description=(
        "source synthetic (required): the distribution of output lengths (max_tokens)"))
    trace: str = Field("conv", description=(
        "sources default and azure: `conv` or `code`; source trace: a registered trace's name "
        "(`dualpace-sim traces list`)"))
    path: str | None = Field(None, description=(
        "trace file for azure, vidur or mooncake, relative to the scenario file"))
    num_requests: int = Field(2000, ge=1, le=MAX_REQUESTS, description=(
        "requests: the first N of a trace (after `skip`), or N sampled lengths (at most "
        "2,000,000)"))
    skip: int = Field(0, ge=0, description=(
        "trace sources: start after the trace's first `skip` requests, so a study can take "
        "another window of the same trace"))
    arrival: Literal["poisson", "trace"] = Field("poisson", description=(
        "`poisson`: exponential gaps normalized to `rate`, fixed seed; `trace`: the trace's own "
        "timestamps"))
    rate: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "offered load, requests per second (arrival: poisson)"))
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "multiply every gap between trace timestamps by this (arrival: trace)"))
    seed: int = Field(0, ge=0, description="seed of the arrival gaps and of sampled lengths")
    prompt_mean: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "rescale the prompt lengths of a trace (or of source default) so that their mean over "
        "the requests is this: every length times one factor, rounded, which keeps the "
        "trace's shape; before the clipping below"))
    output_mean: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "rescale the output lengths likewise to this mean"))
    max_prompt_tokens: int | None = Field(None, ge=1, description=(
        "clip every prompt to this many tokens"))
    max_output_tokens: int | None = Field(None, ge=1, description=(
        "clip every output (its max_tokens) to this many tokens"))

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadConfig:
        """Reject settings that would be silently ignored, so a typo'd study fails loudly."""
        given = self.model_fields_set
        synthetic = self.source == "synthetic"
        if synthetic and (self.prompt is None or self.output is None):
            missing = "prompt" if self.prompt is None else "output"
            raise ValueError(f"source: synthetic needs {missing}, a length distribution such as "
                             f"{{distribution: lognormal, mean: 1000, p99: 6000}}")
        if not synthetic and (self.prompt is not None or self.output is not None):
            key = "prompt" if self.prompt is not None else "output"
            raise ValueError(f"{key} (a length distribution) applies to source: synthetic; to "
                             f"change a trace's mean length use {key}_mean")
        if synthetic and (self.prompt_mean is not None or self.output_mean is not None):
            key = "prompt" if self.prompt_mean is not None else "output"
            raise ValueError(f"{key}_mean rescales a trace; with source: synthetic give the "
                             f"mean in {key}.mean")
        if synthetic and (self.path is not None or "trace" in given):
            raise ValueError("source: synthetic draws its lengths from prompt and output; drop "
                             f"{'path' if self.path is not None else 'trace'}")
        if self.arrival == "poisson" and self.rate is None:
            raise ValueError("arrival: poisson needs rate (requests per second, > 0)")
        if self.arrival == "poisson" and "time_scale" in given:
            raise ValueError("time_scale applies to arrival: trace; with poisson set rate")
        if self.arrival == "trace" and self.rate is not None:
            raise ValueError("rate applies to arrival: poisson; with trace arrivals use time_scale")
        if self.source in ("default", "synthetic") and self.arrival == "trace":
            raise ValueError(f"source: {self.source} has no timestamps; use arrival: poisson")
        if self.skip and self.source in ("default", "synthetic"):
            raise ValueError(f"skip picks a window of a trace file; source: {self.source} "
                             "samples lengths, so drop skip (or change seed)")
        if self.source == "default" and self.path is not None:
            raise ValueError("source: default takes no path; use source: azure, vidur or "
                             "mooncake")
        if self.source in ("vidur", "mooncake") and self.path is None:
            raise ValueError(f"source: {self.source} needs path (a {self.source} trace file)")
        if self.source == "trace" and self.path is not None:
            raise ValueError("source: trace replays a registered trace named by trace; for a "
                             "file use source: azure, vidur or mooncake with path")
        if self.source == "trace" and self.trace not in TRACES:
            raise ValueError(f"source: trace needs trace: one of {', '.join(TRACES)}")
        if self.source in ("default", "azure") and self.trace not in ("conv", "code"):
            raise ValueError(f"trace: {self.trace!r} is not conv or code; to replay a registered "
                             "trace use source: trace")
        if self.path is not None and "trace" in given:
            raise ValueError("trace (conv/code) picks a built-in or downloaded trace; with path "
                             "the file decides, so drop trace or path")
        return self


def with_rate(cfg: WorkloadConfig, rate: float) -> WorkloadConfig:
    """A copy of ``cfg`` offering ``rate`` req/s; same seed, so only the load changes."""
    if cfg.arrival != "poisson":
        raise WorkloadError("a rate sweep needs workload.arrival: poisson")
    return WorkloadConfig.model_validate({**cfg.model_dump(exclude_unset=True), "rate": rate})


def build_requests(cfg: WorkloadConfig, base_dir: Path) -> list[RequestSpec]:
    """The requests ``cfg`` describes, sorted by arrival.

    Relative paths resolve against ``base_dir`` (the scenario file's folder). Arrivals and
    sampled lengths use independent streams spawned from ``cfg.seed``, so changing the source
    keeps the arrival times of a Poisson workload.
    """
    arrival_seed, length_seed = np.random.SeedSequence(cfg.seed).spawn(2)
    if cfg.source == "default":
        prompt, output = sample_lengths(
            cfg.trace, cfg.num_requests, np.random.default_rng(length_seed)
        )
        timestamps = None
    elif cfg.source == "synthetic":  # a stream each, so one distribution's change keeps the other
        prompt_rng, output_rng = map(np.random.default_rng, length_seed.spawn(2))
        prompt = draw_lengths(cfg.prompt, cfg.num_requests, prompt_rng)
        output = draw_lengths(cfg.output, cfg.num_requests, output_rng)
        timestamps = None
    else:
        rows = _load_trace(cfg, Path(base_dir))
        prompt, output, timestamps = rows.prompt_tokens, rows.output_tokens, rows.timestamps_s
    if cfg.arrival == "poisson":
        arrivals = poisson_arrivals(len(prompt), cfg.rate, arrival_seed)
    elif timestamps is None:
        raise WorkloadError(
            f"{rows.source}: no arrival times (no arrived_at column), so arrival: trace is "
            "impossible; use arrival: poisson with a rate"
        )
    else:
        arrivals = trace_arrivals(timestamps, cfg.time_scale)
    if cfg.prompt_mean is not None:
        prompt = rescale_to_mean(prompt, cfg.prompt_mean)
    if cfg.output_mean is not None:
        output = rescale_to_mean(output, cfg.output_mean)
    if cfg.max_prompt_tokens is not None:
        prompt = np.minimum(prompt, cfg.max_prompt_tokens)
    if cfg.max_output_tokens is not None:
        output = np.minimum(output, cfg.max_output_tokens)
    order = np.argsort(arrivals, kind="stable")
    return [
        RequestSpec(arrival_s=float(arrivals[i]), prompt_tokens=int(prompt[i]),
                    max_tokens=int(output[i]))
        for i in order
    ]


def _load_trace(cfg: WorkloadConfig, base_dir: Path) -> TraceRows:
    if cfg.source == "trace":
        path, fmt = trace_path(cfg.trace), trace_entry(cfg.trace).format
    elif cfg.path is None:  # source: azure, trace: conv/code
        path, fmt = trace_path(f"azure-2023-{cfg.trace}"), "azure"
    else:
        path, fmt = Path(cfg.path).expanduser(), cfg.source
        if not path.is_absolute():
            path = base_dir / path
    if not cfg.skip:
        return LOADERS[fmt](path, first_n=cfg.num_requests)
    rows = LOADERS[fmt](path, first_n=None)
    if len(rows) < cfg.skip + cfg.num_requests:
        raise WorkloadError(f"{path}: has {len(rows)} requests, fewer than skip {cfg.skip} plus "
                            f"num_requests {cfg.num_requests}; lower workload.skip or "
                            "workload.num_requests")
    window = slice(cfg.skip, cfg.skip + cfg.num_requests)
    stamps = rows.timestamps_s
    return TraceRows(None if stamps is None else stamps[window] - stamps[window][0],
                     rows.prompt_tokens[window], rows.output_tokens[window], rows.source)
