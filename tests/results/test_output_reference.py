"""The output reference describes exactly what the outputs hold, both ways."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from dualpace_sim.experiments.capacity import COLUMNS as CAPACITY_COLUMNS
from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.results import output_reference as ref
from dualpace_sim.results.node_series import COUNTER_TRACKS, STATE_FILE, UTILISATION_FILE
from dualpace_sim.results.records import RECORDS_SCHEMA
from dualpace_sim.results.trace_events import MIGRATION, TRACKS
from dualpace_sim.validation.validate import COLUMNS as VALIDATION_COLUMNS
from tests.conftest import RTX4090_LLAMA


def names(rows):
    return [row[0] for row in rows]


def covers_exactly(keys, rows, where):
    """Every key is described, and every description matches a key."""
    undocumented = [k for k in keys if not ref.documented(k, rows)]
    assert not undocumented, f"{where}: describe {undocumented} in output_reference.py"
    unused = [r for r in names(rows) if not any(ref.pattern(r).match(k) for k in keys)]
    assert not unused, f"{where}: {unused} are described but not written"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ref", "profile": str(RTX4090_LLAMA),
        "workload": {"num_requests": 20, "rate": 2.0, "seed": 1},
        "sweep": {"rates": [2.0, 4.0], "grid": {"scheduler.host_kv_blocks": [4096]},
                  "seeds": [1, 2]}}))
    out = path.parent / "sw"
    run_sweep(path, out, workers=1, progress=False)
    return out


def test_records_and_summary_are_described(swept):
    point = next((swept / "points").iterdir())
    covers_exactly(RECORDS_SCHEMA.names, ref.RECORDS, "requests.parquet")
    summary = json.loads((point / "summary.json").read_text())[0]
    covers_exactly(list(summary), ref.SUMMARY, "summary.json")
    covers_exactly(list(summary["engine"]), ref.ENGINE, "summary.json engine")
    covers_exactly(list(summary["provenance"]), ref.PROVENANCE, "summary.json provenance")
    covers_exactly(list(json.loads((swept / "sweep.json").read_text())), ref.SWEEP_JSON,
                   "sweep.json")
    for name, rows in ((STATE_FILE, ref.STATE), (UTILISATION_FILE, ref.UTILISATION)):
        assert list(pd.read_parquet(point / name).columns) == names(rows), name


def test_sweep_csvs_are_described(swept):
    table = pd.read_csv(swept / "sweep.csv")
    grid = ["scheduler.host_kv_blocks", "workload.seed"]
    assert list(table.columns[2:4]) == grid
    metrics = list(table.columns[4:])
    assert all(ref.documented(m, ref.SUMMARY) for m in metrics), metrics
    sustainable = pd.read_csv(swept / "sustainable.csv")
    assert list(sustainable.columns) == ["policy", "scheduler.host_kv_blocks",
                                         *names(ref.SUSTAINABLE_CSV)[2:]]
    ci = pd.read_csv(swept / "sweep_ci.csv")
    assert list(ci.columns) == ["policy", "rate", "scheduler.host_kv_blocks",
                                *names(ref.SWEEP_CI_CSV)[1:]]


def test_fixed_tables_are_described():
    assert list(CAPACITY_COLUMNS) == names(ref.CAPACITY_CSV)
    assert list(VALIDATION_COLUMNS) == names(ref.VALIDATION_CSV)
    assert [*TRACKS, MIGRATION, *COUNTER_TRACKS] == names(ref.TRACE_TRACKS)
