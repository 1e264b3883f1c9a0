"""The CPU engine's per-step record (`cpu-steps-dualpace.csv.gz`): round trip and one-line errors
naming the file and line."""

from __future__ import annotations

import gzip

import pytest

from dualpace_sim.costs.cpu_step_records import (
    COLUMNS,
    CPU_STEPS_FILE,
    CpuStepRecord,
    CpuStepRecordError,
    read_cpu_steps,
    write_cpu_steps,
)
from dualpace_sim.costs.record_csv import record_file


def test_records_round_trip(tmp_path):
    steps = [CpuStepRecord("Fused-Assist", 64, 70_000, 0.31, 1e-4, 2e-4, 0.08, 1e-3, 0.19, 0.03,
                           0.0),
             CpuStepRecord("Full-CPU", 1, 900, 0.2, 1e-5, 1e-5, 0.03, 1e-4, 0.004, 0.0, 0.15)]
    path = tmp_path / "cpu-steps-dualpace.csv"
    write_cpu_steps(steps, path)
    assert read_cpu_steps(path) == steps


def test_the_runtime_writes_compressed_records_and_earlier_plain_ones_are_still_found(tmp_path):
    steps = [CpuStepRecord("Full-CPU", 2, 900, 0.2, 1e-5, 1e-5, 0.03, 1e-4, 0.004, 0.0, 0.15)]
    compressed = record_file(tmp_path, CPU_STEPS_FILE, "dualpace")
    assert compressed.name == "cpu-steps-dualpace.csv.gz"
    write_cpu_steps(steps, compressed)
    assert gzip.decompress(compressed.read_bytes()).startswith(",".join(COLUMNS).encode())
    assert read_cpu_steps(record_file(tmp_path, CPU_STEPS_FILE, "dualpace")) == steps
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    write_cpu_steps(steps, earlier / "cpu-steps-dualpace.csv")
    found = record_file(earlier, CPU_STEPS_FILE, "dualpace")
    assert found.name == "cpu-steps-dualpace.csv" and read_cpu_steps(found) == steps


def test_a_truncated_compressed_record_is_refused_in_one_line(tmp_path):
    path = tmp_path / "cpu-steps-dualpace.csv.gz"
    path.write_bytes(gzip.compress((",".join(COLUMNS) + "\n").encode() * 50)[:30])
    with pytest.raises(CpuStepRecordError) as e:
        read_cpu_steps(path)
    assert "cannot read it" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("text", "message"), [
    ("route,rows\n", "the header must be " + ",".join(COLUMNS)),
    (",".join(COLUMNS) + "\nFused-Assist,8,900\n", ":2: 3 fields, want 11"),
    (",".join(COLUMNS) + "\nFused-Assist,eight,900" + ",0.1" * 8 + "\n",
     ":2: rows and context must be integers"),
    (",".join(COLUMNS) + "\nFused-Assist,8,900,0.1,-0.1" + ",0.1" * 6 + "\n",
     ":2: rows must be >= 1 and times >= 0"),
])
def test_a_bad_record_names_its_file_and_line(tmp_path, text, message):
    path = tmp_path / "cpu-steps-dualpace.csv"
    path.write_text(text)
    with pytest.raises(CpuStepRecordError) as e:
        read_cpu_steps(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
