import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dualpace_sim.results.records import (
    RECORDS_SCHEMA,
    read_records,
    records_frame,
    records_table,
    write_records,
)


@dataclass
class Req:
    req_id: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    token_times: list[float] = field(default_factory=list)
    token_owners: bytearray = field(default_factory=bytearray)
    migrations: list[tuple[float, str]] = field(default_factory=list)


def sample_requests() -> list[Req]:
    return [
        Req(2, 0.5, 100, 3, [1.0, 1.5, 2.5], bytearray([0, 1, 1]),
            [(1.2, "swap_out"), (2.0, "swap_in")]),
        Req(0, 0.0, 50, 2),
        Req(1, 0.25, 70, 1, [0.75], bytearray([0]), [(0.3, "prefill_to_cpu")]),
    ]


def test_frame_has_one_sorted_row_per_request():
    df = records_frame(sample_requests(), "dualpace")
    assert list(df.columns) == RECORDS_SCHEMA.names
    assert df["request_id"].tolist() == [0, 1, 2]
    assert set(df["policy"]) == {"dualpace"}
    assert df["n_tokens"].tolist() == [0, 1, 3]
    assert df["token_owners"].tolist() == ["", "G", "GCC"]
    last = df.iloc[2]
    assert (last.first_token_s, last.finish_s) == (1.0, 2.5)
    np.testing.assert_array_equal(last.token_times_s, [1.0, 1.5, 2.5])
    np.testing.assert_array_equal(last.migration_times_s, [1.2, 2.0])
    assert list(last.migration_kinds) == ["swap_out", "swap_in"]
    empty = df.iloc[0]
    assert math.isnan(empty.first_token_s) and math.isnan(empty.finish_s)
    assert len(empty.token_times_s) == 0 and len(empty.migration_kinds) == 0


def test_parquet_is_byte_identical_and_round_trips(tmp_path):
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for path in paths:
        write_records(records_frame(sample_requests(), "vllm"), path)
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert len(digests) == 1
    original = records_frame(sample_requests(), "vllm")
    assert read_records(paths[0]).equals(original)


def test_empty_input_writes_and_reads(tmp_path):
    df = records_frame([], "neo")
    write_records(df, tmp_path / "e.parquet")
    back = read_records(tmp_path / "e.parquet")
    assert len(back) == 0 and list(back.columns) == RECORDS_SCHEMA.names


def test_inconsistent_requests_are_rejected():
    with pytest.raises(ValueError, match="2 token owners for 1 token times"):
        records_frame([Req(0, 0.0, 1, 1, [1.0], bytearray([0, 0]))], "x")
    with pytest.raises(ValueError, match="0 \\(GPU\\) or 1 \\(CPU\\)"):
        records_frame([Req(0, 0.0, 1, 1, [1.0], bytearray([2]))], "x")
    with pytest.raises(ValueError, match="unknown migration kind 'teleport'"):
        records_frame([Req(0, 0.0, 1, 1, migrations=[(0.1, "teleport")])], "x")


def test_foreign_parquet_is_rejected(tmp_path):
    records_frame(sample_requests(), "x")[["policy", "request_id"]].to_parquet(tmp_path / "f.pq")
    with pytest.raises(ValueError, match="not a DualPace records file"):
        read_records(tmp_path / "f.pq")
    with pytest.raises(ValueError, match="lacks column"):
        write_records(records_frame([], "x").drop(columns="finish_s"), tmp_path / "g.pq")


def test_the_table_is_built_from_flat_token_arrays():
    """records_table gives the frame's rows straight from one flat array per token column."""
    table = records_table(sample_requests(), "dualpace")
    assert table.schema == RECORDS_SCHEMA
    assert table.column("token_times_s").to_pylist() == [[], [0.75], [1.0, 1.5, 2.5]]
    assert table.column("token_owners").to_pylist() == ["", "G", "GCC"]
    assert table.column("first_token_s").to_pylist()[1:] == [0.75, 1.0]
    assert table.column("finish_s").to_pylist()[1:] == [0.75, 2.5]


def _run_requests():
    """A small real run's requests (core Requests, their tokens booked as spans of rounds)."""
    from dualpace_sim.config.scenario import load_scenario
    from dualpace_sim.sim import DualPaceNode
    from tests.conftest import REPO_ROOT

    loaded = load_scenario(REPO_ROOT / "scenarios" / "quickstart.yaml",
                           changes={"workload": {"num_requests": 60}})
    return DualPaceNode(loaded.requests, loaded.cost, loaded.config).run().requests


def test_policy_records_are_the_frame_of_the_same_requests(tmp_path, monkeypatch):
    """A run's PolicyRecords spell out the frame records_frame gives, and write the same
    bytes; row groups of a few rows read back the same rows."""
    from dualpace_sim.results import records
    from dualpace_sim.results.records import PolicyRecords, write_policy_records

    reqs = _run_requests()
    parts = [PolicyRecords.from_requests(reqs, "dualpace"), PolicyRecords.from_requests(reqs, "b")]
    frame = pd.concat([records_frame(reqs, "dualpace"), records_frame(reqs, "b")],
                      ignore_index=True)
    pd.testing.assert_frame_equal(parts[0].frame(), frame.iloc[:len(reqs)])
    meta = {b"k": b"v"}
    write_records(frame, tmp_path / "frame.parquet", meta)
    write_policy_records(parts, tmp_path / "parts.parquet", meta)
    assert (tmp_path / "frame.parquet").read_bytes() == (tmp_path / "parts.parquet").read_bytes()
    monkeypatch.setattr(records, "ROW_GROUP_ROWS", 7)
    write_policy_records(parts, tmp_path / "small.parquet")
    assert pq.ParquetFile(tmp_path / "small.parquet").metadata.num_row_groups == -(-len(frame) // 7)
    pd.testing.assert_frame_equal(read_records(tmp_path / "small.parquet"), frame)
    write_policy_records([], tmp_path / "none.parquet")
    assert read_records(tmp_path / "none.parquet").empty


def test_a_runs_summary_from_its_spans_is_the_files(tmp_path):
    """summarize over the run's spans gives what it gives over the written file."""
    from dualpace_sim.results.metrics import longest_cpu_stall, summarize
    from dualpace_sim.results.records import PolicyRecords, write_policy_records

    rec = PolicyRecords.from_requests(_run_requests(), "dualpace")
    write_policy_records([rec], tmp_path / "r.parquet")
    back = read_records(tmp_path / "r.parquet")
    assert summarize(rec.requests, tokens=rec.tokens) == summarize(back)
    assert longest_cpu_stall(rec.requests, rec.tokens) == longest_cpu_stall(back)
