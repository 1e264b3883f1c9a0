"""The CPU-step-phases benchmark runs end to end (tiny model, CPU device), and its per-phase
model adds up to the step the simulator charges."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cpu_step.phases import model_phases
from benchmarks.cpu_step.vs_model import model_step
from dualpace_sim.core.routing import Route
from dualpace_sim.costs import CostModel, ModelShape, load_spec, synthesize

ROOT = Path(__file__).resolve().parents[3]


def test_every_phase_of_the_step_is_timed_beside_its_model_for_each_host_pool(tmp_path):
    out = tmp_path / "phases.json"
    pools = ["shared", "shared-huge", "private"]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_step.phases", "--roofline",
         "rtx4090-xeon4510-12c", "--model", "tiny-llama", "--device", "cpu", "--batches", "1",
         "2", "--context", "32", "--steps", "2", "--pool", *pools, "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["pool"], r["route"], r["batch"]) for r in rows] == [
        (pool, route, b) for pool in pools for route in ("Fused-Assist", "Full-CPU")
        for b in (1, 2)]
    for r in rows:
        real, fused = r["measured_s"], r["route"] == "Fused-Assist"
        assert min(real["pre_attn"], real["kv_write"], real["attention"]) > 0
        assert (real["assists"] > 0) == fused and (real["post_attn"] > 0) != fused
        timed = sum(real[p] for p in ("pre_attn", "kv_write", "attention", "assists",
                                      "post_attn", "post_layer"))
        assert 0 < timed < real["step"]
    for pool in pools:
        assert f"{pool:<12}Fused-Assist    1  step" in run.stdout
        assert f"{pool}: huge pages in use:" in run.stdout


@pytest.mark.parametrize("route", [Route.FUSED_ASSIST, Route.FULL_CPU])
def test_the_phases_model_adds_up_to_the_simulators_step(route):
    cm = CostModel(synthesize(load_spec("rtx4090-xeon4510-12c"),
                              ModelShape.from_name("llama-3.1-8b")))
    for b in (1, 16):
        assert model_phases(cm, route, b, 1024)["step"] == \
            pytest.approx(model_step(cm, route, b, 1024)["step"])
