"""The architecture's import contracts (pyproject.toml, `[tool.importlinter]`) hold, and each
fails when an import it forbids is added to a copy of the packages, lazy imports included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(where: Path, *contracts: str) -> subprocess.CompletedProcess:
    args = [LINT, "--no-cache", *(a for c in contracts for a in ("--contract", c))]
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run(args, cwd=where, env=env, capture_output=True, text=True, timeout=300)


def test_the_contracts_are_kept():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Contracts: 6 kept, 0 broken." in run.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("architecture")
    for package in ("dualpace_sim", "dualpace_hw"):
        shutil.copytree(ROOT / package, where / package,
                        ignore=shutil.ignore_patterns("__pycache__", "csrc", "data"))
    shutil.copy(ROOT / "pyproject.toml", where)
    return where


LAZY = "\n\ndef _added():\n    {}\n"  # an import inside a function counts too


@pytest.mark.parametrize(("module", "added", "contract"), [
    ("dualpace_sim/core/plans.py", "import simpy", "core-alone"),
    ("dualpace_sim/core/plans.py", LAZY.format("from dualpace_sim.results import records"),
     "core-alone"),
    ("dualpace_sim/results/records.py", LAZY.format("import torch"), "sim-without-torch"),
    ("dualpace_hw/serving/serve.py",
     LAZY.format("from dualpace_sim.experiments.runner import simulate"),
     "runtime-beside-the-simulator"),
    ("dualpace_sim/costs/model.py", LAZY.format("from dualpace_sim.sim import dualpace"),
     "sim-layers"),
    ("dualpace_sim/results/records.py", LAZY.format("from dualpace_sim.experiments import runner"),
     "no-cycles"),
    ("dualpace_hw/memory/kv.py", LAZY.format("from dualpace_hw import runtime"), "no-cycles"),
    ("dualpace_hw/kernels/attention.py", LAZY.format("from dualpace_hw.executors import model"),
     "hw-layers"),
])
def test_a_forbidden_import_breaks_its_contract(copy, module, added, contract):
    path = copy / module
    original = path.read_text()
    path.write_text(original + "\n" + added + "\n")
    try:
        broken = lint(copy, contract)
        assert broken.returncode != 0 and "1 broken" in broken.stdout, broken.stdout[-3000:]
    finally:
        path.write_text(original)
    kept = lint(copy, contract)
    assert kept.returncode == 0, kept.stdout[-3000:]
