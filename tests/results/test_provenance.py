"""Every output says how it was made, and a sweep refuses to mix simulator versions."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

import dualpace_sim.experiments.sweep as sweep_mod
from dualpace_sim.cli.main import app
from dualpace_sim.config.scenario import load_scenario
from dualpace_sim.results import provenance as prov
from dualpace_sim.results.records import read_metadata
from dualpace_sim.results.sweep_dir import point_name

runner = CliRunner()

FIELDS = ("package", "version", "source_sha256", "git_commit", "git_dirty", "scenario",
          "profile", "trace", "requests_sha256", "seeds")


def check_record(record: dict, seed: int) -> None:
    assert set(FIELDS) <= set(record)
    assert record["version"] == prov.package_version()
    assert record["source_sha256"] == prov.source_hash() and len(record["source_sha256"]) == 64
    assert record["seeds"] == {"workload": seed}
    assert len(record["profile"]["sha256"]) == 64 and record["profile"]["method"] == "roofline"
    assert record["profile"]["model"] == "llama-3.1-8b"
    # resolved: the pools came from the profile and the controls from the fit
    scheduler = record["scenario"]["scheduler"]
    assert scheduler["gpu_kv_blocks"] > 0 and scheduler["route_p"] is not None
    assert record["scenario"]["metrics"]["percentiles"] == [50.0, 90.0, 95.0, 99.0]


def test_run_records_provenance_in_summary_and_parquet(write_scenario, tmp_path):
    out = tmp_path / "o"
    path = write_scenario()
    result = runner.invoke(app, ["run", str(path), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    check_record(summary[0]["provenance"], seed=1)
    assert summary[0]["scenario_hash"] == prov.scenario_hash(path)
    stored = json.loads(read_metadata(out / "requests.parquet")[prov.PARQUET_KEY])
    assert stored == json.loads(json.dumps(summary[0]["provenance"]))
    assert pq.read_table(out / "requests.parquet").num_rows == 120


def test_a_trace_file_is_hashed(write_scenario, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 70, "output_length": 5, "hash_ids": []}\n'
                     '{"timestamp": 300, "input_length": 90, "output_length": 8, "hash_ids": []}\n')
    path = write_scenario(workload={"source": "mooncake", "path": str(trace), "trace": None,
                                    "num_requests": 2})
    out = tmp_path / "o"
    assert runner.invoke(app, ["run", str(path), "--out", str(out), "-q"]).exit_code == 0
    record = json.loads((out / "summary.json").read_text())[0]["provenance"]
    assert record["trace"] == {"path": str(trace), "sha256": prov.file_sha256(trace)}


def test_a_synthetic_workload_names_no_trace_file(write_scenario, tmp_path):
    path = write_scenario(workload={"source": "synthetic", "trace": None, "num_requests": 5,
                                    "prompt": {"distribution": "fixed", "mean": 100},
                                    "output": {"distribution": "fixed", "mean": 4}})
    record = prov.provenance(load_scenario(path))
    assert record["trace"] == {"path": None, "sha256": None}
    assert record["scenario"]["workload"]["prompt"]["mean"] == 100


def test_run_and_sweep_point_write_one_summary_shape(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 30}, sweep={"rates": [2.0, 4.0]})
    run_out, sweep_out = tmp_path / "run", tmp_path / "sweep"
    assert runner.invoke(app, ["run", str(path), "-o", str(run_out), "-q",
                               "--set", "workload.rate=2.0"]).exit_code == 0
    result = runner.invoke(app, ["sweep", str(path), "-o", str(sweep_out), "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    ran = json.loads((run_out / "summary.json").read_text())
    point = json.loads((sweep_out / "points" / point_name("dualpace", 2.0) /
                        "summary.json").read_text())
    assert isinstance(ran, list) and isinstance(point, list)
    assert list(ran[0]) == list(point[0])
    meta = json.loads((sweep_out / "sweep.json").read_text())
    assert meta["code_version"] == prov.code_version()
    check_record(meta["provenance"], seed=1)


def test_a_resume_across_simulator_versions_is_refused(write_scenario, tmp_path, monkeypatch):
    path = write_scenario(workload={"num_requests": 30}, sweep={"rates": [2.0, 4.0]})
    out = tmp_path / "sweep"
    assert runner.invoke(app, ["sweep", str(path), "-o", str(out), "-j", "1", "-q"]).exit_code == 0
    newer = {"version": "9.9.9", "source_sha256": "f" * 64}
    monkeypatch.setattr(sweep_mod, "code_version", lambda: newer)
    result = runner.invoke(app, ["sweep", str(path), "-o", str(out), "-j", "1", "-q"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0] == (f"error: {out}: holds a sweep made by dualpace {prov.package_version()} "
                        f"(source {prov.source_hash()[:8]}), but this is dualpace 9.9.9 (source "
                        f"ffffffff); their points would mix two simulators, so use a new --out, "
                        f"or add --restart to discard it")
    # a point of the other version is refused even without sweep.json
    (out / "sweep.json").unlink()
    assert runner.invoke(app, ["sweep", str(path), "-o", str(out), "-j", "1",
                               "-q"]).exit_code == 2
    restarted = runner.invoke(app, ["sweep", str(path), "-o", str(out), "-j", "1", "-q",
                                    "--restart"])
    assert restarted.exit_code == 0, restarted.output


def test_source_hash_follows_the_package_files(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(prov, "PACKAGE_DIR", tmp_path)
    prov.source_hash.cache_clear()
    try:
        before = prov.source_hash()
        prov.source_hash.cache_clear()
        (tmp_path / "a.py").write_text("x = 2\n")
        assert prov.source_hash() != before
    finally:
        prov.source_hash.cache_clear()


def test_a_registered_trace_is_hashed_from_its_local_copy(write_scenario, tmp_path, azure_dir,
                                                          monkeypatch):
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    path = write_scenario(workload={"source": "azure", "trace": "conv", "num_requests": 5,
                                    "rate": 2.0})
    record = prov.provenance(load_scenario(path))
    copy = azure_dir / "AzureLLMInferenceTrace_conv.csv"
    assert record["trace"] == {"path": str(copy), "sha256": prov.file_sha256(copy)}
    assert len(record["trace"]["sha256"]) == 64
