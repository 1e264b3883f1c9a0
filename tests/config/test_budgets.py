"""GPU batch budgets: the note when the policies' budgets differ, and `shared_gpu_budget`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.config.budgets import GpuBudget, unequal_budget_note, with_budget
from dualpace_sim.config.scenario import ScenarioError, load_scenario
from dualpace_sim.core import SchedulerConfig

runner = CliRunner()
VLLM = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
NOTE = "note: the policies run with different GPU batch budgets"


@pytest.fixture
def three(write_scenario):
    """DualPace, vLLM and NEO on the RTX 4090 roofline; DualPace's token limit is its fit."""

    def write(**fields):
        return write_scenario(policies=["dualpace", "vllm", "neo"], vllm=VLLM,
                              neo={"max_tokens_in_batch": 8192}, **fields)

    return write


def test_the_note_names_every_policys_budget_and_its_keys():
    note = unequal_budget_note({"dualpace": GpuBudget(1024, 256),
                                "vllm": GpuBudget(8192, 1024)})
    assert "\n" not in note
    assert "dualpace 1024 tokens and 256 rows (scheduler.gpu_token_limit, " \
           "scheduler.gpu_max_rows)" in note
    assert "vllm 8192 tokens and 1024 rows (vllm.max_num_batched_tokens, " \
           "vllm.max_num_seqs)" in note
    assert note.endswith("set shared_gpu_budget: <policy> to give every policy that one's")


def test_equal_budgets_or_one_policy_get_no_note():
    assert unequal_budget_note({"dualpace": GpuBudget(2048, 256)}) is None
    assert unequal_budget_note({"vllm": GpuBudget(2048, 256),
                                "neo": GpuBudget(2048, 256)}) is None


def test_a_larger_budget_lifts_dualpaces_hard_cap_to_it():
    config = with_budget(SchedulerConfig(gpu_kv_blocks=64, host_kv_blocks=128,
                                         gpu_hard_token_limit=8192), GpuBudget(16384, 512))
    assert (config.gpu_batch_tokens, config.gpu_max_rows) == (16384, 512)
    smaller = with_budget(SchedulerConfig(gpu_kv_blocks=64, host_kv_blocks=128),
                          GpuBudget(512, 32))
    assert (smaller.gpu_batch_tokens, smaller.gpu_hard_token_limit) == (512, 8192)


def test_own_budgets_differ_and_the_loaded_scenario_says_so(three):
    loaded = load_scenario(three())
    fitted = loaded.controls["gpu_token_limit"]
    assert fitted.source == "fit of the profile" and fitted.value != 8192
    assert loaded.gpu_budget("dualpace") == GpuBudget(fitted.value, 256)
    assert loaded.gpu_budget("vllm") == GpuBudget(8192, 1024)
    assert loaded.gpu_budget("neo") == GpuBudget(8192, 512)
    assert loaded.budget_note().startswith("the policies run with different GPU batch budgets")


def test_sharing_vllms_budget_changes_dualpaces_and_neos_resolved_config(three):
    loaded = load_scenario(three(shared_gpu_budget="vllm"))
    assert (loaded.config.gpu_token_limit, loaded.config.gpu_max_rows) == (8192, 1024)
    assert loaded.controls["gpu_token_limit"].source == "shared_gpu_budget: vllm"
    neo = loaded.policy_config("neo")
    assert (neo.max_tokens_in_batch, neo.max_batch_size) == (8192, 1024)
    assert loaded.budget_note() is None


def test_sharing_dualpaces_budget_gives_the_baselines_its_fitted_limit(three):
    own = load_scenario(three())
    loaded = load_scenario(three(shared_gpu_budget="dualpace", workload={
        "max_prompt_tokens": own.config.gpu_token_limit}))  # NEO prefills prompts whole
    tokens = own.config.gpu_token_limit
    assert loaded.config == own.config
    vllm, neo = loaded.policy_config("vllm"), loaded.policy_config("neo")
    assert (vllm.max_num_batched_tokens, vllm.max_num_seqs) == (tokens, 256)
    assert (neo.max_tokens_in_batch, neo.max_batch_size) == (tokens, 256)
    assert loaded.budget_note() is None


def test_a_refusal_under_a_shared_budget_says_where_the_budget_came_from(three):
    with pytest.raises(ScenarioError, match=r"NEO prefills whole prompts .* \(neo's GPU batch "
                                            r"budget is dualpace's here, from shared_gpu_budget"):
        load_scenario(three(shared_gpu_budget="dualpace"))


def test_the_shared_budget_must_be_one_of_the_policies(write_scenario):
    with pytest.raises(ScenarioError, match="shared_gpu_budget: vllm is not one of the policies "
                                            r"\(dualpace\); name one of them"):
        load_scenario(write_scenario(shared_gpu_budget="vllm"))


def test_run_prints_one_note_unless_the_budget_is_shared(three, tmp_path):
    result = runner.invoke(app, ["run", str(three()), "--out", str(tmp_path / "a"), "--quiet"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "GPU batch budget" in line]
    assert len(notes) == 1 and notes[0].startswith(NOTE)
    shared = runner.invoke(app, ["run", str(three()), "--out", str(tmp_path / "b"), "--quiet",
                                 "--set", "shared_gpu_budget=vllm"])
    assert shared.exit_code == 0, shared.output
    assert "GPU batch budget" not in shared.stderr
    controls = {s["policy"]: s["controls"] for s in
                json.loads((tmp_path / "b" / "summary.json").read_text())}
    assert controls["dualpace"]["gpu_token_limit"] == {"value": 8192,
                                                       "source": "shared_gpu_budget: vllm"}
    assert controls["neo"]["max_batch_size"] == {"value": 1024,
                                                 "source": "shared_gpu_budget: vllm"}
    assert controls["neo"]["linr_s_threshold"]["source"] == "scenario"
    assert controls["vllm"]["max_num_seqs"] == {"value": 1024, "source": "scenario"}


def test_sweep_prints_one_note_naming_the_grid_setting(three, tmp_path):
    path = three(workload={"num_requests": 20},
                 sweep={"rates": [1.0, 2.0], "grid": {"shared_gpu_budget": [None, "vllm"]}})
    result = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "sw"),
                                 "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "GPU batch budget" in line]
    assert len(notes) == 1 and notes[0].startswith("note: at shared_gpu_budget=None: the "
                                                   "policies run with different")
