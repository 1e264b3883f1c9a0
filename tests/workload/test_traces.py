from pathlib import Path

import numpy as np
import pytest

from dualpace_sim.workload import (
    WorkloadError,
    load_azure_trace,
    load_mooncake_trace,
    load_vidur_trace,
)

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


def test_azure_2024_timestamps_with_time_zone(tmp_path):
    path = write(tmp_path, HEADER + "2024-05-10 00:00:00.009930+00:00,1930,8\n"
                 "2024-05-10 00:00:01.509930+00:00,2511,23\n")
    trace = load_azure_trace(path)
    np.testing.assert_allclose(trace.timestamps_s, [0.0, 1.5])
    assert trace.prompt_tokens.tolist() == [1930, 2511]


def test_mooncake_lines_skip_blanks_and_ignore_hash_ids(tmp_path):
    path = write(tmp_path, '{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
                 '"hash_ids": [46, 47]}\n\n{"timestamp": 30535, "input_length": 6472, '
                 '"output_length": 26, "hash_ids": []}\n{"timestamp": 40000, "input_length": 1, '
                 '"output_length": 1, "hash_ids": []}\n', "m.jsonl")
    trace = load_mooncake_trace(path, first_n=2)
    np.testing.assert_allclose(trace.timestamps_s, [0.0, 3.053])
    assert trace.prompt_tokens.tolist() == [6955, 6472]
    assert trace.output_tokens.tolist() == [52, 26]
    assert trace.source == "mooncake:m.jsonl"


BAD_MOONCAKE = [
    ('{"timestamp": 0, "input_length": 5}\n', "missing column 'output_length'"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, '
     '"input_length": 5}\n', "line 2, column output_length: '' is not a positive"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n\n{"timestamp": 1,\n',
     "line 3: not valid JSON"),
    ("[1, 2, 3]\n", "line 1: not a JSON object"),
    ('{"timestamp": 9, "input_length": 5, "output_length": 2}\n{"timestamp": 1, '
     '"input_length": 5, "output_length": 2}\n', "line 2, column timestamp: earlier"),
    ('{"timestamp": "soon", "input_length": 5, "output_length": 2}\n',
     "line 1, column timestamp: 'soon' is not a time in milliseconds"),
    ("\n", "has no requests"),
]


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


BAD_AZURE = [
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
]


@pytest.mark.parametrize(
    ("loader", "body", "expected"),
    [(load_azure_trace, *case) for case in BAD_AZURE]
    + [(load_mooncake_trace, *case) for case in BAD_MOONCAKE],
)
def test_bad_files_give_one_line_errors(tmp_path, loader, body, expected):
    path = write(tmp_path, body, "bad_trace.csv")
    with pytest.raises(WorkloadError) as info:
        loader(path)
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
