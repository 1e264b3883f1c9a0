"""dualpace_sim.experiments.study: a changed scenario run in memory gives the numbers its YAML
would."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from dualpace_sim.config.scenario import ScenarioError, load_scenario
from dualpace_sim.costs import CostModel, ModelShape, load_profile, load_spec, synthesize
from dualpace_sim.experiments.study import (
    ALL_TARGETS,
    COLUMNS,
    extrapolated_tables,
    rate_in_words,
    rate_sweep,
    run_policies,
    sustainable,
)
from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.results.sweep_dir import SWEEP_COLUMNS
from tests.conftest import RTX4090_LLAMA


def test_changes_act_as_if_written_in_the_file(write_scenario):
    base = write_scenario("base.yaml", scheduler={"gpu_kv_blocks": 400})
    edited = write_scenario("edited.yaml", scheduler={"gpu_kv_blocks": 400,
                                                      "host_kv_blocks": 9000},
                            workload={"num_requests": 60, "rate": 6.0})
    changed = run_policies(base, {"scheduler": {"host_kv_blocks": 9000},
                                  "workload": {"num_requests": 60, "rate": 6.0}})
    pd.testing.assert_frame_equal(changed, run_policies(edited))
    assert list(changed.columns)[:len(COLUMNS)] == list(COLUMNS)
    assert "goodput_req_s" in changed.columns and "p90_e2el_s" in changed.columns
    row = changed.iloc[0]
    assert (row["policy"], row["submitted"], row["rate"]) == ("dualpace", 60, 6.0)
    assert (row["gpu_kv_blocks"], row["host_kv_blocks"]) == (400, 9000)
    assert row["cpu_token_fraction"] > 0 and row["h2d_bytes"] > 0  # 400 HBM blocks: CPU tier used


def test_none_restores_the_default_and_other_sections_are_kept(write_scenario):
    path = write_scenario(scheduler={"gpu_kv_blocks": 400, "cpu_batch_limit": 8})
    loaded = load_scenario(path, changes={"scheduler": {"gpu_kv_blocks": None}})
    assert loaded.config.gpu_kv_blocks == loaded.profile.gpu.kv_capacity_blocks
    assert loaded.controls["cpu_batch_limit"].value == 8  # a sibling key stays as written


def test_a_bad_change_names_the_file_the_change_and_the_field(write_scenario):
    path = write_scenario()
    with pytest.raises(ScenarioError, match=r"s\.yaml with scheduler\.host_kv_blocks=0: "
                                            r"scheduler\.host_kv_blocks: Input should be greater"):
        run_policies(path, {"scheduler": {"host_kv_blocks": 0}})
    with pytest.raises(ScenarioError, match=r"with sheduler={}: sheduler: unknown key"):
        load_scenario(path, changes={"sheduler": {}})
    with pytest.raises(ScenarioError, match=r"rates \[2\.0, 1\.0\]: .*strictly increasing"):
        rate_sweep(path, [2.0, 1.0])


def test_a_profile_built_in_code_replaces_the_scenarios(write_scenario):
    path = write_scenario(workload={"num_requests": 40})
    spec = load_spec("rtx4090-xeon4510-12c")
    profile = synthesize(spec, ModelShape.from_name("llama-3.1-8b"), host_kv_gib=20.0)
    loaded = load_scenario(path, profile=profile)
    assert loaded.profile is profile
    assert loaded.config.host_kv_blocks == profile.cpu.kv_capacity_blocks
    assert loaded.profile_source == "in memory:roofline:rtx4090-xeon4510-12c/llama-3.1-8b"
    assert run_policies(path, profile=profile).loc[0, "host_kv_blocks"] == (
        profile.cpu.kv_capacity_blocks)
    broken = profile.model_copy(deep=True)
    broken.gpu.iteration_overhead_s = 1e6
    with pytest.raises(ScenarioError, match="the profile given in its place: .*iteration_overhead"):
        load_scenario(path, profile=broken)


def test_rate_sweep_gives_the_sweep_commands_numbers(write_scenario, tmp_path):
    fields = dict(policies=["dualpace", "vllm"],
                  vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256},
                  scheduler={"gpu_kv_blocks": 400}, workload={"num_requests": 40},
                  sweep={"rates": [2.0, 8.0]})
    table = rate_sweep(write_scenario(**fields), [2.0, 8.0])
    assert list(zip(table["policy"], table["rate"], strict=True)) == [
        ("dualpace", 2.0), ("dualpace", 8.0), ("vllm", 2.0), ("vllm", 8.0)]
    swept = run_sweep(write_scenario(**fields), tmp_path / "sweep", workers=1, progress=False)
    assert list(swept.table.columns[:len(SWEEP_COLUMNS)]) == list(SWEEP_COLUMNS)
    pd.testing.assert_frame_equal(table[list(swept.table.columns)], swept.table,
                                  check_dtype=False)


def _table(policy: str, rates, **metrics) -> pd.DataFrame:
    return pd.DataFrame({"policy": policy, "rate": rates, **metrics})


def test_sustainable_rates_per_target_and_for_all_at_once():
    targets = {"normalized_latency_s": 1.0, "p99_ttft_s": 5.0, "p99_itl_s": 1.5,
               "p99_tpot_s": 1.0}
    table = pd.concat([
        _table("a", [1.0, 2.0, 3.0], normalized_latency_s=[0.5, 0.8, 1.2],  # crosses at 2.5
               p99_ttft_s=[1.0, 2.0, 3.0],  # holds over the sweep
               p99_itl_s=[0.3, 0.6, 3.0],  # crosses at 2 + 0.9 / 2.4 = 2.375
               p99_tpot_s=[0.1, 0.2, 0.3]),
        _table("b", [1.0, 2.0, 3.0], normalized_latency_s=[2.0, 3.0, math.nan],  # fails at once
               p99_ttft_s=[1.0, 1.0, 1.0], p99_itl_s=[1.0, 1.0, 1.0], p99_tpot_s=[1.0, 1.0, 1.0]),
    ], ignore_index=True)
    got = sustainable(table, targets).set_index(["policy", "metric"])
    columns = ["rate", "bound", "text", "limited_by"]
    assert got.loc[("a", "normalized_latency_s"), columns].tolist() == [
        pytest.approx(2.5), "=", "2.5", "normalized_latency_s"]
    assert got.loc[("a", "p99_ttft_s"), columns].tolist() == [3.0, ">=", "> 3", ""]
    assert got.loc[("a", "p99_itl_s"), "rate"] == pytest.approx(2.375)
    # every target at once: the lowest per-target rate, here ITL's
    assert got.loc[("a", ALL_TARGETS), columns].tolist() == [
        pytest.approx(2.375), "=", "2.38", "p99_itl_s"]
    assert np.isnan(got.loc[("a", ALL_TARGETS), "target"])
    assert got.loc[("b", ALL_TARGETS), columns].tolist() == [
        1.0, "<", "< 1", "normalized_latency_s"]
    assert len(got) == 2 * (len(targets) + 1)
    held = sustainable(table[table.policy == "a"].assign(
        normalized_latency_s=0.1, p99_itl_s=0.1), targets).set_index("metric")
    assert held.loc[ALL_TARGETS, ["rate", "bound", "limited_by"]].tolist() == [3.0, ">=", ""]


def test_rates_in_words_say_which_side_of_the_sweep():
    assert rate_in_words(3.4166, "=") == "3.42 req/s"
    assert rate_in_words(6.0, ">=") == "at least 6.00 req/s"
    assert rate_in_words(1.0, "<") == "below 1.00 req/s"


def test_extrapolations_are_collected_by_table_and_other_warnings_pass():
    cost = CostModel(load_profile(RTX4090_LLAMA))
    with pytest.warns(UserWarning, match="unrelated"), extrapolated_tables() as tables:
        cost.gpu_linear(100_000)  # beyond the 16,384-token tables
        CostModel(cost.profile).gpu_linear(200_000)  # a second model warns again
        warnings.warn("unrelated", UserWarning, stacklevel=1)
    assert tables == ["gpu.post_attn", "gpu.pre_attn"]
