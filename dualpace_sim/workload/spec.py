"""The simulator's per-request input and the workload package's error type."""

from __future__ import annotations

from dataclasses import dataclass


class WorkloadError(ValueError):
    """A workload could not be built; the message is one line naming the input and the fix.

    A ValueError so that callers validating a scenario can treat it like any other bad value.
    """


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the simulator receives it.

    ``max_tokens`` is the generation cap; in trace replay it is the trace's output length, so a
    request that runs to completion produces exactly the trace's number of tokens.
    """

    arrival_s: float
    prompt_tokens: int
    max_tokens: int
