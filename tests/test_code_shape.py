"""`benchmarks/layout/code_shape.py`, the layout measurement of issue 20: it finds functions, their
lengths and repeated blocks correctly on hand-made modules, and no function in the core, the
simulator's engines or the executors passes its limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.layout import code_shape

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_tmp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(code_shape, "ROOT", tmp_path)
    return tmp_path


def test_functions_count_decorators_and_nested_ones(in_tmp_root):
    mod = in_tmp_root / "m.py"
    mod.write_text("import functools\n\n\nclass A:\n    @functools.cache\n    def f(self):\n"
                   "        def g():\n            return 1\n        return g()\n\n\n"
                   "def h():\n    pass\n")
    found = {f.name: (f.line, f.length) for f in code_shape.functions(mod)}
    assert found == {"A.f": (5, 5), "A.f.g": (7, 2), "h": (12, 2)}


def test_a_repeated_block_counts_once_however_long_it_runs(in_tmp_root):
    body = "".join(f"    value_{i} = compute_something_long(argument_{i}, other_{i})\n"
                   for i in range(9))
    for name in ("a.py", "b.py"):
        (in_tmp_root / name).write_text(f"def f():\n{body}    return 0\n")
    (in_tmp_root / "c.py").write_text("def f():\n" + body.replace("value_4", "other") + "\n")
    blocks = code_shape.duplicated_blocks(sorted(in_tmp_root.glob("*.py")))
    assert blocks == [[("a.py", 1), ("b.py", 1)]]  # 10 equal lines in a and b: one block


def test_no_function_in_the_short_parts_passes_the_limit():
    run = subprocess.run([sys.executable, "-m", "benchmarks.layout.code_shape"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("longest_short_function=") and "limit=60" in last
    shape = code_shape.measure()
    assert shape["over_limit"] == [], shape["over_limit"]
    assert shape["folders"]["dualpace_sim/core"]["modules"] > 0
