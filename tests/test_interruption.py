"""Interrupting `run` and `sweep` (Ctrl-C, SIGTERM, SIGKILL): nothing lost, nothing left behind.

Each test starts the real command in its own session, waits until it has finished something
(a run's first policy, a sweep's first point), signals it, and then checks that no process of
its session survives (workers, the forkserver, the resource tracker), that what was finished is
intact, and that a sweep resumes from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dualpace_sim.results.records import read_records

from .conftest import RTX4090_LLAMA
from .signals import default_sigint

MAIN = "from dualpace_sim.cli.main import main; main()"
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]


def _scenario(tmp: Path, **fields) -> Path:
    doc = {"name": "interrupted", "profile": str(RTX4090_LLAMA),
           "workload": {"source": "default", "trace": "conv", "num_requests": 1500,
                        "arrival": "poisson", "rate": 3.0, "seed": 0}, **fields}
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint)


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "nothing finished in time"
        time.sleep(0.05)


def _session(sid: int) -> list[str]:
    """The processes still in session `sid` (its leader started it), as 'pid command'."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: the session id
            out.append(f"{stat.parent.name} {text.split(')')[0]})")
    return out


def _signal(proc: subprocess.Popen, sig: signal.Signals) -> tuple[int, str]:
    """Ctrl-C goes to the terminal's process group, `kill` to the process alone."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session(proc.pid) == [], f"left behind: {_session(proc.pid)}"
    return proc.returncode, err


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_interrupted_run_keeps_the_policies_it_finished(tmp_path, sig):
    path = _scenario(tmp_path, policies=["vllm", "dualpace"],
                     vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 128})
    out = tmp_path / "out"
    proc = _start("run", str(path), "--out", str(out), "--quiet")
    _wait_for((out / "summary.json").exists, proc)
    code, err = _signal(proc, sig)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 130 and err.strip() == (f"interrupted; the policies that finished are in "
                                               f"{out}/"), err
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["vllm"]
    records = read_records(out / "requests.parquet")
    assert set(records["policy"]) == {"vllm"} and len(records) == 1500
    assert not list(out.glob(".*.tmp")), "a temporary file left behind"


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_interrupted_sweep_leaves_no_process_and_resumes(tmp_path, sig):
    path = _scenario(tmp_path, workload={"source": "default", "trace": "conv",
                                         "num_requests": 600, "arrival": "poisson",
                                         "rate": 3.0, "seed": 0},
                     sweep={"rates": [1.0, 2.0, 3.0, 4.0]})
    out = tmp_path / "sweep"
    args = ("sweep", str(path), "--out", str(out), "--workers", "2", "--quiet")
    proc = _start(*args)
    _wait_for(lambda: any(out.glob("points/*/summary.json")), proc)
    code, err = _signal(proc, sig)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 130, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "run the same command again to resume" in lines[0], err
    finished = sorted(p.parent.name for p in out.glob("points/*/summary.json"))
    for name in finished:  # whole points only: records and summary both readable
        json.loads((out / "points" / name / "summary.json").read_text())
        assert len(read_records(out / "points" / name / "requests.parquet")) == 600
    resumed = subprocess.run([sys.executable, "-c", MAIN, *args[:-1]], capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(finished)} already finished" in resumed.stdout, resumed.stdout


def test_ctrl_c_on_hw_profile_prints_how_to_resume(tmp_path, monkeypatch):
    """typer turns an interrupt into a silent exit 130 before main() sees it: the command
    itself must say that rerunning resumes the profile."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import dualpace_hw.profiler.run as profile_run
    from dualpace_hw.cli import INTERRUPTED_PROFILE
    from dualpace_hw.cli import app as hw_app

    def interrupted(opt):
        raise KeyboardInterrupt  # as Ctrl-C arrives in the middle of measuring

    monkeypatch.setattr(profile_run, "run_profile", interrupted)
    result = CliRunner().invoke(hw_app, ["profile", "--model", "tiny-llama", "--out",
                                         str(tmp_path / "p.yaml"), "--gpu-device", "cpu"])
    assert result.exit_code == 130
    assert result.stderr.strip() == INTERRUPTED_PROFILE
