"""Runs a round analysis as its command does, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def run(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    """`python -m dualpace_sim.validation.analysis.<name> ARGS`'s output; it must succeed."""
    done = subprocess.run([sys.executable, "-m", f"dualpace_sim.validation.analysis.{name}",
                           *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
