"""`dualpace-sim sweep`: points, CSVs, resume, stale-result refusal, failures, Ctrl-C."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import dualpace_sim.experiments.sweep as sweep_mod
from dualpace_sim.cli.main import app
from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.results.metrics import sustainable_rate
from dualpace_sim.results.records import read_records
from dualpace_sim.results.sweep_dir import point_name
from tests.conftest import RTX4090_LLAMA

runner = CliRunner()
RATES = [1.0, 4.0, 16.0]
REQUIRED = ["policy", "rate", "normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s",
            "throughput_tok_s", "completed", "submitted", "cpu_token_fraction"]


@pytest.fixture
def scenario(write_scenario):  # noqa: F811
    return write_scenario(workload={"num_requests": 40}, sweep={"rates": RATES})


@pytest.fixture
def counted(monkeypatch):
    """Count (policy, rate) of every simulate call of an in-process (workers=1) sweep."""
    calls = []
    real = sweep_mod.simulate

    def counting(loaded, policy, *args, **kwargs):
        calls.append((policy, loaded.spec.workload.rate))
        return real(loaded, policy, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", counting)
    return calls


def sweep_cli(*args):
    return runner.invoke(app, ["sweep", *map(str, args)])


def test_sweep_writes_points_csvs_and_sustainable_rates(scenario, tmp_path):
    out = tmp_path / "sw"
    result = sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet")
    assert result.exit_code == 0, result.output
    for rate in RATES:
        point = out / "points" / point_name("dualpace", rate)
        entries = json.loads((point / "summary.json").read_text())
        assert isinstance(entries, list) and len(entries) == 1  # the shape of run's summary
        summary = entries[0]
        assert summary["rate"] == rate and summary["policy"] == "dualpace"
        assert len(read_records(point / "requests.parquet")) == 40
        assert not list(point.glob(".*tmp"))
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["rates"] == RATES and meta["policies"] == ["dualpace"]
    assert meta["scenario_hash"] == summary["scenario_hash"]

    table = pd.read_csv(out / "sweep.csv")
    assert list(table.columns[:len(REQUIRED)]) == REQUIRED
    assert table["rate"].tolist() == RATES and (table["completed"] == 40).all()
    # Each row is the point's summary.
    assert table["p99_ttft_s"].iloc[-1] == pytest.approx(summary["p99_ttft_s"])

    sustainable = pd.read_csv(out / "sustainable.csv")
    assert list(sustainable.columns) == ["policy", "metric", "target", "rate"]
    targets = meta["targets"]
    assert sustainable["metric"].tolist() == list(targets)
    for row in sustainable.itertuples():
        assert row.target == targets[row.metric]
        expected = sustainable_rate(table["rate"], table[row.metric], row.target)
        if isinstance(expected, str):
            assert row.rate == expected
        else:
            assert float(row.rate) == pytest.approx(expected)

    # The figures of a real sweep directory.
    plotted = runner.invoke(app, ["plot", str(out)])
    assert plotted.exit_code == 0, plotted.output
    assert (out / "plots" / "latency_vs_rate.png").stat().st_size > 0


def test_sweep_prints_sustainable_table(scenario, tmp_path):
    result = sweep_cli(scenario, "--out", tmp_path / "sw", "--workers", 1)
    assert result.exit_code == 0, result.output
    assert "sustainable request rate (req/s)" in result.output
    assert "P99 TTFT <= 5 s" in result.output and "dualpace" in result.output


def test_resume_computes_only_missing_points(scenario, tmp_path, counted):
    out = tmp_path / "sw"
    run_sweep(scenario, out, workers=1, progress=False)
    assert len(counted) == 3
    kept = out / "points" / point_name("dualpace", 16.0) / "summary.json"
    mtime = kept.stat().st_mtime_ns
    shutil.rmtree(out / "points" / point_name("dualpace", 4.0))
    counted.clear()
    result = run_sweep(scenario, out, workers=1, progress=False)
    assert counted == [("dualpace", 4.0)]
    assert [p.status for p in result.points] == ["skipped", "done", "skipped"]
    assert kept.stat().st_mtime_ns == mtime
    assert len(pd.read_csv(out / "sweep.csv")) == 3


def test_changed_scenario_or_profile_refuses_without_restart(write_scenario, tmp_path,  # noqa: F811
                                                             counted):
    profile = tmp_path / "profile.yaml"
    shutil.copy(RTX4090_LLAMA, profile)
    path = write_scenario(profile=str(profile), workload={"num_requests": 20},
                          sweep={"rates": [2.0, 8.0]})
    out = tmp_path / "sw"
    assert sweep_cli(path, "--out", out, "--workers", 1, "--quiet").exit_code == 0

    profile.write_text(profile.read_text() + "\n# edited\n")
    result = sweep_cli(path, "--out", out, "--workers", 1, "--quiet")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--restart" in lines[0] and "new --out" in lines[0], lines

    doc = yaml.safe_load(path.read_text())
    doc["workload"]["seed"] = 7
    path.write_text(yaml.safe_dump(doc))
    (out / "sweep.json").unlink()  # the points' own hashes still catch it
    assert sweep_cli(path, "--out", out, "--workers", 1, "--quiet").exit_code == 2

    counted.clear()
    result = sweep_cli(path, "--out", out, "--workers", 1, "--quiet", "--restart")
    assert result.exit_code == 0, result.output
    assert len(counted) == 2
    digest = json.loads((out / "sweep.json").read_text())["scenario_hash"]
    assert digest == sweep_mod.scenario_hash(path)


def test_missing_sweep_section_is_one_line_exit_2(write_scenario, tmp_path):  # noqa: F811
    path = write_scenario()
    result = sweep_cli(path, "--out", tmp_path / "sw")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: sweep: "), lines
    assert not (tmp_path / "sw").exists()


def test_bad_sweep_section_is_a_scenario_error(write_scenario, tmp_path):  # noqa: F811
    path = write_scenario(sweep={"rates": [3.0, 2.0]})
    result = sweep_cli(path, "--out", tmp_path / "sw")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: sweep"), lines
    assert "strictly increasing" in lines[0]


def test_failing_point_is_reported_and_others_kept(scenario, tmp_path, monkeypatch):
    real = sweep_mod.simulate

    def flaky(loaded, policy, *args, **kwargs):
        if loaded.spec.workload.rate == 4.0:
            raise RuntimeError("boom\nsecond line")
        return real(loaded, policy, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", flaky)
    out = tmp_path / "sw"
    result = sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet")
    assert result.exit_code == 1
    bad = out / "points" / point_name("dualpace", 4.0)
    assert "RuntimeError: boom" in (bad / "error.txt").read_text()
    assert not (bad / "summary.json").exists()
    assert "dualpace@4.0 failed: RuntimeError: boom" in result.output
    assert "1 of 3 points failed" in result.output
    table = pd.read_csv(out / "sweep.csv")
    assert table["rate"].tolist() == [1.0, 16.0]
    assert len(pd.read_csv(out / "sustainable.csv")) == 4

    monkeypatch.setattr(sweep_mod, "simulate", real)
    result = sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet")
    assert result.exit_code == 0, result.output
    assert not (bad / "error.txt").exists() and (bad / "summary.json").exists()
    assert len(pd.read_csv(out / "sweep.csv")) == 3


def test_ctrl_c_keeps_finished_points_and_says_how_to_resume(scenario, tmp_path, monkeypatch):
    real = sweep_mod.simulate

    def interrupted(loaded, policy, *args, **kwargs):
        if loaded.spec.workload.rate == 4.0:
            raise KeyboardInterrupt
        return real(loaded, policy, *args, **kwargs)

    monkeypatch.setattr(sweep_mod, "simulate", interrupted)
    out = tmp_path / "sw"
    result = sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet")
    assert result.exit_code == 130
    assert "1 of 3 points are finished" in result.output
    assert "run the same command again to resume" in result.output
    assert (out / "points" / point_name("dualpace", 1.0) / "summary.json").exists()
    assert not (out / "points" / point_name("dualpace", 4.0) / "summary.json").exists()
    assert not (out / "sweep.csv").exists()


def test_worker_processes_match_in_process_results(write_scenario, tmp_path):  # noqa: F811
    path = write_scenario(workload={"num_requests": 20}, sweep={"rates": [2.0, 8.0]})
    serial = run_sweep(path, tmp_path / "one", workers=1, progress=False)
    parallel = run_sweep(path, tmp_path / "two", workers=2, progress=False)
    assert [p.status for p in parallel.points] == ["done", "done"]
    for rate in (2.0, 8.0):
        name = point_name("dualpace", rate)
        one = (tmp_path / "one" / "points" / name / "requests.parquet").read_bytes()
        two = (tmp_path / "two" / "points" / name / "requests.parquet").read_bytes()
        assert one == two
    pd.testing.assert_frame_equal(serial.table, parallel.table)
    assert not math.isnan(parallel.table["normalized_latency_s"].iloc[0])


def test_restart_removes_only_what_the_sweep_wrote(scenario, tmp_path):
    """--restart discards the sweep's files, its points and its figures, and keeps a user's own
    files in the same folders (and the folders holding them)."""
    out = tmp_path / "sw"
    assert sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet").exit_code == 0
    (out / "plots").mkdir()
    (out / "plots" / "old.png").write_bytes(b"png")
    (out / "plots" / "notes.txt").write_text("mine")
    (out / "points" / "README").write_text("mine too")
    (out / "mine.csv").write_text("a\n1\n")
    result = sweep_cli(scenario, "--out", out, "--workers", 1, "--quiet", "--restart")
    assert result.exit_code == 0, result.output
    assert (out / "plots" / "notes.txt").read_text() == "mine"
    assert not (out / "plots" / "old.png").exists()
    assert (out / "points" / "README").read_text() == "mine too"
    assert (out / "mine.csv").exists() and (out / "sweep.csv").exists()


def test_a_stalled_point_is_reported_as_deterministic(scenario, tmp_path, monkeypatch):
    """A stall is no transient failure: the advice is not to rerun."""
    from dualpace_sim.sim import SimulationStalled

    def stall(loaded, policy, *args, **kwargs):
        raise SimulationStalled("simulation stalled at t=1.000s with 3 unfinished requests")

    monkeypatch.setattr(sweep_mod, "simulate", stall)
    result = sweep_cli(scenario, "--out", tmp_path / "sw", "--workers", 1, "--quiet")
    assert result.exit_code == 1
    assert "the stalls are deterministic" in result.stderr
    assert "rerun the same command" not in result.stderr
def test_a_grid_sweeps_any_field_at_every_rate(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 30},
                          sweep={"rates": [2.0, 8.0],
                                 "grid": {"scheduler.host_kv_blocks": [2048, 4096],
                                          "workload.max_output_tokens": [64]}})
    result = sweep_cli(path, "--out", tmp_path / "sw", "--workers", 1, "--quiet")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert list(table.columns[:4]) == ["policy", "rate", "scheduler.host_kv_blocks",
                                       "workload.max_output_tokens"]
    assert list(zip(table["scheduler.host_kv_blocks"], table["rate"], strict=True)) == [
        (2048, 2.0), (2048, 8.0), (4096, 2.0), (4096, 8.0)]
    point = tmp_path / "sw" / "points" / point_name(
        "dualpace", 8.0, (("scheduler.host_kv_blocks", 2048), ("workload.max_output_tokens", 64)))
    summary = json.loads((point / "summary.json").read_text())[0]
    assert summary["capacities"]["host_kv_blocks"] == 2048
    assert read_records(point / "requests.parquet")["max_tokens"].max() <= 64
    sustainable = pd.read_csv(tmp_path / "sw" / "sustainable.csv")
    assert list(sustainable.columns) == ["policy", "scheduler.host_kv_blocks",
                                         "workload.max_output_tokens", "metric", "target", "rate"]
    assert len(sustainable) == 2 * 4


@pytest.mark.parametrize("grid, expected", [
    ({"scheduler.host_kv_blokcs": [1, 2]}, "scheduler.host_kv_blokcs: unknown key"),
    ({"workload.rate": [1, 2]}, "workload.rate cannot be a grid key"),
    ({"scheduler.host_kv_blocks": [0]}, "scheduler.host_kv_blocks:"),
])
def test_bad_grid_keys_exit_2(write_scenario, tmp_path, grid, expected):
    path = write_scenario(sweep={"rates": [1.0, 2.0], "grid": grid})
    result = sweep_cli(path, "--out", tmp_path / "sw")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and expected in result.output


def test_progress_bars_stay_out_of_logs(scenario, tmp_path):
    """CliRunner's streams are not terminals, as a CI log or `> file` is not: no bar."""
    result = sweep_cli(scenario, "--out", tmp_path / "sw", "--workers", 1)
    assert result.exit_code == 0, result.output
    assert "\r" not in result.output and "point/s" not in result.output
    assert "sustainable request rate" in result.output
