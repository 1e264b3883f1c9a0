"""`--set` overrides and the dotted keys they share with a sweep's grid."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.config.overrides import OverrideError, grid_settings, nested, parse_set

runner = CliRunner()


def test_parse_set_nests_dotted_keys_and_reads_yaml_values():
    assert parse_set(["scheduler.host_kv_blocks=4096", "workload.rate=3",
                      "policies=[dualpace, vllm]", "workload.max_prompt_tokens=null",
                      "name=my study"]) == {
        "scheduler": {"host_kv_blocks": 4096}, "workload": {"rate": 3, "max_prompt_tokens": None},
        "policies": ["dualpace", "vllm"], "name": "my study"}


@pytest.mark.parametrize("item", ["scheduler.host_kv_blocks", "=3", "a..b=1", ".a=1"])
def test_malformed_set_is_refused(item):
    with pytest.raises(OverrideError, match="expected KEY=VALUE"):
        parse_set([item])


def test_a_key_cannot_be_both_a_value_and_a_section():
    with pytest.raises(OverrideError, match="workload.rate: workload is set to a value"):
        nested([("workload", 3), ("workload.rate", 2)])


def test_grid_settings_are_every_combination():
    assert grid_settings({}) == [()]
    assert grid_settings({"a": [1, 2], "b": ["x"]}) == [(("a", 1), ("b", "x")),
                                                        (("a", 2), ("b", "x"))]


def test_set_changes_the_run_and_is_recorded(write_scenario, tmp_path):
    out = tmp_path / "o"
    result = runner.invoke(app, ["run", str(write_scenario()), "-o", str(out), "-q",
                                 "--set", "scheduler.host_kv_blocks=4096",
                                 "--set", "workload.rate=3"])
    assert result.exit_code == 0, result.output
    s = json.loads((out / "summary.json").read_text())[0]
    assert s["rate"] == 3 and s["capacities"]["host_kv_blocks"] == 4096
    assert s["provenance"]["scenario"]["scheduler"]["host_kv_blocks"] == 4096


@pytest.mark.parametrize("args, expected", [
    (["--set", "scheduler.host_kv_blokcs=4096"],
     "with scheduler.host_kv_blokcs=4096: scheduler.host_kv_blokcs: unknown key"),
    (["--set", "workload.rate=-1"], "with workload.rate=-1: workload.rate:"),
    (["--set", "workload.rate"], "--set 'workload.rate': expected KEY=VALUE"),
])
def test_bad_set_exits_2_with_one_line(write_scenario, tmp_path, args, expected):
    path = write_scenario()
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not (tmp_path / "o").exists()


def test_sweep_takes_set_and_hashes_it(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 30}, sweep={"rates": [2.0, 4.0]})
    out = tmp_path / "sw"
    args = ["sweep", str(path), "-o", str(out), "-j", "1", "-q"]
    assert runner.invoke(app, [*args, "--set", "scheduler.host_kv_blocks=4096"]).exit_code == 0
    s = json.loads((out / "points" / "dualpace@2.0" / "summary.json").read_text())[0]
    assert s["capacities"]["host_kv_blocks"] == 4096
    # the same folder with another --set is another scenario: refused, not mixed
    other = runner.invoke(app, [*args, "--set", "scheduler.host_kv_blocks=8192"])
    assert other.exit_code == 2 and "holds a sweep of a different version" in other.output
