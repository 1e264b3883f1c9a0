"""One quick profile of a tiny model on the CPU, shared by the profiler's tests."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dualpace_hw.cli import app as hw_app


@pytest.fixture(scope="package")
def quick_profile(tmp_path_factory):
    """(the profile's path, the command's output)."""
    out = tmp_path_factory.mktemp("prof") / "tiny-llama.yaml"
    result = CliRunner().invoke(hw_app, [
        "profile", "--model", "tiny-llama", "--out", str(out), "--quick", "--gpu-device", "cpu",
        "--box", "ci-box", "--cpu-cores", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    return out, result.output
