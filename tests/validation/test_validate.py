"""`dualpace-sim validate`: the simulator against a real run of the same scenario.

The "real" run here is the simulator's own `run` output, so an unperturbed comparison must give
zero error everywhere (the simulator is deterministic), and a perturbed one errors of known sign.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.experiments.runner import run_scenario
from dualpace_sim.results.provenance import RUN_PROFILE
from dualpace_sim.results.records import read_records, write_records
from dualpace_sim.validation.validate import (
    COLUMNS,
    METRICS,
    format_table,
    relative_error,
    validate,
)
from tests.conftest import RTX4090_LLAMA

runner = CliRunner()

# A small pool of HBM, so that DualPace decodes on the CPU and vLLM queues: every metric is live.
FIELDS = dict(
    policies=["dualpace", "vllm"],
    vllm={"max_num_batched_tokens": 2048, "max_num_seqs": 256},
    scheduler={"gpu_kv_blocks": 300},
    workload={"num_requests": 40, "rate": 8.0},
)


@pytest.fixture
def real_run(write_scenario, tmp_path):
    """(scenario path, directory written as `dualpace-sim run` writes it)."""
    scenario = write_scenario(**FIELDS)
    real = tmp_path / "real"
    run_scenario(scenario, real, progress=False)
    return scenario, real


def invoke(*args: str):
    return runner.invoke(app, ["validate", *map(str, args)])


def test_same_scenario_gives_zero_error(real_run, tmp_path):
    scenario, real = real_run
    result = invoke("--real", real, scenario)
    assert result.exit_code == 0, result.output
    out = real / "validation"  # the default
    table = pd.read_csv(out / "validation.csv")
    assert tuple(table.columns) == COLUMNS
    assert list(table["policy"].unique()) == ["dualpace", "vllm"]
    assert list(table["metric"]) == list(METRICS) * 2
    assert (table["relative_error"] == 0).all(), table
    assert (table["simulated"] == table["real"]).all()
    cpu = table[(table["policy"] == "dualpace") & (table["metric"] == "cpu_token_fraction")]
    assert cpu["real"].item() > 0  # the CPU tier really was exercised
    # the simulated run is written as `run` writes it, and equals the "real" one
    sim = read_records(out / "sim" / "requests.parquet")
    pd.testing.assert_frame_equal(sim, read_records(real / "requests.parquet"))
    summary = json.loads((out / "sim" / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["dualpace", "vllm"]
    for stem in ("timeline_overlay", "latency_cdf_overlay"):
        for ext in (".png", ".pdf"):
            assert (out / f"{stem}{ext}").stat().st_size > 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["policy", "metric", "simulated", "real", "rel.", "error"]
    assert sum("+0.0%" in line for line in lines) == 2 * len(METRICS)
    assert "warning" not in result.output and "note" not in result.output


def test_out_option_and_quiet(real_run, tmp_path):
    scenario, real = real_run
    result = invoke("--real", real, scenario, "--out", tmp_path / "v", "--quiet")
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert (tmp_path / "v" / "validation.csv").is_file()
    assert not (real / "validation").exists()


def _slow_down(df: pd.DataFrame, factor: float) -> pd.DataFrame:
    """Every token `factor` times later after its request's arrival (arrivals unchanged)."""
    df = df.copy()
    df["token_times_s"] = [a + factor * (np.asarray(t) - a)
                           for a, t in zip(df["arrival_s"], df["token_times_s"], strict=True)]
    df["first_token_s"] = [t[0] for t in df["token_times_s"]]
    df["finish_s"] = [t[-1] for t in df["token_times_s"]]
    return df


def test_slower_real_run_gives_errors_of_the_right_sign(real_run, tmp_path):
    scenario, real = real_run
    write_records(_slow_down(read_records(real / "requests.parquet"), 1.1),
                  real / "requests.parquet")
    result = validate(real, scenario, tmp_path / "v")
    err = {(r.policy, r.metric): r.relative_error for r in result.table.itertuples()}
    for policy in ("dualpace", "vllm"):
        # latencies scale by exactly 1.1: the simulator is 1/1.1 - 1 = -9.1% off
        for metric in ("normalized_latency_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s",
                       "p99_itl_s", "p99_tpot_s"):
            assert err[policy, metric] == pytest.approx(1 / 1.1 - 1, rel=1e-9), metric
        assert 0 < err[policy, "throughput_tok_s"] < 0.1 + 1e-9  # real is slower
        assert -1 / 11 - 1e-9 < err[policy, "makespan_s"] < 0
        assert err[policy, "cpu_token_fraction"] == 0
    # summary.json was left as it was: it no longer matches its records, and that is said
    assert any(n.startswith("warning: dualpace: summary.json disagrees") for n in result.notes)
    csv = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert (csv["relative_error"].to_numpy() == result.table["relative_error"].to_numpy()).all()


def test_shifted_arrivals_are_a_note_not_an_error(real_run, tmp_path):
    scenario, real = real_run
    df = read_records(real / "requests.parquet")
    df["arrival_s"] = df["arrival_s"] + np.where(df["request_id"] == 3, 0.002, 0.0)
    write_records(df, real / "requests.parquet")
    result = invoke("--real", real, scenario, "--out", tmp_path / "v")
    assert result.exit_code == 0, result.output
    assert "note: dualpace's real arrivals deviate from the scenario's by up to 2 ms" \
        in result.output


def _one_line_error(result, *patterns: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    for p in patterns:
        assert p in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("missing", ["summary.json", "requests.parquet", "."])
def test_missing_real_files_are_one_line(real_run, missing):
    scenario, real = real_run
    if missing == ".":
        real = real / "nope"
    else:
        (real / missing).unlink()
    _one_line_error(invoke("--real", real, scenario), str(real),
                    "no such directory" if missing == "." else f"no {missing}")


def test_unreadable_real_files_are_one_line(real_run):
    scenario, real = real_run
    (real / "summary.json").write_text("{not json")
    _one_line_error(invoke("--real", real, scenario), "summary.json: not valid JSON")
    (real / "summary.json").write_text("[]")
    _one_line_error(invoke("--real", real, scenario), "expected a non-empty JSON list")
    (real / "summary.json").write_text(json.dumps([{"policy": "dualpace"}]))
    _one_line_error(invoke("--real", real, scenario),
                    "requests.parquet has rows of policy 'vllm' but summary.json does not")
    (real / "requests.parquet").write_bytes(b"not parquet")
    _one_line_error(invoke("--real", real, scenario), "requests.parquet")


def test_an_unreadable_run_profile_is_one_line(real_run):
    scenario, real = real_run
    (real / RUN_PROFILE).write_text("format: dualpace-profile/1\nmodel: {name: x}\n")
    line = _one_line_error(invoke("--real", real, scenario), f"{real / RUN_PROFILE}:",
                           "delete it to compare with the scenario's profile")
    assert line.count(str(real / RUN_PROFILE)) == 1


def test_policy_not_in_scenario_is_one_line(real_run, write_scenario):
    _, real = real_run
    other = write_scenario("dualpace-only.yaml", **{**FIELDS, "policies": ["dualpace"]})
    _one_line_error(invoke("--real", real, other), "ran policy 'vllm'", str(other))


def test_scenario_policy_without_a_real_run_is_left_out(real_run, tmp_path):
    scenario, real = real_run
    df = read_records(real / "requests.parquet")
    write_records(df[df["policy"] == "vllm"], real / "requests.parquet")
    summary = json.loads((real / "summary.json").read_text())
    (real / "summary.json").write_text(json.dumps([s for s in summary if s["policy"] == "vllm"]))
    result = invoke("--real", real, scenario, "--out", tmp_path / "v")
    assert result.exit_code == 0, result.output
    assert "also lists dualpace, which" in result.output
    table = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert set(table["policy"]) == {"vllm"} and (table["relative_error"] == 0).all()


@pytest.mark.parametrize("change, expected", [
    ({"num_requests": 30}, "has 40 requests but the scenario's workload has 30"),
    ({"rate": 6.0}, "ran at 8 req/s but"),
    ({"max_output_tokens": 50}, "max_tokens"),
])
def test_other_workload_is_one_line(real_run, write_scenario, change, expected):
    _, real = real_run
    other = write_scenario("other.yaml", **{**FIELDS, "workload": {**FIELDS["workload"],
                                                                     **change}})
    _one_line_error(invoke("--real", real, other), expected)


def test_bad_scenario_is_one_line(real_run, tmp_path):
    _, real = real_run
    _one_line_error(invoke("--real", real, tmp_path / "missing.yaml"), "no such scenario file")


def test_relative_error_edge_cases():
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert relative_error(0.9, 1.0) == pytest.approx(-0.1)
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(0.5, 0.0) == math.inf
    assert math.isnan(relative_error(math.nan, 1.0))
    assert math.isnan(relative_error(1.0, math.nan))


def test_format_table_is_aligned():
    table = pd.DataFrame([("dualpace", "p99_ttft_s", 1.5, 1.0, 0.5),
                          ("vllm", "cpu_token_fraction", 0.0, 0.0, 0.0),
                          ("neo", "p99_tpot_s", math.nan, 2.0, math.nan)], columns=list(COLUMNS))
    lines = format_table(table).splitlines()
    assert len(lines) == 5
    assert len({len(line) for line in lines[:2]}) == 1  # header as wide as its rule
    assert lines[2].endswith("+50.0%") and lines[4].endswith("n/a")
    ends = {len(line) for line in lines[2:]}
    assert len(ends) == 1  # numbers right-aligned to the same column


def set_in_summary(real, key: str, value) -> list[dict]:
    """Set `key` in every policy's summary of the real run; returns the summaries."""
    summary = json.loads((real / "summary.json").read_text())
    for s in summary:
        s[key] = value
    (real / "summary.json").write_text(json.dumps(summary))
    return summary


def test_a_cpu_split_other_than_the_profiles_is_a_note(real_run):
    """A real run with the CPU engine as 2 tensor-parallel ranks, checked against a profile of
    one: its CPU costs are another engine's, and validate says so."""
    scenario, real = real_run
    set_in_summary(real, "cpu_tp", 2)
    result = validate(real, scenario)
    tp_notes = [n for n in result.notes if "tensor-parallel" in n]
    assert len(tp_notes) == 1
    assert "2 tensor-parallel rank(s), the profile describes 1" in tp_notes[0]


def test_a_gpu_split_other_than_the_profiles_is_a_note(real_run):
    """A real run on 2 tensor-parallel GPUs checked against a one-GPU profile: noted for every
    policy, naming the flag that profiles the box the same way."""
    scenario, real = real_run
    summary = set_in_summary(real, "gpu_tp", 2)
    result = validate(real, scenario)
    notes = [n for n in result.notes if "tensor-parallel GPU" in n]
    assert len(notes) == len(summary)
    assert all("profile describes 1" in n and "--gpu-tp 2" in n for n in notes)


def test_a_run_is_compared_with_the_profile_it_was_made_with(write_scenario, tmp_path):
    """A box re-profiled after a real run: the run's own profile.yaml (which `dualpace-hw run`
    writes) is what it is compared with and replayed against, with a note; without that file
    the scenario's current profile would give other numbers."""
    from dualpace_sim.costs import load_profile

    made_with = load_profile(RTX4090_LLAMA)
    made_with = made_with.model_copy(update={"cpu": made_with.cpu.model_copy(
        update={"iteration_overhead_s": made_with.cpu.iteration_overhead_s + 0.02})})
    made_with.save(tmp_path / "then.yaml")
    scenario_then = write_scenario("then.yaml.scenario", profile=str(tmp_path / "then.yaml"),
                                   **FIELDS)
    real = tmp_path / "real"
    run_scenario(scenario_then, real, progress=False)
    scenario_now = write_scenario(**FIELDS)  # the scenario, its profile since replaced

    stale = validate(real, scenario_now, tmp_path / "stale")
    assert (stale.table["relative_error"] != 0).any()

    made_with.save(real / RUN_PROFILE)
    result = validate(real, scenario_now, tmp_path / "fair")
    assert (result.table["relative_error"] == 0).all(), result.table
    assert any("has changed since this run" in n for n in result.notes)


def test_costs_from_another_profile_keep_the_runs_controls(real_run, tmp_path):
    """`--costs`: a re-profile of the box prices the run, the run's (fitted) controls still
    make the decisions; the run's own costs give zero error, dearer costs a positive one; a
    profile of another model is refused naming the file."""
    from dualpace_sim.costs import load_profile

    scenario, real = real_run
    same = validate(real, scenario, tmp_path / "same", costs=RTX4090_LLAMA)
    assert (same.table["relative_error"] == 0).all(), same.table
    assert any(n.startswith(f"costs from {RTX4090_LLAMA}") for n in same.notes)

    base = load_profile(RTX4090_LLAMA)
    dearer = base.model_copy(update={"gpu": base.gpu.model_copy(
        update={"iteration_overhead_s": base.gpu.iteration_overhead_s + 0.002})})
    dearer.save(tmp_path / "dearer.yaml")
    result = validate(real, scenario, tmp_path / "dearer", costs=tmp_path / "dearer.yaml")
    err = {(r.policy, r.metric): r.relative_error for r in result.table.itertuples()}
    for policy in ("dualpace", "vllm"):
        assert err[policy, "normalized_latency_s"] > 0
    # a re-profile whose own fit differs: the run's controls are what the simulator uses
    from dualpace_sim.config.scenario import load_scenario
    from dualpace_sim.costs.profile import Controls
    from dualpace_sim.validation.validate import load_for_real_run

    ran = load_scenario(scenario).controls
    refit = dearer.model_copy(update={"controls": Controls(
        route_p=0, route_f=0, gpu_token_limit=ran["gpu_token_limit"].value // 2,
        cpu_batch_limit=ran["cpu_batch_limit"].value + 1)})
    refit.save(tmp_path / "refit.yaml")
    loaded, _ = load_for_real_run(scenario, real, tmp_path / "refit.yaml")
    assert {k: c.value for k, c in loaded.controls.items()} == {k: c.value for k, c in ran.items()}
    assert loaded.profile.gpu.iteration_overhead_s == dearer.gpu.iteration_overhead_s

    other = load_profile(RTX4090_LLAMA)
    other = other.model_copy(update={"block_size": other.block_size * 2})
    other.save(tmp_path / "other.yaml")
    _one_line_error(invoke("--real", real, scenario, "--costs", tmp_path / "other.yaml"),
                    f"{tmp_path / 'other.yaml'}: block size", "--costs must profile")


def test_a_quick_profile_is_noted(real_run, tmp_path):
    """The profile that prices the run, REAL/profile.yaml or --costs, made with the profiler's
    --quick grids (the `quick` field, or an older profile's `--quick` command): a note names it;
    a full profile gets none."""
    from dualpace_sim.costs import load_profile

    scenario, real = real_run
    base = load_profile(RTX4090_LLAMA)

    def variant(name: str, **provenance) -> Path:
        profile = base.model_copy(update={"provenance": base.provenance.model_copy(
            update={"method": "measured", **provenance})})
        profile.save(tmp_path / name)
        return tmp_path / name

    def quick_notes(result) -> list[str]:
        return [n for n in result.notes if "quick profile" in n]

    shutil.copy(variant("quick.yaml", quick=True), real / RUN_PROFILE)
    notes = quick_notes(validate(real, scenario, tmp_path / "ran-quick"))
    assert len(notes) == 1 and notes[0].startswith(f"note: {real / RUN_PROFILE} is a quick "
                                                   "profile (`dualpace-hw profile --quick`")
    assert "re-profile the box without --quick" in notes[0]

    older = variant("older.yaml", command="dualpace-hw profile --model m --out p.yaml --quick")
    notes = quick_notes(validate(real, scenario, tmp_path / "costs-quick", costs=older))
    assert len(notes) == 1 and notes[0].startswith(f"note: {older} is a quick profile")

    full = variant("full.yaml", quick=False)
    assert quick_notes(validate(real, scenario, tmp_path / "costs-full", costs=full)) == []


def test_a_run_served_on_a_host_of_other_read_bandwidth_is_noted(real_run, tmp_path):
    """The run's host read bandwidth (its summary's, `dualpace-hw run` measures it) more than
    5 % off the profile's: one note with both figures, the difference and what it means; none
    within 5 %, nor where either side lacks the figure (older runs and profiles), nor for a
    policy whose run checked its CPU engine's speed (the check supersedes the probe)."""
    from dualpace_sim.costs import load_profile
    from dualpace_sim.validation.validate import host_read_notes, read_real_run

    scenario, real = real_run
    base = load_profile(RTX4090_LLAMA)
    assert base.provenance.host_read_bytes_per_s is None  # an older profile still loads
    profiled = base.model_copy(update={"provenance": base.provenance.model_copy(
        update={"method": "measured", "host_read_bytes_per_s": 93e9})})
    profiled.save(real / RUN_PROFILE)
    assert load_profile(real / RUN_PROFILE).provenance.host_read_bytes_per_s == 93e9

    assert host_read_notes(read_real_run(real), profiled) == []  # the run has no figure
    set_in_summary(real, "host_read_bytes_per_s", 75e9)
    notes = [n for n in validate(real, scenario, tmp_path / "slower").notes if "GB/s" in n]
    assert notes == [
        f"note: {real}: dualpace, vllm served on a host reading memory at 75.0 GB/s, 19% less "
        "than the 93.0 GB/s of the profile's host: the CPU engine's memory-bound stages "
        "(pre-attention at a few rows, decode attention at large batches) ran about 1.24x "
        "their tables' times there (slower), its compute-bound ones as tabled; re-profile on "
        "the serving machine, or profile and serve in the same session"]
    assert host_read_notes(read_real_run(real), base) == []  # the profile has no figure

    set_in_summary(real, "host_read_bytes_per_s", 90e9)  # 3 % less
    assert host_read_notes(read_real_run(real), profiled) == []
    summary = set_in_summary(real, "host_read_bytes_per_s", 100e9)
    summary[1]["host_read_bytes_per_s"] = 93e9  # vllm served in another call, on another host
    (real / "summary.json").write_text(json.dumps(summary))
    notes = host_read_notes(read_real_run(real), profiled)
    assert len(notes) == 1 and notes[0].startswith(f"note: {real}: dualpace served on a host "
                                                   "reading memory at 100.0 GB/s, 8% more")
    assert "0.93x their tables' times there (faster)" in notes[0]
    summary[0]["cpu_speed"] = {"start": {"pre_attn": 1.0, "points": []}, "end": None}
    summary[1]["host_read_bytes_per_s"] = 100e9
    (real / "summary.json").write_text(json.dumps(summary))
    notes = host_read_notes(read_real_run(real), profiled)  # dualpace's check timed its stages
    assert len(notes) == 1 and notes[0].startswith(f"note: {real}: vllm served on a host ")


def test_a_runs_cpu_speed_prices_its_cpu_stages(real_run, tmp_path):
    """A run that checked its CPU engine at twice the profile's speed (its summary's
    `cpu_speed`): DualPace is simulated with its CPU stages at that speed (a note says so) and
    comes out faster than the run, made at the profile's speed; vLLM, without a check, is not
    touched; --cpu-speed profile prices as profiled (zero error again), and a check at exactly
    the profile's speed changes nothing."""
    from dualpace_sim.costs import CostModel, load_profile

    scenario, real = real_run
    cost = CostModel(load_profile(RTX4090_LLAMA))

    def record(factor: float) -> dict:
        return {"start": {"points": [
            {"table": "cpu.pre_attn", "x": 64, "measured_s": factor * cost.cpu_pre_attn(64)},
            {"table": "cpu.decode_attn", "x": 64, "y": 65536,
             "measured_s": factor * cost.cpu_decode_attn(64, 65536)}]}}

    summary = json.loads((real / "summary.json").read_text())
    summary[0]["cpu_speed"] = record(0.5)
    (real / "summary.json").write_text(json.dumps(summary))
    result = invoke("--real", real, scenario, "--out", tmp_path / "run-speed")
    assert result.exit_code == 0, result.output
    assert ("note: dualpace's run timed its CPU engine's cores at 0.50x the profile's CPU dense "
            "stages and 0.50x its decode attention (1 check(s))") in result.output
    table = pd.read_csv(tmp_path / "run-speed" / "validation.csv").set_index(["policy", "metric"])
    assert table.loc[("dualpace", "normalized_latency_s"), "relative_error"] < 0
    assert (table.loc["vllm", "relative_error"] == 0).all()

    result = invoke("--real", real, scenario, "--out", tmp_path / "profiled", "--cpu-speed",
                    "profile")
    assert result.exit_code == 0 and "timed its CPU" not in result.output, result.output
    assert (pd.read_csv(tmp_path / "profiled" / "validation.csv")["relative_error"] == 0).all()

    summary[0]["cpu_speed"] = record(1.0)
    (real / "summary.json").write_text(json.dumps(summary))
    assert (validate(real, scenario, tmp_path / "as-profiled").table["relative_error"] == 0).all()

    summary[0]["cpu_speed"] = {"start": {"points": [{"table": "cpu.pre_attn", "x": "64"}]}}
    (real / "summary.json").write_text(json.dumps(summary))
    result = invoke("--real", real, scenario, "--out", tmp_path / "bad")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"error: {real / 'summary.json'}: dualpace: cpu_speed.start.points[0].measured_s: "
        "expected a positive number, got None; delete the record to price the run as profiled")


def test_a_stalled_gpu_round_of_a_real_run_is_a_note(tmp_path, azure_dir, monkeypatch):
    """A round that took far longer than its plan's price (a garbage collection held the H200
    box's GPU engine 0.2-0.5 s) is named, with its length and time. The committed 8 req/s run
    has one, 0.16 s three seconds in (its runtime still made full collections while serving);
    holding one more round 0.5 s makes two, that one the longest."""
    import gzip

    from dualpace_sim.results.replay import replay_run
    from dualpace_sim.validation.validate import load_for_real_run, read_real_run, stall_notes
    from tests.conftest import REPO_ROOT

    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))  # the scenario replays an Azure trace
    scenario = REPO_ROOT / "scenarios/h200/validation/llama-3.1-8b-r8.yaml"
    served = REPO_ROOT / "docs/validation/r8/real"
    loaded = load_for_real_run(scenario, served, None)[0]
    (note,) = stall_notes(read_real_run(served), loaded, replay_run(served, loaded))
    assert note.startswith("note: dualpace's real GPU engine stalled in 1 round(s)")
    assert "the longest 0.16 s at 3.0 s into the run" in note

    real = tmp_path / "real"
    shutil.copytree(served, real)
    path = real / "journal-dualpace.jsonl.gz"
    with gzip.open(path, "rt") as f:
        entries = [json.loads(line) for line in f]
    applies = [i for i, e in enumerate(entries) if e["engine"] == "gpu" and e["call"] == "apply"]
    held = applies[len(applies) // 2]  # this round ends 0.5 s late, and all after it with it
    for e in entries[held:]:
        e["t"] += 0.5
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    replays = replay_run(real, loaded)  # the held round's times: the plans replay all the same
    assert all(r.plans_match for r in replays)
    (note,) = stall_notes(read_real_run(real), loaded, replays)
    assert note.startswith("note: dualpace's real GPU engine stalled in 2 round(s)")
    assert "the longest 0.5" in note
