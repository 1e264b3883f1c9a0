"""`dualpace-sim export`: a run's results in the layout of vLLM's serving-benchmark JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dualpace_sim.cli.main import app
from dualpace_sim.results.records import read_records

runner = CliRunner()

# The keys `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py: the result dict,
# the run settings added on save, and process_one_metric's statistics per latency), for
# --metric-percentiles 50,90,95,99.
VLLM_KEYS = [
    "date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
    "generated_texts", "errors",
] + [f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
     for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")]


def test_export_writes_vllms_layout_with_the_native_numbers_in_ms(write_scenario, tmp_path):
    out = tmp_path / "o"
    assert runner.invoke(app, ["run", str(write_scenario()), "-o", str(out), "-q"]).exit_code == 0
    result = runner.invoke(app, ["export", str(out), "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    exported = json.loads((tmp_path / "x" / "vllm-dualpace.json").read_text())
    assert list(exported) == VLLM_KEYS
    native = json.loads((out / "summary.json").read_text())[0]
    records = read_records(out / "requests.parquet")
    assert exported["num_prompts"] == exported["completed"] == 120
    assert exported["duration"] == pytest.approx(native["makespan_s"])
    assert exported["request_throughput"] == pytest.approx(native["request_throughput_req_s"])
    assert exported["total_token_throughput"] == pytest.approx(
        native["total_token_throughput_tok_s"])
    assert exported["output_throughput"] == pytest.approx(native["output_throughput_tok_s"])
    assert exported["model_id"] == "llama-3.1-8b" and exported["request_rate"] == 4.0
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p90", "p99"):
            assert exported[f"{stat}_{m}_ms"] == pytest.approx(1000 * native[f"{stat}_{m}_s"])
    # per-request lists in seconds, in request order, as vLLM's
    assert exported["input_lens"] == records["prompt_tokens"].tolist()
    first = records.iloc[0]
    assert exported["ttfts"][0] == pytest.approx(first.first_token_s - first.arrival_s)
    np.testing.assert_allclose(exported["itls"][0], np.diff(first.token_times_s))
    assert np.percentile(np.concatenate(exported["itls"]), 99) * 1000 == pytest.approx(
        exported["p99_itl_ms"])
    assert exported["errors"] == [""] * 120


def test_export_refuses_what_is_not_a_run_directory(tmp_path):
    result = runner.invoke(app, ["export", str(tmp_path)])
    assert result.exit_code == 2 and result.output.startswith(f"error: {tmp_path}: not a run")
    bad = runner.invoke(app, ["export", str(tmp_path), "--format", "csv"])
    assert bad.exit_code == 2 and "--format 'csv'" in bad.output


def test_a_run_without_provenance_exports_the_default_percentiles_and_no_goodput(tmp_path):
    """A real run's summary (dualpace-hw) records no scenario: no SLOs, vLLM's null goodput."""
    from types import SimpleNamespace

    from dualpace_sim.results.records import records_frame, write_records
    from dualpace_sim.results.vllm_export import vllm_result

    reqs = [SimpleNamespace(req_id=i, arrival_s=float(i), prompt_tokens=5, max_tokens=2,
                            token_times=[i + 0.5, i + 0.75], token_owners=bytearray(2),
                            migrations=[]) for i in range(3)]
    frame = records_frame(reqs, "vllm")
    write_records(frame, tmp_path / "requests.parquet")
    result = vllm_result(frame, {"policy": "vllm", "submitted": 3, "rate": None,
                                 "makespan_s": 2.75})
    assert result["request_goodput"] is None and result["completed"] == 3
    assert result["p95_tpot_ms"] == pytest.approx(250.0) and "p90_e2el_ms" in result
    assert result["output_throughput"] == pytest.approx(6 / 2.75)
