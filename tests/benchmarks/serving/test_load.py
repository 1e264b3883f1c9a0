"""The load-tool benchmark runs end to end on the CPU (tiny checkpoint, two constant rates, a
few requests each): guidellm drives `dualpace-hw serve`, its report lands beside the served
run's records, and the served run validates with an exact replay. It needs guidellm in
.venv-load (`make load-tool`, which `make test` runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serving import load as serve_load
from tests.hw.checkpoints import make_checkpoint, tiny_scenario

ROOT = Path(__file__).resolve().parents[3]
GUIDELLM = ROOT / ".venv-load" / "bin" / "guidellm"


@pytest.mark.skipif(not GUIDELLM.is_file(), reason="guidellm is not installed: make load-tool")
def test_a_guidellm_sweep_drives_the_server_and_the_served_run_validates(tmp_path):
    ck = make_checkpoint(tmp_path / "tiny", "llama")
    scenario = tiny_scenario(tmp_path / "s.yaml", ck, ["dualpace"])
    out = tmp_path / "served"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving.load", str(scenario),
         "--checkpoint", str(ck), "--out", str(out), "--rates", "2", "4", "--requests", "3",
         "--prompt-tokens", "16", "--output-tokens", "8", "--device", "cpu", "--port",
         "18731", "--model-name", "tiny", "--guidellm", str(GUIDELLM), "--timeout-s", "300"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    figures = json.loads((out / "load.json").read_text())
    assert [c["rate"] for c in figures["client"]] == [2.0, 4.0]
    assert all(c["successful"] == c["timed_first_token"] == 3 and c["errored"] == 0
               for c in figures["client"])
    assert figures["engine"]["completed"] == figures["engine"]["submitted"] == 6
    assert figures["client_over_engine_mean_ttft"] > 1.0  # HTTP and the pump add, never take
    assert "reproduced exactly" in run.stdout
    assert (out / "guidellm.json").is_file() and (out / "validation" / "validation.csv").is_file()


def test_the_load_tool_and_the_server_get_disjoint_cores():
    """The client takes the machine's last cores, the CPU engine its first, and the server's
    own threads keep at least one between them; a split that leaves none is refused."""
    box = set(range(16))
    server, client = serve_load.split_cores(box, 13, 1)
    assert client == {15} and server == set(range(15))
    server, client = serve_load.split_cores(box, 12, 2)
    assert client == {14, 15} and server & client == set() and server - set(range(12))
    assert serve_load.split_cores(box, None, 2) == serve_load.split_cores(box, 14, 0) == \
        (None, None)
    with pytest.raises(ValueError, match="--cpu-cores 14 --client-cores 2: leave no core"):
        serve_load.split_cores(box, 14, 2)
