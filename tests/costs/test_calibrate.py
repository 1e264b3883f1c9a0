"""Appendix B's end-to-end calibration of q_x and o_x from assist records: the arithmetic on
hand-made calls (clipping at zero, equal group weights), the records' file format and its
errors, the profile it writes, and the command."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.costs import CostModel, load_profile
from dualpace_sim.costs.calibrate import (
    ASSISTS_FILE,
    AssistCall,
    CalibrationError,
    calibrate,
    read_assist_calls,
    row_group,
    with_calibration,
    write_assist_calls,
)
from dualpace_sim.costs.fit import fit_controls

H200 = "calibration/h200-spr16/llama-3.1-8b.yaml"
US = 1e-6


def test_a_wait_shorter_than_its_cuda_interval_counts_as_zero():
    calls = [AssistCall("p", 8, 50 * US, 80 * US, 3 * US),  # W < G: [W - G]+ = 0
             AssistCall("p", 8, 100 * US, 60 * US, 5 * US)]  # 40 us
    cal = calibrate(calls, [8])
    assert math.isclose(cal.q["p"], 20 * US) and math.isclose(cal.o["p"], 4 * US)


def test_the_stage_boundary_wait_inside_q_is_kept_apart_for_the_simulator():
    """B = [W - G - (L + F)]+ per group: Q holds it (Algorithm 1 uses Q), and the simulator,
    which books the wait for the GPU's stage boundary itself, charges only Q - B once served."""
    calls = [AssistCall("p", 16, 900 * US, 300 * US, 40 * US),  # B = 560 us
             AssistCall("p", 16, 330 * US, 300 * US, 40 * US)]  # W < G + L + F: B = 0
    cal = calibrate(calls, [16])
    assert math.isclose(cal.groups[0].boundary_s, 280 * US)
    assert math.isclose(cal.q["p"], 315 * US)
    p = load_profile(H200)
    cost = CostModel(with_calibration(p, cal, ["runs/r3"]))
    assert math.isclose(cost.assist_q("p"), 315 * US)
    assert math.isclose(cost.assist_q_served("p"), 35 * US)
    uncalibrated = p.model_copy(update={"assist": p.assist.model_copy(
        update={"calibration": None})})
    assert CostModel(uncalibrated).assist_q_served("lA") == p.assist.q.lA  # the handshake's


def test_an_assist_beside_a_running_batch_costs_its_served_cuda_interval():
    """G_x,u = mean G per group; the simulator stretches g_x(b) by the groups' equal-weight
    mean of G_x,u / g_x(u) for an assist served beside a running batch's kernels, and keeps
    g_x(b) on an idle GPU, for paths the runs did not serve and where G was not recorded."""
    p = load_profile(H200)
    idle = CostModel(p)
    g16, g64 = idle.assist_gpu("p", 16), idle.assist_gpu("p", 64)
    calls = [AssistCall("p", 16, 5 * g16, 1.2 * g16, 0.0),
             AssistCall("p", 16, 5 * g16, 1.6 * g16, 0.0),  # group 16: G = 1.4 g_p(16)
             AssistCall("p", 64, 5 * g64, 2.0 * g64, 0.0)]  # group 64: G = 2 g_p(64)
    cal = calibrate(calls, [16, 64])
    assert [round(g.g_s / idle.assist_gpu("p", g.rows), 9) for g in cal.groups] == [1.4, 2.0]
    cost = CostModel(with_calibration(p, cal, ["runs/r3"]))
    assert math.isclose(cost.assist_gpu_beside_batch("p", 32), 1.7 * cost.assist_gpu("p", 32))
    assert cost.assist_gpu("p", 32) == idle.assist_gpu("p", 32)  # on an idle GPU
    assert cost.assist_gpu_beside_batch("lA", 32) == cost.assist_gpu("lA", 32)  # not served
    unrecorded = [g.model_copy(update={"g_s": None}) for g in cal.groups]
    old = cost.profile.assist.calibration.model_copy(update={"groups": unrecorded})
    before = cost.profile.model_copy(update={"assist": cost.profile.assist.model_copy(
        update={"calibration": old})})
    assert CostModel(before).assist_gpu_beside_batch("p", 32) == idle.assist_gpu("p", 32)


def test_groups_weigh_equally_whatever_their_call_counts():
    many = [AssistCall("p", 3, 20 * US, 10 * US, 2 * US)] * 99  # group 4: Q = 10 us
    one = [AssistCall("p", 60, 130 * US, 100 * US, 8 * US)]  # group 64: Q = 30 us
    cal = calibrate(many + one, [1, 4, 16, 64])
    assert [(g.rows, g.calls) for g in cal.groups] == [(4, 99), (64, 1)]
    assert math.isclose(cal.q["p"], 20 * US)  # (10 + 30) / 2, not the calls' mean (10.2 us)
    assert math.isclose(cal.o["p"], 5 * US)
    assert set(cal.q) == {"p"}  # no lA or lS calls: nothing for them


def test_row_groups_round_up_to_the_profiled_batch_sizes():
    assert [row_group(r, [1, 4, 16]) for r in (1, 2, 4, 5, 16, 40)] == [1, 4, 4, 16, 16, 16]


def test_records_round_trip_and_bad_ones_name_file_line_and_field(tmp_path):
    calls = [AssistCall("lA", 12, 1e-4, 6e-5, 2e-6), AssistCall("lS", 1, 3e-5, 1e-5, 1e-6)]
    path = tmp_path / "a.csv"
    write_assist_calls(calls, path)
    assert read_assist_calls(path) == calls
    for text, wanted in [("x,y\n", "the header must be"),
                         ("path,rows,wait_s,cuda_s,host_s\nq,1,0,0,0\n", ":2: path 'q'"),
                         ("path,rows,wait_s,cuda_s,host_s\np,one,0,0,0\n", "rows must be an "),
                         ("path,rows,wait_s,cuda_s,host_s\np,1,-1,0,0\n", "times >= 0"),
                         ("path,rows,wait_s,cuda_s,host_s\np,1,0\n", "3 fields")]:
        path.write_text(text)
        with pytest.raises(CalibrationError, match=wanted) as e:
            read_assist_calls(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_the_calibrated_profile_keeps_unexercised_paths_and_says_where_q_o_came_from():
    p = load_profile(H200)
    cal = calibrate([AssistCall("p", 16, 900 * US, 300 * US, 40 * US)], [16])
    out = with_calibration(p, cal, ["runs/r3"], date="2026-12-01")
    assert math.isclose(out.assist.q.p, 600 * US) and math.isclose(out.assist.o.p, 40 * US)
    assert out.assist.q.lA == p.assist.q.lA and out.assist.o.lS == p.assist.o.lS
    record = out.assist.calibration
    assert record.runs == ["runs/r3"] and record.kept == ["lA", "lS"]
    assert [(g.path, g.rows, g.calls) for g in record.groups] == [("p", 16, 1)]
    with pytest.raises(CalibrationError, match="no Dense Assist calls"):
        with_calibration(p, calibrate([], [16]), ["empty"])


def test_a_busy_gpu_s_wait_moves_the_routing_fit_off_dense_assist():
    """The point of Appendix B: a control-path wait the handshake does not see makes Dense
    Assist dearer, and Algorithm 1 answers with CPU-local routes for small batches. (On this
    box one CPU-local post-attention stage of Llama-3.1-8B reads ~390 MB of weights, ~5 ms,
    so the wait that tips it is long: 12 ms a call here.)"""
    p = load_profile(H200)
    before = fit_controls(p)
    slow = [AssistCall(x, b, 12e-3, 2e-4, 2e-5) for x in ("p", "lA", "lS") for b in (1, 8, 64)]
    after = fit_controls(with_calibration(p, calibrate(slow, [1, 8, 64]), ["synthetic"]))
    assert (before.route_p, before.route_f) == (0, 0)
    assert after.route_f > 0 or after.route_p > 0


def test_the_command_prints_the_groups_and_writes_the_profile(tmp_path):
    run = tmp_path / "real"
    run.mkdir()
    write_assist_calls([AssistCall("p", 4, 120 * US, 90 * US, 6 * US)] * 3
                       + [AssistCall("lA", 4, 300 * US, 200 * US, 9 * US)],
                       run / ASSISTS_FILE.format(policy="dualpace"))
    out = tmp_path / "calibrated.yaml"
    result = CliRunner().invoke(app, ["profile", "calibrate", H200, "--run", str(run),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 Dense Assist calls from 1 run(s)" in result.output
    assert "p: q " in result.output and "-> 30.0 us" in result.output
    assert "lS: no calls in the runs" in result.output
    assert "routes: (P, F) = (0, 0) with the profile's q, o;" in result.output
    written = load_profile(out)
    assert math.isclose(written.assist.q.lA, 100 * US)
    assert written.assist.calibration.runs == [str(run)] and written.controls is not None


def test_the_command_refuses_a_run_without_assist_records_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["profile", "calibrate", H200, "--run", str(tmp_path)])
    assert result.exit_code == 2
    assert "no assists-dualpace.csv" in result.output and "Traceback" not in result.output
