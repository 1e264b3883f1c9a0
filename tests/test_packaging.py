"""What the extras install is what the docs tell people to run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_notebooks_extra_installs_a_jupyter_front_end():
    # pyproject.toml read as text: tomllib is not in Python 3.10, which the package supports
    line = re.search(r"^notebooks = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    names = {re.split(r"[<>=\[ ]", req.strip().strip('"'), maxsplit=1)[0]
             for req in line.group(1).split(",")}
    assert {"papermill", "ipykernel"} <= names
    assert names & {"jupyterlab", "notebook"}, "a front end to open the notebooks in"
