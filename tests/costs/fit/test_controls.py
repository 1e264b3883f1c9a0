"""The four controls fitted together, on hand-checked and committed profiles, and written back."""

import math
from pathlib import Path

import pytest

from dualpace_sim.core.routing import check_thresholds
from dualpace_sim.costs import load_profile
from dualpace_sim.costs.fit import fit_controls, with_controls
from dualpace_sim.costs.profile import check_magnitudes

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = sorted((ROOT / "calibration/roofline").glob("*/*.yaml"))


def test_fit_rtx4090_roofline(rtx):
    result = fit_controls(rtx)
    assert result.controls() == {"route_p": 0, "route_f": 0, "gpu_token_limit": 512,
                                 "cpu_batch_limit": 152}
    assert result.lines()[0] == "route_p=0"
    assert result.prefill.fit.tokens[-1] == 16384  # grid stays inside the GPU token tables
    assert math.isnan(result.prefill.throughput[-1][-1])  # 64 x 4096 is beyond them


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fit_every_committed_profile(path):
    profile = load_profile(path)
    check_magnitudes(profile, str(path))
    result = fit_controls(profile)
    check_thresholds(result.route_p, result.route_f)
    assert result.gpu_token_limit in result.prefill.fit.tokens
    assert result.cpu_batch_limit in result.cpu.batch_sizes


def test_with_controls_fills_controls_and_keeps_provenance(rtx, tmp_path):
    result = fit_controls(rtx, epsilon=0.01)
    fitted = with_controls(rtx, result, date="2026-12-01")
    assert fitted.provenance == rtx.provenance and rtx.controls is None
    c = fitted.controls
    assert (c.route_p, c.route_f, c.gpu_token_limit, c.cpu_batch_limit) == (0, 0, 512, 152)
    assert (c.fit.epsilon, c.fit.lambda_gpu, c.fit.k, c.fit.delta) == (0.01, 1.0, 5, 0.01)
    path = tmp_path / "p.yaml"
    fitted.save(path)
    assert load_profile(path) == fitted
