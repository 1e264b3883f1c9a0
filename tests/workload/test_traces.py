from pathlib import Path

import numpy as np
import pytest

from dualpace_sim.workload import WorkloadError, load_azure_trace, load_vidur_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("kind", "rows", "prompt_mean", "output_mean", "span_s"),
    [("conv", 2000, 1104.8, 264.9, 424.3), ("code", 2000, 1986.6, 29.5, 853.1)],
)
def test_first_2000_match_readme_statistics(azure_dir, kind, rows, prompt_mean, output_mean,
                                            span_s):
    trace = load_azure_trace(azure_dir / f"AzureLLMInferenceTrace_{kind}.csv", first_n=rows)
    assert len(trace) == rows
    assert round(trace.prompt_tokens.mean(), 1) == prompt_mean
    assert round(trace.output_tokens.mean(), 1) == output_mean
    assert trace.timestamps_s[0] == 0.0
    assert round(trace.timestamps_s[-1], 1) == span_s
    assert trace.prompt_tokens.dtype == np.int64
    assert trace.source == f"azure:AzureLLMInferenceTrace_{kind}.csv"


def test_full_files_have_all_rows(azure_dir):
    assert len(load_azure_trace(azure_dir / "AzureLLMInferenceTrace_conv.csv")) == 19366
    assert len(load_azure_trace(azure_dir / "AzureLLMInferenceTrace_code.csv")) == 8819


def test_seventh_fractional_digit_is_kept(tmp_path):
    path = write(tmp_path, HEADER + "2023-11-16 18:17:03.9799600,10,2\n"
                 "2023-11-16 18:17:03.9799601,10,2\n2023-11-16 18:17:05.0000000,10,2\n")
    ts = load_azure_trace(path).timestamps_s
    assert ts[1] == pytest.approx(1e-7, abs=1e-15)
    assert ts[2] == pytest.approx(1.02004, abs=1e-12)


def test_vidur_with_and_without_arrivals(tmp_path):
    with_times = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,pd_ratio\n"
                       "10.5,374,44,8.5\n14.75,396,109,3.6\n", "a.csv")
    trace = load_vidur_trace(with_times)
    np.testing.assert_allclose(trace.timestamps_s, [0.0, 4.25])
    assert trace.prompt_tokens.tolist() == [374, 396]
    assert trace.output_tokens.tolist() == [44, 109]
    without = write(tmp_path, "num_prefill_tokens,num_decode_tokens\n3772,54\n2015,156\n", "b.csv")
    trace = load_vidur_trace(without, first_n=1)
    assert trace.timestamps_s is None
    assert len(trace) == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,10\n", "column 'GeneratedTokens'"),
        (HEADER + "2023-11-16 18:17:03.9799600,10,0\n", "line 2, column GeneratedTokens"),
        (HEADER + "2023-11-16 18:17:03.9799600,-3,5\n", "line 2, column ContextTokens"),
        (HEADER + "2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.0,abc,5\n",
         "line 3, column ContextTokens"),
        (HEADER + "2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.0,2.5,5\n",
         "line 3, column ContextTokens"),
        (HEADER + "2023-11-16 18:17:03.9799600,10,5\nyesterday,10,5\n", "line 3, column TIMESTAMP"),
        (HEADER + "2023-11-16 18:17:05.0,10,5\n2023-11-16 18:17:04.0,10,5\n",
         "line 3, column TIMESTAMP"),
        (HEADER, "no data rows"),
        ("", "not a readable CSV"),
    ],
)
def test_bad_azure_files_give_one_line_errors(tmp_path, body, expected):
    path = write(tmp_path, body, "bad_trace.csv")
    with pytest.raises(WorkloadError) as info:
        load_azure_trace(path)
    message = str(info.value)
    assert "\n" not in message
    assert "bad_trace.csv" in message
    assert expected in message


def test_bad_vidur_files_give_one_line_errors(tmp_path):
    missing = write(tmp_path, "num_prefill_tokens,decode\n1,2\n", "v.csv")
    with pytest.raises(WorkloadError, match=r"v\.csv: missing column 'num_decode_tokens'"):
        load_vidur_trace(missing)
    header = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    bad_time = write(tmp_path, header + "nan,1,2\n", "w.csv")
    with pytest.raises(WorkloadError, match=r"w\.csv: line 2, column arrived_at"):
        load_vidur_trace(bad_time)


def test_missing_file_and_short_file(tmp_path):
    with pytest.raises(WorkloadError, match="nope.csv: trace file not found"):
        load_azure_trace(tmp_path / "nope.csv")
    path = write(tmp_path, HEADER + "2023-11-16 18:17:03.9799600,10,5\n")
    with pytest.raises(WorkloadError, match="only 1 data rows.*num_requests to at most 1"):
        load_azure_trace(path, first_n=5)
