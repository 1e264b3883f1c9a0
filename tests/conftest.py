"""Shared fixtures."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def azure_dir() -> Path:
    """The Azure LLM Inference Trace 2023 copies: $DUALPACE_AZURE_DIR, else <repo>/../shared."""
    env = os.environ.get("DUALPACE_AZURE_DIR")
    folder = Path(env) if env else REPO_ROOT / ".." / "shared" / "data" / "azure"
    if not (folder / "AzureLLMInferenceTrace_conv.csv").is_file():
        pytest.skip(f"Azure trace copies not found in {folder.resolve()}")
    return folder.resolve()
