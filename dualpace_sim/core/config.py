"""Limits the DualPace rounds schedule under; one flat, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from .routing import check_thresholds


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler limits. Capacities are in KV blocks of `block_size` tokens."""

    gpu_kv_blocks: int
    host_kv_blocks: int
    block_size: int = 16
    gpu_max_rows: int = 256  # GPU row limit: requests in one GPU batch
    gpu_token_limit: int = 1024  # profiled batched-token limit (paper §4.3)
    gpu_hard_token_limit: int = 8192  # hard cap on tokens in one GPU batch
    staging_blocks: int = 512  # single-layer GPU staging blocks for Prefill-to-CPU per round
    cpu_batch_limit: int = 256  # profiled CPU decode batch limit
    host_max_requests: int = 4096  # host decode-admission limit: CPU-owned requests at once
    route_p: int = 32  # largest CPU-local batch for post-attention stages
    route_f: int = 16  # largest CPU-local batch for the post-layer

    def __post_init__(self) -> None:
        for name in (
            "gpu_kv_blocks", "host_kv_blocks", "block_size", "gpu_max_rows", "gpu_token_limit",
            "gpu_hard_token_limit", "cpu_batch_limit", "host_max_requests",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"scheduler.{name} must be >= 1, got {getattr(self, name)}")
        if self.staging_blocks < 0:
            raise ValueError(f"scheduler.staging_blocks must be >= 0, got {self.staging_blocks}")
        check_thresholds(self.route_p, self.route_f)

    @property
    def max_request_blocks(self) -> int:
        """The pool a request's finish-peak must fit: the host's, where a CPU-owned request
        may finish."""
        return self.host_kv_blocks

    @property
    def gpu_batch_tokens(self) -> int:
        """Tokens one GPU batch may carry: the tighter of the profiled and the hard limit."""
        return min(self.gpu_token_limit, self.gpu_hard_token_limit)

    @property
    def largest_cpu_batch(self) -> int:
        """C in the paper: the largest CPU decode batch the CPU engine can form."""
        return min(self.cpu_batch_limit, self.host_max_requests)
