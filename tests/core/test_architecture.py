"""The one architectural rule: the shared core imports neither simpy nor torch (nor any other
backend code), so the simulator and the real runtime run the same decisions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "dualpace_sim" / "core"


def test_core_sources_import_only_the_standard_library_and_the_core():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    offenders = []
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not offenders, offenders


@pytest.mark.parametrize("module", ["dualpace_sim.core", "dualpace_sim.results.trace_events"])
def test_importing_loads_no_backend(module):
    """The trace recorder too: the real runtime writes its timelines through it."""
    code = (f"import sys, {module}; "
            "bad = [m for m in ('simpy', 'torch', 'dualpace_sim.sim') if m in sys.modules]; "
            "sys.exit(repr(bad) if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
