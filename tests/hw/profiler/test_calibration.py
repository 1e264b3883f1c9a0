"""The profiler's Appendix B calibration workload on the CPU with a tiny model: both passes
served by the real runtime, every assist path calibrated from their records, resumable, and
recomputable by `dualpace-sim profile calibrate`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualpace_hw.profiler.calibration import (
    CalibrationWorkload,
    calibrated,
    calibration_dir,
    passes,
    serve_passes,
)
from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.costs import load_profile
from dualpace_sim.costs.calibrate import run_assist_calls
from tests.hw.scenarios import tiny_scenario

pytestmark = pytest.mark.usefixtures("keep_the_cores")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The quick workload's two passes, priced with a tiny roofline profile."""
    tmp = tmp_path_factory.mktemp("cal")
    profile = load_scenario(tiny_scenario(tmp / "s.yaml", "tiny-llama", ["dualpace"], "t",
                                          {"num_requests": 1, "rate": 1.0})).profile
    path = tmp / "tiny.yaml"
    profile.save(path)
    work = CalibrationWorkload.quick()
    return profile, path, work, serve_passes(profile, path, work, "cpu", 2)


def test_the_passes_route_every_cpu_step_fused_assist_then_split_final(served):
    profile, path, work, runs = served
    assert [r.parent.name for r in runs] == ["fused-assist", "split-final"]
    assert all(r.parent.parent == calibration_dir(path) for r in runs)
    fused, split = (run_assist_calls(r) for r in runs)
    assert fused and {c.path for c in fused} == {"p", "lA"}
    assert split and {c.path for c in split} == {"lS"}
    # every CPU step of a Fused-Assist pass makes N - 1 post-attention assists and one final
    n_layers = profile.model.n_layers
    assert sum(c.path == "p" for c in fused) == (n_layers - 1) * sum(c.path == "lA" for c in fused)
    for r in runs:
        (summary,) = json.loads((r / "summary.json").read_text())
        assert summary["completed"] == work.requests and not summary.get("partial")
        assert summary["cpu_token_fraction"] > 0  # the capped HBM pool sent work to the CPU


def test_calibration_prices_all_three_paths_from_the_runs(served):
    profile, path, work, runs = served
    cal = calibrated(profile, runs, path, work)
    record = cal.assist.calibration
    assert record is not None and record.kept == [] and record.workload == work.describe()
    assert record.runs == [str(r.relative_to(path.parent)) for r in runs]
    assert {g.path for g in record.groups} == {"p", "lA", "lS"}
    for x in ("p", "lA", "lS"):
        groups = [g for g in record.groups if g.path == x]
        assert getattr(cal.assist.q, x) == pytest.approx(sum(g.q_s for g in groups) / len(groups))
        assert getattr(cal.assist.o, x) > 0  # the GPU worker's host time is never free
    # the CLI recomputes the same calibration from the committed run directories
    out = path.with_name("again.yaml")
    result = CliRunner().invoke(sim_app, ["profile", "calibrate", str(path), "--out", str(out),
                                          *[a for r in runs for a in ("--run", str(r))]])
    assert result.exit_code == 0, result.output
    again = load_profile(out).assist
    for x in ("p", "lA", "lS"):
        assert getattr(again.q, x) == pytest.approx(getattr(cal.assist.q, x))
        assert getattr(again.o, x) == pytest.approx(getattr(cal.assist.o, x))


def test_a_finished_pass_is_reused_and_a_partial_one_served_again(served, monkeypatch):
    profile, path, work, runs = served
    summary = runs[1] / "summary.json"
    saved = summary.read_text()
    partial = json.loads(saved)
    partial[0]["partial"] = True
    summary.write_text(json.dumps(partial))
    served_again = []

    def serve(loaded, out, **run):
        served_again.append(out)
        summary.write_text(saved)

    monkeypatch.setattr("dualpace_hw.profiler.calibration.run_real", serve)
    assert serve_passes(profile, path, work, "cpu", 2) == runs
    assert served_again == [runs[1]]


def test_the_split_final_pass_covers_every_batch_the_cpu_engine_may_run():
    fused, split = passes(largest_cpu_batch=48)
    assert (fused.route_p, fused.route_f) == (0, 0)
    assert (split.route_p, split.route_f) == (48, 0)  # batch <= P and > F: Split-Final
