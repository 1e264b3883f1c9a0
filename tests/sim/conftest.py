"""Scenario files for simulator tests, written into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RTX4090_LLAMA = REPO / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"


@pytest.fixture
def write_scenario(tmp_path):
    """Write a scenario YAML (RTX 4090 / Llama-3.1-8B roofline unless overridden)."""

    def write(name: str = "s.yaml", **fields) -> Path:
        doc = {
            "name": "test",
            "profile": str(RTX4090_LLAMA),
            "workload": {"source": "default", "trace": "conv", "num_requests": 120,
                         "arrival": "poisson", "rate": 4.0, "seed": 1},
        }
        for key, value in fields.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                merged = {**doc[key], **value}
                doc[key] = {k: v for k, v in merged.items() if v is not None}
            else:
                doc[key] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc))
        return path

    return write
