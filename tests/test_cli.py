"""`dualpace-sim run` end to end, and its one-line errors for bad scenarios."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_sim.cli import app
from dualpace_sim.records import read_records

from .conftest import RTX4090_LLAMA

runner = CliRunner()


def test_run_writes_records_summary_and_timeline(write_scenario, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(write_scenario()), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["dualpace"]
    s = summary[0]
    for key in ("normalized_latency_s", "p99_ttft_s", "p99_itl_s", "p99_tpot_s",
                "throughput_tok_s", "completed", "submitted"):
        assert key in s
    assert s["completed"] == s["submitted"] == 120
    assert s["controls"]["route_p"] == {"value": 0, "source": "fit of the profile"}
    records = read_records(out / "requests.parquet")
    assert len(records) == 120 and (records["n_tokens"] == records["max_tokens"]).all()
    assert (out / "timeline.png").stat().st_size > 0 and (out / "timeline.pdf").exists()


BAD = [
    ({"workload": {"rtae": 3}}, "workload.rtae: unknown key"),
    ({"workload": {"num_requests": "many"}}, "workload.num_requests:"),
    ({"workload": {"rate": -1}}, "workload.rate:"),
    ({"profile": "no/such/profile.yaml"}, "profile: file .*no/such/profile.yaml does not exist"),
    ({"workload": {"source": "azure", "path": "missing.csv", "trace": None}}, "missing.csv"),
    ({"scheduler": {"route_p": 2, "route_f": 5}}, "scheduler: illegal routing thresholds"),
    ({"policies": ["dualpace", "magic"]}, "policies.1:"),
    ({"profile": "MS_PROFILE"}, "profile: .*expected seconds"),
]


@pytest.mark.parametrize("fields, expected", BAD, ids=[e for _, e in BAD])
def test_bad_scenarios_get_one_clear_line_and_exit_2(write_scenario, tmp_path, fields,
                                                      expected):
    if fields.get("profile") == "MS_PROFILE":  # a profile written in milliseconds
        doc = yaml.safe_load(RTX4090_LLAMA.read_text())
        doc["gpu"]["post_attn"]["y"] = [v * 1000 for v in doc["gpu"]["post_attn"]["y"]]
        (tmp_path / "ms.yaml").write_text(yaml.safe_dump(doc))
        fields = {"profile": str(tmp_path / "ms.yaml")}
    path = write_scenario(**fields)
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}: ")
    assert re.search(expected, lines[0]), lines[0]
    assert "Traceback" not in result.output
