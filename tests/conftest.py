"""Shared fixtures."""

import os
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def azure_dir() -> Path:
    """The Azure LLM Inference Trace 2023 copies: $DUALPACE_AZURE_DIR, else <repo>/../shared."""
    env = os.environ.get("DUALPACE_AZURE_DIR")
    folder = Path(env) if env else REPO_ROOT / ".." / "shared" / "data" / "azure"
    if not (folder / "AzureLLMInferenceTrace_conv.csv").is_file():
        message = (f"Azure trace copies not found in {folder.resolve()}; set DUALPACE_AZURE_DIR "
                   "to a folder holding AzureLLMInferenceTrace_{conv,code}.csv")
        if os.environ.get("CI"):  # CI always has shared/ beside the clone: never skip there
            pytest.fail(message)
        pytest.skip(message)
    return folder.resolve()

RTX4090_LLAMA = REPO_ROOT / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"


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
