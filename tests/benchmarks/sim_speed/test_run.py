"""The speed benchmark's baseline runner imports the other checkout's code, not this one's: an
editable install's import finder serves any module the other checkout lacks from this one, so a
baseline process from before the package layout once ran a mix of the two checkouts."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_a_baseline_process_imports_only_the_other_checkout(tmp_path):
    other = tmp_path / "checkout"
    (other / "dualpace_sim").mkdir(parents=True)
    (other / "dualpace_sim" / "__init__.py").write_text("WHICH = 'the other checkout'\n")
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from benchmarks.sim_speed.run import import_from; import_from(Path(sys.argv[2])); "
            "import dualpace_sim; print(dualpace_sim.WHICH)\n"
            "try:\n    import dualpace_sim.config\nexcept ImportError:\n    print('no config')\n"
            "else:\n    print('config from', dualpace_sim.config.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(REPO_ROOT), str(other)], env=env,
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.split("\n")[:2] == ["the other checkout", "no config"]
