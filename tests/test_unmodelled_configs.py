"""A scenario whose roofline model is an MoE config exits 2 with one line naming the field."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dualpace_sim.cli.main import app

runner = CliRunner()

MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
           "sliding_window": None}


def test_an_moe_config_exits_2_naming_the_field(write_scenario, tmp_path):
    config = tmp_path / "mixtral" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(MIXTRAL))
    path = write_scenario(profile=None, roofline={"hardware": "h200-spr16",
                                                  "model": str(config)})
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"roofline: {config}: num_local_experts: mixture-of-experts" in lines[0]
    assert not (tmp_path / "o").exists()
