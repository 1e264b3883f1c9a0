"""A newcomer's first mistakes in a scenario get a line that says where and what to do."""

from __future__ import annotations

import pytest

from dualpace_sim.config.scenario import ScenarioError, read_scenario
from tests.conftest import RTX4090_LLAMA

BASE = f"name: x\nprofile: {RTX4090_LLAMA}\nworkload: {{rate: 2}}\n"


def error(tmp_path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        read_scenario(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message[len(f"{path}: "):]


def test_yaml_syntax_errors_keep_line_and_column(tmp_path):
    assert error(tmp_path, "name: x\nworkload: {rate: 2\n  num: [1\n") == (
        "not valid YAML at line 3, column 6: did not find expected ',' or '}'")  # libyaml's words


@pytest.mark.parametrize("text, expected", [
    (BASE + "schedulr: {}\n", "schedulr: unknown key; did you mean scheduler?"),
    (BASE.replace("{rate: 2}", "{rate: 2, num_requsts: 3}"),
     "workload.num_requsts: unknown key; did you mean num_requests?"),
    (BASE + "rooflin: 1\n", "rooflin: unknown key; did you mean roofline?"),
    (BASE + "sweep: {rates: [1, 2], sedes: [1]}\n", "sweep.sedes: unknown key; did you mean "
                                                    "seeds?"),
])
def test_unknown_keys_suggest_the_nearest(tmp_path, text, expected):
    assert error(tmp_path, text) == expected


def test_unknown_key_with_no_near_name_lists_the_allowed_ones(tmp_path):
    message = error(tmp_path, BASE + "neo: {zzz: 1}\n")
    assert message.startswith("neo.zzz: unknown key; allowed here: max_batch_size, ")
    assert "README" not in message


def test_top_level_errors_echo_neither_the_scenario_nor_pydantics_prefix(tmp_path):
    message = error(tmp_path, "name: x\nworkload: {rate: 2}\n")
    assert message == ("(top level): give exactly one of profile (a calibration file) or "
                       "roofline (hardware + model)")
