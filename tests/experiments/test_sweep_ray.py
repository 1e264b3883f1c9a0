"""`dualpace-sim sweep --ray`: the same files as the process pool, byte for byte, resumable, and
one clear line when Ray is not installed. The Ray test runs on a local Ray instance (2 CPUs, no
dashboard) that it shuts down, checking that none of its processes outlive it."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.experiments.executors import RayCluster
from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.results.sweep_dir import point_name

runner = CliRunner()


@pytest.fixture
def scenario(write_scenario):
    return write_scenario(policies=["dualpace", "vllm"],
                          vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256},
                          workload={"num_requests": 30}, sweep={"rates": [2.0, 8.0]})


def _descendants(root: int) -> set[int]:
    """Process ids below ``root``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.add(pid)
            todo.append(pid)
    return found


@pytest.fixture
def local_ray():
    """A local Ray instance for one test; afterwards none of its processes (GCS server, raylet,
    agents, and the workers under them) may still be running."""
    ray = pytest.importorskip("ray")
    before = _descendants(os.getpid())
    ray.init(num_cpus=2, include_dashboard=False)
    roots = _descendants(os.getpid()) - before  # Ray's own: started by ray.init
    try:
        yield ray
        started = roots.union(*(_descendants(pid) for pid in roots))
    finally:
        ray.shutdown()
    assert roots, "ray.init started no processes"
    deadline = time.monotonic() + 10
    while started & _descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not started & _descendants(os.getpid()), "Ray processes outlived ray.shutdown()"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ray_sweep_gives_the_process_pools_files(scenario, tmp_path, local_ray, monkeypatch):
    pool = run_sweep(scenario, tmp_path / "pool", workers=2, progress=False)
    assert [p.status for p in pool.points] == ["done"] * 4

    ray_calls = []
    real_run = RayCluster.run

    def spied_run(self, fn, calls):
        ray_calls.append(len(calls))
        return real_run(self, fn, calls)

    monkeypatch.setattr(RayCluster, "run", spied_run)
    result = runner.invoke(app, ["sweep", str(scenario), "--out", str(tmp_path / "ray"),
                                 "--ray", "local", "--quiet"])
    assert result.exit_code == 0, result.output
    assert ray_calls == [4]  # all four points went to Ray
    assert local_ray.is_initialized()  # the sweep used the test's Ray and left it running

    expected = _files(tmp_path / "pool")
    got = _files(tmp_path / "ray")
    assert sorted(got) == sorted(expected)
    assert len([name for name in got if name.endswith("requests.parquet")]) == 4
    for name, data in expected.items():
        assert got[name] == data, f"{name} differs between the process pool and Ray"

    # Resume on Ray: only the missing point is computed, and the files stay the same.
    shutil.rmtree(tmp_path / "ray" / "points" / point_name("vllm", 8.0))
    resumed = run_sweep(scenario, tmp_path / "ray", progress=False, ray="local")
    assert [p.status for p in resumed.points] == ["skipped", "skipped", "skipped", "done"]
    assert ray_calls == [4, 1]
    assert _files(tmp_path / "ray") == expected


def test_ray_not_installed_is_one_line_naming_the_extra(scenario, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", str(scenario), "--out", str(out), "--ray", "local"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --ray: Ray is not installed"), lines
    assert 'pip install -e ".[ray]"' in lines[0]
    assert not out.exists()
