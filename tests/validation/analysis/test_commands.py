"""The analysis commands take bad input as every command line does: one `error:` line and exit
2, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

import dualpace_sim.validation.analysis as analysis
from dualpace_sim.config.scenario import ScenarioError
from dualpace_sim.validation.analysis import run_analysis

MODULES = sorted(p for p in Path(analysis.__file__).parent.glob("*.py")
                 if "def main(" in p.read_text())


@pytest.mark.parametrize("error", [ScenarioError("s.yaml: workload: no trace"),
                                   FileNotFoundError(2, "No such file", "run/journal.gz"),
                                   ValueError("run/requests.parquet: not a records file")])
def test_bad_input_is_one_line_and_exit_2(error, capsys):
    def main(*_):
        raise error

    with pytest.raises(SystemExit) as stop:
        run_analysis(main, "arg")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_other_failures_are_not_hidden():
    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        run_analysis(main)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_every_analysis_command_runs_through_run_analysis(path):
    assert "    run_analysis(main" in path.read_text().split('if __name__ == "__main__":')[-1]


def test_a_scenario_that_does_not_load_ends_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "dualpace_sim.validation.analysis.cpu_step_parts",
           "--scenario", str(tmp_path / "missing.yaml"), "--real", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("error: ")
    assert "missing.yaml" in done.stderr
