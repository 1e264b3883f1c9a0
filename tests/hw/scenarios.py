"""Scenario files for the hw tests: a tiny model on a roofline box, pools small enough that
prompts go Prefill-to-CPU and decodes migrate."""

from __future__ import annotations

from pathlib import Path

import yaml


def tiny_scenario(path: Path, model: str, policies: list[str], name: str, workload: dict,
                  **scheduler) -> Path:
    """`model`: a built-in name or a config.json path; `scheduler` overrides the pools."""
    path.write_text(yaml.safe_dump({
        "name": name,
        "roofline": {"hardware": "rtx4090-xeon4510-12c", "model": model},
        "policies": policies,
        "vllm": {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        # tiny pools: HBM for a few requests, so prompts go Prefill-to-CPU and decodes migrate
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 16,
                      "cpu_batch_limit": 4, **scheduler},
        "workload": {"source": "default", **workload},
    }))
    return path
