"""A run's CPU speed check (its summary's `cpu_speed`) read against the profile that prices it,
and the profile's CPU stages scaled to it."""

from __future__ import annotations

import pytest

from dualpace_sim.costs import CostModel, load_profile
from dualpace_sim.costs.cpu_speed import CpuSpeedError, at_cpu_speed, cpu_speed
from tests.conftest import RTX4090_LLAMA


@pytest.fixture(scope="module")
def profile():
    return load_profile(RTX4090_LLAMA)


def check(profile, dense: list[float], attention: list[float]) -> dict:
    """A check whose points ran `dense` / `attention` times their tables' figures."""
    cost = CostModel(profile)
    pre = [{"table": "cpu.pre_attn", "x": b, "measured_s": f * cost.cpu_pre_attn(b)}
           for b, f in zip((16, 32, 128), dense, strict=True)]
    attn = [{"table": "cpu.decode_attn", "x": b, "y": t,
             "measured_s": f * cost.cpu_decode_attn(b, t)}
            for (b, t), f in zip(((16, 16384), (64, 100_000), (256, 262144)), attention,
                                 strict=True)]
    return {"pre_attn": 0.0, "decode_attn": 0.0, "points": pre + attn}  # ratios: not read


def test_speed_is_the_mean_over_checks_of_each_checks_median(profile):
    record = {"start": check(profile, [0.8, 0.7, 0.95], [0.6, 0.9, 0.7]),
              "end": check(profile, [1.0, 1.1, 0.9], [0.8, 0.75, 0.85])}
    speed = cpu_speed(record, profile)
    assert speed.dense == pytest.approx((0.8 + 1.0) / 2)
    assert speed.attention == pytest.approx((0.7 + 0.8) / 2)
    assert speed.checks == 2
    # a run stopped before its end check has the start's alone
    alone = cpu_speed({"start": record["start"]}, profile)
    assert (alone.dense, alone.attention, alone.checks) == pytest.approx((0.8, 0.7, 1))
    assert cpu_speed({}, profile) is None  # nothing checked
    assert cpu_speed({"start": {"points": []}}, profile) is None


def test_the_ratios_are_taken_against_the_pricing_profile(profile):
    """The same measured seconds against a profile twice as slow: half the ratio (validate
    --costs prices a run with another profile than the one it ran with)."""
    record = {"start": check(profile, [0.8, 0.8, 0.8], [0.6, 0.6, 0.6])}
    slower = at_cpu_speed(profile, cpu_speed({"start": check(profile, [2] * 3, [2] * 3)},
                                             profile))
    speed = cpu_speed(record, slower)
    assert (speed.dense, speed.attention) == pytest.approx((0.4, 0.3))


def test_scaling_touches_the_cpu_stages_only(profile):
    speed = cpu_speed({"start": check(profile, [0.5] * 3, [0.25] * 3)}, profile)
    scaled = at_cpu_speed(profile, speed)
    for name in ("pre_layer", "pre_attn", "post_attn", "post_layer"):
        assert getattr(scaled.cpu, name).y == pytest.approx(
            [0.5 * v for v in getattr(profile.cpu, name).y]), name
    for row, tabled in zip(scaled.cpu.decode_attn.z, profile.cpu.decode_attn.z, strict=True):
        assert row == pytest.approx([0.25 * v for v in tabled])
    for name in ("assist_write", "assist_read", "hidden_write"):
        assert getattr(scaled.cpu, name) == getattr(profile.cpu, name)
    assert scaled.cpu.iteration_overhead_s == profile.cpu.iteration_overhead_s
    assert (scaled.gpu, scaled.assist, scaled.link, scaled.controls) == (
        profile.gpu, profile.assist, profile.link, profile.controls)
    same = at_cpu_speed(profile, cpu_speed({"start": check(profile, [1] * 3, [1] * 3)}, profile))
    assert same == profile


@pytest.mark.parametrize("record, field", [
    ([], "cpu_speed: expected a mapping of checks"),
    ({"start": {"points": "x"}}, "cpu_speed.start: expected a mapping with a list of points"),
    ({"start": {"points": [{"table": "gpu.pre_attn"}]}}, "cpu_speed.start.points[0]: expected"),
    ({"end": {"points": [{"table": "cpu.pre_attn", "x": 4, "measured_s": -1}]}},
     "cpu_speed.end.points[0].measured_s: expected a positive number, got -1"),
    ({"start": {"points": [{"table": "cpu.decode_attn", "x": 4, "measured_s": 1e-3}]}},
     "cpu_speed.start.points[0].y: expected a positive number, got None"),
])
def test_a_malformed_record_names_its_field(profile, record, field):
    with pytest.raises(CpuSpeedError, match=field.replace("[", r"\[").replace("]", r"\]")):
        cpu_speed(record, profile)
