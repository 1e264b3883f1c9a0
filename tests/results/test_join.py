"""Joining runs of one scenario's policies made in separate folders (a box's time limit splits
a comparison): what `validate` then reads must be each policy's own run, unchanged."""

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.results.join import JoinError, join_runs, main
from dualpace_sim.results.node_series import read_series
from dualpace_sim.results.records import read_records
from tests.conftest import RTX4090_LLAMA


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """DualPace and vLLM of one scenario, each simulated into its own folder, and both in
    one folder (what a single `run` writes)."""
    root = tmp_path_factory.mktemp("join")
    path = root / "s.yaml"
    path.write_text(f"""
name: join
profile: {RTX4090_LLAMA}
policies: [dualpace, vllm]
scheduler: {{gpu_kv_blocks: 400, host_kv_blocks: 4000}}
vllm: {{max_num_batched_tokens: 2048, max_num_seqs: 256}}
workload: {{source: default, num_requests: 60, rate: 4.0, seed: 5}}
""")
    made = {}
    for name, policies in (("dualpace", "[dualpace]"), ("vllm", "[vllm]"),
                           ("both", "[dualpace, vllm]")):
        out = root / name
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "-q",
                                          "--set", f"policies={policies}"])
        assert result.exit_code == 0, result.output
        made[name] = out
    return made


def test_a_join_holds_each_policy_as_its_own_run_wrote_it(runs, tmp_path):
    out = tmp_path / "joined"
    notes = join_runs(out, [runs["dualpace"], runs["vllm"]])
    records = read_records(out / "requests.parquet")
    assert list(dict.fromkeys(records["policy"])) == ["dualpace", "vllm"]
    for policy in ("dualpace", "vllm"):
        own = read_records(runs[policy] / "requests.parquet")
        pd.testing.assert_frame_equal(records[records["policy"] == policy]
                                      .reset_index(drop=True), own)
        pd.testing.assert_frame_equal(read_series(out)[policy].state,
                                      read_series(runs[policy])[policy].state)
    summaries = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summaries] == ["dualpace", "vllm"]
    assert summaries[1] == json.loads((runs["vllm"] / "summary.json").read_text())[0]
    # the two runs' scenario files differ only by --set policies: a note says so
    assert any("scenario_hash differ" in n for n in notes)


def test_a_policy_in_two_runs_is_taken_from_the_one_named(runs, tmp_path):
    with pytest.raises(JoinError, match="policy vllm is in .* --take vllm=RUN"):
        join_runs(tmp_path / "a", [runs["both"], runs["vllm"]])
    out = tmp_path / "b"
    join_runs(out, [runs["dualpace"], runs["both"]], take={"dualpace": runs["dualpace"]})
    records = read_records(out / "requests.parquet")
    assert records["policy"].value_counts().to_dict() == {"dualpace": 60, "vllm": 60}
    with pytest.raises(JoinError, match="that run has no vllm"):
        join_runs(tmp_path / "c", [runs["dualpace"], runs["both"]],
                  take={"dualpace": runs["both"], "vllm": runs["dualpace"]})


def test_runs_of_other_requests_are_refused_in_one_line(runs, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(runs["vllm"], other)
    summaries = json.loads((other / "summary.json").read_text())
    summaries[0]["provenance"]["requests_sha256"] = "0" * 64
    (other / "summary.json").write_text(json.dumps(summaries))
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "out"), str(runs["dualpace"]), str(other)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "requests_sha256" in err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "out"), str(runs["dualpace"]), str(tmp_path / "nothing")])
    assert "summary.json: missing" in capsys.readouterr().err
