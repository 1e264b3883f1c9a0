"""Workloads: the registry of public traces and their download cache, trace loaders, the
embedded default length distributions, named length distributions fitted to given statistics,
the rescaling of a trace's lengths, arrival processes and the scenario's ``workload:`` section,
all ending in a list of :class:`RequestSpec`."""

from dualpace_sim.workload.arrivals import poisson_arrivals, trace_arrivals
from dualpace_sim.workload.build import WorkloadConfig, build_requests, with_rate
from dualpace_sim.workload.default import LengthTable, load_length_table, sample_lengths
from dualpace_sim.workload.distributions import LengthDistribution, draw_lengths, fit
from dualpace_sim.workload.fetch import trace_path
from dualpace_sim.workload.registry import TRACES, TraceEntry, trace_entry
from dualpace_sim.workload.rescale import rescale_to_mean
from dualpace_sim.workload.spec import RequestSpec, WorkloadError
from dualpace_sim.workload.traces import (
    TraceRows,
    load_azure_trace,
    load_mooncake_trace,
    load_vidur_trace,
)

__all__ = [
    "LengthDistribution",
    "LengthTable",
    "RequestSpec",
    "TRACES",
    "TraceEntry",
    "TraceRows",
    "WorkloadConfig",
    "WorkloadError",
    "build_requests",
    "draw_lengths",
    "fit",
    "load_azure_trace",
    "load_length_table",
    "load_mooncake_trace",
    "load_vidur_trace",
    "poisson_arrivals",
    "rescale_to_mean",
    "sample_lengths",
    "trace_arrivals",
    "trace_entry",
    "trace_path",
    "with_rate",
]
