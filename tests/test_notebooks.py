"""Every notebook in notebooks/ runs end to end on its SMALL setting, so a notebook that drifts
from the package's API fails here rather than in a reader's hands; a new notebook is picked up
by the glob."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest
from ipykernel.kernelspec import write_kernel_spec

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
KERNEL = "dualpace-notebook-test"


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec for this interpreter under a name of its own, so the notebooks run with
    this venv's packages whatever other "python3" kernels the machine has."""
    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / KERNEL, overrides={"display_name": KERNEL})
    return root


def test_the_four_studies_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"host_kv_sizing", "cpu_cores", "gpu_memory",
                                           "real_vs_sim"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_clean_with_a_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{path.name}: strip its outputs before committing (CI executes it)")
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "SMALL = False" in tagged[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_its_small_setting(path, tmp_path, kernel_dir, azure_dir, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))  # the studies replay Azure traces
    declared = papermill.inspect_notebook(str(path))
    parameters = {"SMALL": True}
    if "OUT_DIR" in declared:  # keep what a notebook writes out of the repository
        parameters["OUT_DIR"] = str(tmp_path / "out")
    out = tmp_path / path.name
    papermill.execute_notebook(str(path), str(out), parameters=parameters, cwd=str(path.parent),
                               kernel_name=KERNEL, progress_bar=False, log_output=False)
    done = nbformat.read(out, as_version=4)
    last = [c for c in done.cells if c.cell_type == "code"][-1]
    printed = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert printed.strip(), f"{path.name}: the conclusion cell printed nothing"
    plots = [o for c in done.cells if c.cell_type == "code" for o in c.outputs
             if "image/png" in o.get("data", {})]
    assert plots, f"{path.name}: drew no plot"
