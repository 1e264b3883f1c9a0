"""`dualpace-sim run` end to end, and its one-line errors for bad scenarios."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.results.records import read_records
from dualpace_sim.workload import TRACES, trace_entry
from tests.conftest import RTX4090_LLAMA

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


MOONCAKE = ('{"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]}\n'
            '{"timestamp": 400, "input_length": 90, "output_length": 8, "hash_ids": [3]}\n'
            '{"timestamp": 900, "input_length": 1500, "output_length": 30, "hash_ids": [1]}\n')


@pytest.fixture
def trace_cache(tmp_path, monkeypatch):
    """An empty trace cache under tmp_path, no $DUALPACE_AZURE_DIR, and a network that serves
    only the files put in the returned dict (url -> local path)."""
    real_urlopen, served = urllib.request.urlopen, {}

    def urlopen(url, timeout):
        if url not in served:
            raise urllib.error.URLError("Name or service not known")
        return real_urlopen(served[url].as_uri(), timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DUALPACE_AZURE_DIR", raising=False)
    return served


def test_traces_list_shows_every_trace_and_its_local_copy(trace_cache, azure_dir, tmp_path,
                                                         monkeypatch):
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    cached = tmp_path / "xdg/dualpace/traces/mooncake-synthetic/synthetic_trace.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text(MOONCAKE)
    result = runner.invoke(app, ["traces", "list"])
    assert result.exit_code == 0, result.output
    heads = {line.split()[0]: line for line in result.output.splitlines()
             if not line.startswith((" ", "cache:"))}
    assert list(heads) == list(TRACES)
    assert f"local copy at {azure_dir / 'AzureLLMInferenceTrace_conv.csv'}" in heads[
        "azure-2023-conv"]
    assert f"local copy at {cached}" in heads["mooncake-synthetic"]
    assert "not cached" in heads["azure-2024-conv"] and "about 1.1 GB" in heads["azure-2024-conv"]
    assert result.output.count("license: CC-BY 4.0") == 4
    assert "cite: Stojkovic et al." in result.output


def test_traces_fetch_downloads_and_prints_an_unpinned_checksum(trace_cache, tmp_path):
    served = tmp_path / "upstream.jsonl"
    served.write_text(MOONCAKE)
    trace_cache[trace_entry("mooncake-conversation").url] = served
    result = runner.invoke(app, ["traces", "fetch", "mooncake-conversation", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "downloaded https://raw.githubusercontent.com/kvcache-ai/Mooncake/" in result.output
    assert f"sha256 {hashlib.sha256(MOONCAKE.encode()).hexdigest()}: NOT checked" in result.output
    again = runner.invoke(app, ["traces", "fetch", "mooncake-conversation", "--quiet"])
    assert again.exit_code == 0 and "already cached at" in again.output


def test_traces_fetch_checks_a_pinned_checksum(trace_cache, azure_dir, tmp_path):
    url = trace_entry("azure-2023-code").url
    trace_cache[url] = azure_dir / "AzureLLMInferenceTrace_code.csv"
    result = runner.invoke(app, ["traces", "fetch", "azure-2023-code", "--quiet"])
    assert result.exit_code == 0 and "matches the pinned value" in result.output
    altered = tmp_path / "altered.csv"
    altered.write_bytes(trace_cache[url].read_bytes() + b"2023-11-16 19:14:20.0000000,1,1\n")
    trace_cache[url] = altered
    (tmp_path / "xdg/dualpace/traces/azure-2023-code/AzureLLMInferenceTrace_code.csv").unlink()
    result = runner.invoke(app, ["traces", "fetch", "azure-2023-code", "--quiet"])
    assert result.exit_code == 2
    assert re.fullmatch(r"error: \S+: downloaded file has sha256 [0-9a-f]{64}, expected "
                        r"54e9a6d2\S+ .*save it as \S+AzureLLMInferenceTrace_code\.csv.*\n",
                        result.output)


def test_traces_fetch_offline_or_unknown_gives_one_line(trace_cache):
    for name, expected in [("azure-2024-conv", r"could not download https://github\.com/Azure/"
                            r"AzurePublicDataset/releases/download/dataset-llm-2024/"
                            r"AzureLLMInferenceTrace_conv_1week\.csv .*save it as "),
                           ("conv", "unknown trace 'conv'; known traces: azure-2023-conv")]:
        result = runner.invoke(app, ["traces", "fetch", name])
        assert result.exit_code == 2
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert re.search(expected, result.output) and "Traceback" not in result.output


def test_run_replays_a_registered_trace_by_name(write_scenario, trace_cache, tmp_path):
    cached = tmp_path / "xdg/dualpace/traces/mooncake-toolagent/toolagent_trace.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text(MOONCAKE)
    workload = {"source": "trace", "trace": "mooncake-toolagent", "num_requests": 3,
                "arrival": "trace", "rate": None}
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(write_scenario(workload=workload)), "--out", str(out),
                                 "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_records(out / "requests.parquet")
    assert sorted(records["max_tokens"]) == [8, 20, 30]
    cached.unlink()  # not cached and offline: one line saying what to fetch from where
    result = runner.invoke(app, ["run", str(write_scenario(workload=workload)), "--out", str(out)])
    assert result.exit_code == 2
    assert re.fullmatch(r"error: \S+: workload: could not download \S+toolagent_trace\.jsonl "
                        r".*save it as \S+toolagent_trace\.jsonl;.*\n", result.output)


def test_a_lookup_outside_the_profiles_tables_is_a_one_line_note(tmp_path):
    """Prompts shorter than the profile's smallest prefill chunk: the cost model extrapolates
    and says so once, as a note, not as a Python warning with the simulator's source line."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # the 2-GPU box's profile with its prefill grid cut to chunks of 16 tokens and more, as it
    # was measured before the 1-token grids
    profile = yaml.safe_load((root / "calibration" / "h200x2-xeon32" / "qwen3-14b.yaml")
                             .read_text())
    grid = profile["gpu"]["prefill_attn"]
    keep = [i for i, chunk in enumerate(grid["x"]) if chunk >= 16]
    grid["x"], grid["z"] = [grid["x"][i] for i in keep], [grid["z"][i] for i in keep]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "tiny-prompts", "policies": ["dualpace"], "profile": str(tmp_path / "p.yaml"),
        "workload": {"source": "default", "num_requests": 5, "rate": 5.0, "seed": 0,
                     "max_prompt_tokens": 4, "max_output_tokens": 4}}))
    done = subprocess.run(
        [sys.executable, "-c", "from dualpace_sim.cli.main import main; main()", "run",
         str(scenario), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    notes = [line for line in done.stderr.splitlines() if "gpu.prefill_attn" in line]
    assert len(notes) == 1 and notes[0].startswith("note: cost table gpu.prefill_attn:")
    assert "CostExtrapolationWarning" not in done.stderr and "cost.gpu_layer" not in done.stderr


def test_run_of_a_synthetic_workload_serves_the_drawn_lengths(write_scenario, tmp_path):
    out = tmp_path / "out"
    path = write_scenario(workload={
        "source": "synthetic", "trace": None, "num_requests": 60,
        "prompt": {"distribution": "uniform", "min": 64, "max": 512},
        "output": {"distribution": "fixed", "mean": 12}})
    result = runner.invoke(app, ["run", str(path), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    records = read_records(out / "requests.parquet")
    assert len(records) == 60 and (records["n_tokens"] == 12).all()
    assert records["prompt_tokens"].between(64, 512).all()
