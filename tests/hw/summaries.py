"""What a real run's summary.json must hold: the simulator's summary shape, plus the real
run's own keys and counters, every key in the output reference."""

from __future__ import annotations

from dualpace_sim.results import output_reference as ref


def check_real_summary(summary: dict) -> None:
    """`summary` (one policy's entry) has every key the simulator's has, in the same order,
    and nothing the output reference does not describe, its engine counters included."""
    undescribed = [k for k in summary if not ref.documented(k, ref.SUMMARY)
                   and not ref.documented(k, ref.REAL_SUMMARY)]
    assert not undescribed, f"describe {undescribed} in output_reference.REAL_SUMMARY"
    shared = [k for k in summary if ref.documented(k, ref.SUMMARY)]
    missing = [r for r, _, _ in ref.SUMMARY if not any(ref.pattern(r).match(k) for k in shared)]
    assert not missing, f"a real run's summary lacks the simulator's {missing}"
    engine = [k for k in summary["engine"] if not ref.documented(k, ref.REAL_ENGINE)]
    assert not engine, f"describe {engine} in output_reference.REAL_ENGINE"
    for key in ("gpu_utilisation", "cpu_utilisation"):
        assert 0 <= summary[key] <= 1, (key, summary[key])
