"""The up-front check: requests a policy can never finish on its pools, whatever the timing.

A scenario is refused before it runs when one of its requests fails here, and only then; the
core's admission rules (docs/liveness.md) guarantee that everything these checks let through
finishes under any interleaving, which the liveness property tests assert for each policy.
Each function gives the reason as a phrase naming the scenario field to change, or None.
"""

from __future__ import annotations

from .config import SchedulerConfig
from .neo import NeoConfig
from .request import blocks_for
from .vllm import VllmConfig


def dualpace_refusal(config: SchedulerConfig, prompt: int, max_tokens: int) -> str | None:
    """DualPace finishes a request whose finish-peak fits the host pool: larger than HBM it
    still finishes on the CPU engine."""
    peak = blocks_for(prompt + max_tokens, config.block_size)
    if peak > config.host_kv_blocks:
        return (f"needs {peak} KV blocks at its finish-peak but scheduler.host_kv_blocks is "
                f"{config.host_kv_blocks}; set workload.max_prompt_tokens / max_output_tokens "
                "or enlarge scheduler.host_kv_blocks")
    return None


def vllm_refusal(config: VllmConfig, prompt: int, max_tokens: int) -> str | None:
    """vLLM has no host tier: the finish-peak must fit HBM."""
    peak = blocks_for(prompt + max_tokens, config.block_size)
    if peak > config.gpu_kv_blocks:
        return (f"needs {peak} KV blocks at its finish-peak (vLLM has no host tier) but "
                f"scheduler.gpu_kv_blocks is {config.gpu_kv_blocks}; set "
                "workload.max_prompt_tokens / max_output_tokens or enlarge "
                "scheduler.gpu_kv_blocks")
    return None


def neo_pool_refusal(config: NeoConfig) -> str | None:
    """NEO keeps one HBM pool's worth of the host pool for swap-outs and admits a prompt, to
    either engine, only while the rest could hold the CPU queue and it (NEO's cpu_threshold,
    host minus GPU blocks): a host pool no larger than HBM admits nothing at all."""
    host, gpu = config.host_kv_blocks, config.gpu_kv_blocks
    if host > gpu:
        return None
    return (f"NEO needs a host KV pool larger than the HBM pool: it keeps one HBM pool's worth "
            f"of host blocks for swap-outs and admits prompts only into the rest, "
            f"scheduler.host_kv_blocks - scheduler.gpu_kv_blocks = {host} - {gpu} = "
            f"{host - gpu} blocks (from the profile where not set), so it would serve nothing; "
            f"set scheduler.gpu_kv_blocks below {host} or scheduler.host_kv_blocks above {gpu}, "
            "or drop neo from policies")


def neo_refusal(config: NeoConfig, prompt: int, max_tokens: int) -> str | None:
    """NEO prefills whole prompts within its token budget and stages host-bound ones; and its
    CPU decodes run only beside GPU work (BASELINES §C.7), so a request left alone on the CPU
    finishes only if it can be swapped back in, under the swap-in threshold of HBM. Pools that
    fail :func:`neo_pool_refusal` refuse every request; check them first."""
    bs = config.block_size
    stage = config.gpu_kv_blocks if config.itm_blocks is None else config.itm_blocks
    prompt_blocks = blocks_for(prompt, bs)
    host_room = config.host_kv_blocks - config.gpu_kv_blocks
    swap_in = round(config.swap_in_fraction * config.gpu_kv_blocks)
    peak = blocks_for(prompt + max_tokens, bs)
    if prompt > config.max_tokens_in_batch:
        return (f"has a prompt of {prompt} tokens but NEO prefills whole prompts (no chunking) "
                f"within neo.max_tokens_in_batch = {config.max_tokens_in_batch}; raise it or "
                "clip workload.max_prompt_tokens")
    if prompt_blocks > stage:
        return (f"has a prompt of {prompt_blocks} KV blocks, more than NEO can stage "
                f"(neo.itm_blocks, default the HBM pool: {stage}); clip "
                "workload.max_prompt_tokens or raise neo.itm_blocks")
    if prompt_blocks > host_room:
        return (f"has a prompt of {prompt_blocks} KV blocks, more than NEO admits into the host "
                "pool beyond the HBM pool's worth it keeps for swap-outs "
                f"(scheduler.host_kv_blocks - scheduler.gpu_kv_blocks = {host_room}); clip "
                "workload.max_prompt_tokens or enlarge scheduler.host_kv_blocks")
    if peak > swap_in:
        return (f"needs {peak} KV blocks at its finish-peak, more than NEO swaps back into HBM "
                f"({swap_in}: neo.swap_in_fraction of scheduler.gpu_kv_blocks), and NEO decodes "
                "on the CPU only beside GPU work, so it would stall once left alone there; "
                "clip workload.max_output_tokens / max_prompt_tokens or enlarge "
                "scheduler.gpu_kv_blocks")
    return None
