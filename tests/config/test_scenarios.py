"""Every shipped scenario loads: schema, profile, workload and per-policy fit checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpace_sim.config.scenario import ScenarioError, load_scenario

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
SCENARIOS = sorted(SCENARIO_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_scenario_loads(path, azure_dir, monkeypatch):
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    loaded = load_scenario(path)
    assert loaded.requests and loaded.spec.policies
    for policy in loaded.spec.policies:
        assert loaded.policy_config(policy).block_size == loaded.config.block_size


def test_paper_scenarios_compare_all_three_policies_over_a_sweep():
    paper = [p for p in SCENARIOS if p.parent.name == "paper" and "sensitivity" not in p.name]
    assert len(paper) == 6
    for path in paper:
        text = path.read_text()
        assert "policies: [dualpace, vllm, neo]" in text and "rates: [" in text, path


def test_vllm_needs_its_explicit_limits(write_scenario):
    path = write_scenario(policies=["dualpace", "vllm"])
    with pytest.raises(ScenarioError, match="vllm section with max_num_batched_tokens"):
        load_scenario(path)


def test_neo_refuses_prompts_it_cannot_prefill_whole(write_scenario):
    path = write_scenario(policies=["neo"], neo={"max_tokens_in_batch": 256})
    with pytest.raises(ScenarioError, match="NEO prefills whole prompts"):
        load_scenario(path)


def test_neo_on_a_box_whose_hbm_pool_outgrows_the_host_is_refused_for_that(azure_dir,
                                                                           monkeypatch):
    """The measured H200 box without its scenario's 32 GiB HBM cap: its HBM pool is larger than
    its host pool. The refusal names the pools, not request 0's prompt."""
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    path = SCENARIO_DIR / "h200" / "llama-3.1-8b-conv.yaml"
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, changes={"scheduler": {"gpu_kv_blocks": None}})
    message = str(caught.value)
    assert message.startswith(f"{path}: scheduler: NEO needs "
                              "a host KV pool larger than the HBM pool")
    assert "request 0" not in message and "\n" not in message
