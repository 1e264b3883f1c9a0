"""`--checkpoint` on `run` and `profile`: the run harness builds both engines over the
checkpoint's weights, replays the scenario with them and writes the usual results; a checkpoint
that is not the scenario's model, or not a checkpoint, is refused naming the flag."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dualpace_hw.cli import app
from dualpace_hw.serving.serve import build_runtime, open_checkpoint
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.costs import load_profile
from tests.hw.checkpoints import make_checkpoint, tiny_scenario

pytestmark = pytest.mark.usefixtures("keep_the_cores")


@pytest.fixture(scope="module")
def ck_path(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck"), "qwen3")


def test_the_runtime_runs_the_checkpoint_s_weights_on_both_engines(tmp_path, ck_path):
    loaded = load_scenario(tiny_scenario(tmp_path / "s.yaml", ck_path, ["vllm"]))
    ck = open_checkpoint(ck_path, loaded)
    runtime = build_runtime(loaded, "vllm", "cpu", None, dtype=torch.float32, checkpoint=ck)
    torch.testing.assert_close(runtime.gpu.model.w.embed, ck.weights(dtype=torch.float32).embed)
    assert runtime.gpu.model.shape == ck.shape and len(runtime.requests) == 4


def test_run_with_a_checkpoint_writes_the_run(tmp_path, ck_path):
    scenario = tiny_scenario(tmp_path / "s.yaml", ck_path, ["dualpace"])
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--device",
                                      "cpu", "--checkpoint", str(ck_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())[0]
    assert summary["completed"] == summary["submitted"] == 4


def test_a_checkpoint_of_another_model_is_refused_naming_the_fields(tmp_path, ck_path):
    other = make_checkpoint(tmp_path / "llama", "llama")
    scenario = tiny_scenario(tmp_path / "s.yaml", ck_path, ["dualpace"])
    for command in ("run", "serve"):
        result = CliRunner().invoke(app, [command, str(scenario), "--out", str(tmp_path / "o"),
                                          "--device", "cpu", "--checkpoint", str(other)])
        assert result.exit_code == 2, result.output
        assert f"--checkpoint {other}: its config.json is not the model" in result.output
        assert "head_dim 32 != 16" in result.output
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "o"),
                                      "--device", "cpu", "--checkpoint", str(tmp_path)])
    assert result.exit_code == 2 and "no config.json" in result.output


def test_profile_takes_a_checkpoint_instead_of_a_model(tmp_path, ck_path):
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["profile", "--checkpoint", str(ck_path), "--out", str(out),
                                      "--quick", "--gpu-device", "cpu", "--cpu-cores", "1",
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.model.head_dim == 32 and profile.model.qk_norm
    assert f"--checkpoint {ck_path}" in profile.provenance.command
    for args in ([], ["--model", "tiny-llama", "--checkpoint", str(ck_path)]):
        result = CliRunner().invoke(app, ["profile", "--out", str(out), *args])
        assert result.exit_code == 2 and "give one of --model" in result.output
