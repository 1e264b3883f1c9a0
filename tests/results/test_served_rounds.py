"""A real run's GPU rounds priced by the cost model, and the served iteration overhead taken
from the decode-only rounds run with the CPU engine idle."""

from __future__ import annotations

import math

from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results.served_rounds import (
    PASS_SCENARIO,
    ServedRound,
    served_round_overhead,
    served_rounds,
    with_served_overhead,
)
from tests.conftest import REPO_ROOT

H200 = REPO_ROOT / "calibration/h200-spr16"
PASSES = [H200 / "llama-3.1-8b-13c-calibration" / p / "run"
          for p in ("fused-assist", "split-final")]
MS = 1e-3


def round_(real_ms: float, model_ms: float, prefill: bool = False, busy: bool = False,
           overhead_ms: float = 1.0) -> ServedRound:
    return ServedRound(0, 8, prefill, real_ms * MS, model_ms * MS, 0.0, 32, busy,
                       overhead_s=overhead_ms * MS)


def test_the_served_overhead_is_the_median_idle_decode_round_less_its_stages():
    rounds = [round_(5.0, 5.5), round_(5.2, 5.5), round_(6.0, 5.5),  # excess -0.5, -0.3, +0.5
              round_(30.0, 5.5, prefill=True),  # eager: its floor is another question
              round_(9.0, 5.5, busy=True)]  # beside a CPU step: the assists it served
    cal = served_round_overhead(rounds, ["r"])
    assert cal.rounds == 3 and math.isclose(cal.measured_s, 1.0 * MS)
    assert math.isclose(cal.served_s, 0.7 * MS)  # 1.0 ms priced it, the median excess -0.3
    assert served_round_overhead([round_(1.0, 5.5)], ["r"]).served_s == 0.0  # never negative
    assert served_round_overhead(rounds[3:], ["r"]) is None  # no idle decode round


def test_the_h200_calibration_passes_give_the_committed_overhead():
    """The 13-core profile's own passes (the 14-core profile's calibration comes from served
    runs since session 16: its provenance says why)."""
    rounds = [r for d in PASSES
              for r in served_rounds(load_scenario(d.parent / PASS_SCENARIO), d, "dualpace")]
    assert len(rounds) > 4000 and any(r.to_cpu_tokens for r in rounds)
    cal = served_round_overhead(rounds, ["a", "b"])
    assert cal.rounds == 318 and round(cal.measured_s / MS, 3) == 0.654
    committed = load_scenario(PASSES[0].parent / PASS_SCENARIO).profile
    assert round(cal.served_s / MS, 3) == 0.640
    out = with_served_overhead(committed, cal)
    assert out.gpu.iteration_overhead_s == cal.served_s
    assert out.gpu.iteration_overhead_calibration == cal
    assert out.cpu == committed.cpu  # the CPU engine's overhead is not a GPU round's


def test_the_command_calibrates_the_overhead_where_it_finds_the_runs_scenario(tmp_path):
    args = ["profile", "calibrate", str(H200 / "llama-3.1-8b-13c.yaml"),
            *(a for d in PASSES for a in ("--run", str(d)))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert ("GPU iteration overhead: 0.654 ms timed -> 0.640 ms served (318 decode-only rounds "
            "with the CPU engine idle)") in result.output
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    (elsewhere / "assists-dualpace.csv.gz").write_bytes(
        (PASSES[0] / "assists-dualpace.csv.gz").read_bytes())
    result = CliRunner().invoke(app, ["profile", "calibrate", str(H200 / "llama-3.1-8b-13c.yaml"),
                                      "--run", str(elsewhere)])
    assert result.exit_code == 0, result.output
    assert f"GPU iteration overhead kept: no scenario {tmp_path / PASS_SCENARIO}" in result.output
