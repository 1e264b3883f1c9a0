"""Child processes: spawned with the environment asked for, the parent's left as it was."""

from __future__ import annotations

import os

from dualpace_hw.cpu_worker import omp_env
from dualpace_hw.processes import spawn, stop


def _report(conn, name: str) -> None:
    conn.send(os.environ.get(name))
    conn.recv()


def test_a_child_starts_with_the_environment_asked_for_and_the_parent_keeps_its_own(
        monkeypatch):
    monkeypatch.setenv("DUALPACE_PROBE", "parent")
    proc, conn = spawn(_report, "DUALPACE_PROBE", "probe", {"DUALPACE_PROBE": "child"})
    try:
        assert conn.recv() == "child"
    finally:
        stop([proc], [conn])
    assert os.environ["DUALPACE_PROBE"] == "parent"
    monkeypatch.delenv("DUALPACE_PROBE")
    proc, conn = spawn(_report, "DUALPACE_PROBE", "probe", {"DUALPACE_PROBE": "child"})
    stop([proc], [conn])
    assert "DUALPACE_PROBE" not in os.environ


def test_the_cpu_engine_spins_its_openmp_team_only_on_cores_of_its_own(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert omp_env(range(14)) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert omp_env(range(16)) == {} and omp_env(None) == {}
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the user's choice stands
    assert omp_env(range(14)) == {}
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    assert omp_env(range(14)) == {}
