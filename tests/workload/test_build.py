from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from dualpace_sim.workload import (
    RequestSpec,
    WorkloadConfig,
    WorkloadError,
    build_requests,
    with_rate,
)

CONV = "AzureLLMInferenceTrace_conv.csv"


def arrivals(requests: list[RequestSpec]) -> np.ndarray:
    return np.array([r.arrival_s for r in requests])


def test_default_source_gives_sorted_poisson_requests(tmp_path):
    cfg = WorkloadConfig(source="default", trace="code", num_requests=300, rate=2.0, seed=4)
    requests = build_requests(cfg, tmp_path)
    assert len(requests) == 300
    assert all(isinstance(r, RequestSpec) for r in requests)
    assert all(isinstance(r.prompt_tokens, int) and r.max_tokens >= 1 for r in requests)
    times = arrivals(requests)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert np.diff(times).mean() == pytest.approx(0.5, rel=1e-12)
    assert build_requests(cfg, tmp_path) == requests


def test_azure_replay_with_relative_path_and_trace_arrivals(azure_dir):
    cfg = WorkloadConfig(source="azure", path=CONV, arrival="trace", time_scale=2.0)
    requests = build_requests(cfg, azure_dir)
    assert len(requests) == 2000
    assert (requests[0].prompt_tokens, requests[0].max_tokens) == (374, 44)
    assert requests[-1].arrival_s == pytest.approx(2 * 424.259457, abs=1e-6)


def test_arrivals_do_not_depend_on_the_length_source(azure_dir):
    kw = {"num_requests": 50, "rate": 3.0, "seed": 9}
    sampled = build_requests(WorkloadConfig(source="default", **kw), azure_dir)
    replayed = build_requests(WorkloadConfig(source="azure", path=CONV, **kw), azure_dir)
    np.testing.assert_array_equal(arrivals(sampled), arrivals(replayed))


def test_azure_without_path_uses_the_fetcher(azure_dir, monkeypatch):
    monkeypatch.setenv("DUALPACE_AZURE_DIR", str(azure_dir))
    requests = build_requests(WorkloadConfig(source="azure", trace="code", rate=1.0), Path("."))
    assert np.mean([r.max_tokens for r in requests]) == pytest.approx(29.512)


def test_clipping(azure_dir):
    cfg = WorkloadConfig(source="azure", path=CONV, rate=1.0, max_prompt_tokens=512,
                         max_output_tokens=64)
    requests = build_requests(cfg, azure_dir)
    assert max(r.prompt_tokens for r in requests) == 512
    assert max(r.max_tokens for r in requests) == 64


def test_skip_takes_a_later_window_of_the_trace(azure_dir):
    whole = build_requests(WorkloadConfig(source="azure", path=CONV, arrival="trace",
                                          num_requests=300), azure_dir)
    window = build_requests(WorkloadConfig(source="azure", path=CONV, arrival="trace",
                                           num_requests=100, skip=200), azure_dir)
    assert [(r.prompt_tokens, r.max_tokens) for r in window] == [
        (r.prompt_tokens, r.max_tokens) for r in whole[200:]]
    assert window[0].arrival_s == 0.0  # the window's own clock
    assert window[-1].arrival_s == pytest.approx(whole[-1].arrival_s - whole[200].arrival_s)
    with pytest.raises(WorkloadError, match="fewer than skip 19990 plus num_requests 20; lower "
                                            "workload.skip or workload.num_requests"):
        build_requests(WorkloadConfig(source="azure", path=CONV, rate=1.0, num_requests=20,
                                      skip=19990), azure_dir)


def test_vidur_without_timestamps_rejects_trace_arrivals(tmp_path):
    (tmp_path / "v.csv").write_text("num_prefill_tokens,num_decode_tokens\n10,2\n20,3\n")
    cfg = WorkloadConfig(source="vidur", path="v.csv", num_requests=2, arrival="trace")
    with pytest.raises(WorkloadError, match="no arrived_at column"):
        build_requests(cfg, tmp_path)
    cfg = WorkloadConfig(source="vidur", path="v.csv", num_requests=2, rate=1.0)
    assert [r.prompt_tokens for r in build_requests(cfg, tmp_path)] == [10, 20]


MOONCAKE = ('{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}\n'
            '{"timestamp": 2500, "input_length": 6472, "output_length": 26, "hash_ids": [46]}\n')


def test_mooncake_file_replays_its_timestamps(tmp_path):
    (tmp_path / "m.jsonl").write_text(MOONCAKE)
    cfg = WorkloadConfig(source="mooncake", path="m.jsonl", num_requests=2, arrival="trace")
    requests = build_requests(cfg, tmp_path)
    assert requests == [RequestSpec(0.0, 6955, 52), RequestSpec(2.5, 6472, 26)]


def test_registered_trace_is_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = tmp_path / "dualpace" / "traces" / "mooncake-toolagent" / "toolagent_trace.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text(MOONCAKE)
    cfg = WorkloadConfig(source="trace", trace="mooncake-toolagent", num_requests=2,
                         arrival="trace", time_scale=2.0)
    assert [r.arrival_s for r in build_requests(cfg, Path("."))] == [0.0, 5.0]


def test_registered_vidur_trace_without_arrivals_names_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = (tmp_path / "dualpace" / "traces" / "vidur-sharegpt"
              / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    cached.parent.mkdir(parents=True)
    cached.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                      "10,2,12,5.0\n")
    cfg = WorkloadConfig(source="trace", trace="vidur-sharegpt", num_requests=1, arrival="trace")
    with pytest.raises(WorkloadError, match="vidur:sharegpt_8k.*no arrival times"):
        build_requests(cfg, Path("."))


FIXED = {"distribution": "fixed", "mean": 8}
LOGNORMAL = {"distribution": "lognormal", "mean": 1599, "p99": 8000}
ZIPF = {"distribution": "zipf", "max": 2000, "mean": 114}


def synthetic(**fields) -> WorkloadConfig:
    return WorkloadConfig(**{"source": "synthetic", "prompt": LOGNORMAL, "output": ZIPF,
                             "num_requests": 20_000, "rate": 2.0, "seed": 5, **fields})


def lengths(requests: list[RequestSpec]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r.prompt_tokens for r in requests]),
            np.array([r.max_tokens for r in requests]))


def test_synthetic_source_draws_the_asked_for_means_at_poisson_arrivals(tmp_path):
    requests = build_requests(synthetic(), tmp_path)
    prompt, output = lengths(requests)
    assert prompt.mean() == pytest.approx(1599, rel=0.03)
    assert np.percentile(prompt, 99) == pytest.approx(8000, rel=0.05)
    assert output.mean() == pytest.approx(114, rel=0.03) and output.max() <= 2000
    assert np.diff(arrivals(requests)).mean() == pytest.approx(0.5, rel=1e-9)
    assert build_requests(synthetic(), tmp_path) == requests  # seeded: the same every time
    default = build_requests(WorkloadConfig(num_requests=20_000, rate=2.0, seed=5), tmp_path)
    np.testing.assert_array_equal(arrivals(default), arrivals(requests))


def test_changing_the_output_distribution_keeps_the_prompts(tmp_path):
    """Each distribution has its own stream (in arrival order, which the lengths don't move)."""
    before = build_requests(synthetic(num_requests=500), tmp_path)
    after = build_requests(synthetic(num_requests=500, output=FIXED), tmp_path)
    np.testing.assert_array_equal(lengths(before)[0], lengths(after)[0])
    assert set(lengths(after)[1]) == {8}


def test_a_synthetic_workload_survives_a_rate_sweep(tmp_path):
    faster = with_rate(synthetic(num_requests=100), 8.0)
    assert faster.prompt == synthetic().prompt
    for new, old in zip(lengths(build_requests(faster, tmp_path)),
                        lengths(build_requests(synthetic(num_requests=100), tmp_path)),
                        strict=True):
        np.testing.assert_array_equal(new, old)


def test_a_trace_rescaled_to_the_papers_means_keeps_its_order(azure_dir):
    plain = WorkloadConfig(source="azure", path=CONV, rate=1.0)
    scaled = WorkloadConfig(source="azure", path=CONV, rate=1.0, prompt_mean=1599.0,
                            output_mean=114.0, max_output_tokens=400)
    prompt, output = lengths(build_requests(scaled, azure_dir))
    assert prompt.mean() == pytest.approx(1599, abs=0.5)
    assert output.max() == 400  # clipping comes after the rescaling
    raw_prompt, _ = lengths(build_requests(plain, azure_dir))
    assert np.all(np.diff(prompt[np.argsort(raw_prompt, kind="stable")]) >= 0)


def test_the_default_tables_can_be_rescaled_too(tmp_path):
    cfg = WorkloadConfig(trace="code", num_requests=2000, rate=1.0, prompt_mean=2348.0,
                         output_mean=22.0)
    prompt, output = lengths(build_requests(cfg, tmp_path))
    assert (prompt.mean(), output.mean()) == (pytest.approx(2348, abs=0.5),
                                              pytest.approx(22, abs=0.5))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "needs rate"),
        ({"rate": 0.0}, "greater than 0"),
        ({"rate": 1.0, "time_scale": 2.0}, "time_scale applies"),
        ({"arrival": "trace"}, "no timestamps"),
        ({"source": "azure", "arrival": "trace", "rate": 1.0}, "rate applies"),
        ({"source": "vidur", "rate": 1.0}, "needs path"),
        ({"source": "default", "path": "x.csv", "rate": 1.0}, "takes no path"),
        ({"source": "azure", "path": "x.csv", "trace": "code", "rate": 1.0}, "drop trace or path"),
        ({"source": "mooncake", "rate": 1.0}, "needs path"),
        ({"source": "trace", "rate": 1.0}, "trace needs trace: one of azure-2023-conv"),
        ({"source": "trace", "trace": "mooncake-chat", "rate": 1.0}, "needs trace: one of"),
        ({"source": "trace", "path": "x.jsonl", "rate": 1.0}, "for a file use source"),
        ({"source": "azure", "trace": "mooncake-toolagent", "rate": 1.0}, "use source: trace"),
        ({"rate": 1.0, "num_request": 5}, "Extra inputs"),
        ({"rate": 1.0, "num_requests": 0}, "greater than or equal to 1"),
        ({"source": "synthetic", "rate": 1.0, "output": FIXED}, "synthetic needs prompt"),
        ({"source": "synthetic", "rate": 1.0, "prompt": FIXED}, "synthetic needs output"),
        ({"source": "synthetic", "arrival": "trace", "prompt": FIXED, "output": FIXED},
         "synthetic has no timestamps"),
        ({"source": "synthetic", "rate": 1.0, "prompt": FIXED, "output": FIXED, "trace": "code"},
         "drop trace"),
        ({"source": "synthetic", "rate": 1.0, "prompt": FIXED, "output": FIXED,
          "prompt_mean": 9.0}, "with source: synthetic give the mean in prompt.mean"),
        ({"rate": 1.0, "output": FIXED}, "output .a length distribution. applies to source: "
                                         "synthetic; to change a trace's mean length use "
                                         "output_mean"),
        ({"rate": 1.0, "output_mean": 0.0}, "greater than 0"),
        ({"rate": 1.0, "skip": 10}, "skip picks a window of a trace file; source: default"),
    ],
)
def test_config_rejects_inconsistent_settings(fields, expected):
    with pytest.raises(ValidationError, match=expected):
        WorkloadConfig(**fields)


def test_with_rate_changes_only_the_load(tmp_path):
    cfg = WorkloadConfig(num_requests=100, rate=1.0, seed=2)
    faster = with_rate(cfg, 4.0)
    assert faster.rate == 4.0 and cfg.rate == 1.0
    assert faster.model_dump(exclude={"rate"}) == cfg.model_dump(exclude={"rate"})
    slow, fast = build_requests(cfg, tmp_path), build_requests(faster, tmp_path)
    assert [r.max_tokens for r in slow] == [r.max_tokens for r in fast]
    np.testing.assert_allclose(arrivals(fast), arrivals(slow) / 4, rtol=1e-12)
    with pytest.raises(ValidationError):
        with_rate(cfg, -1.0)
    trace_cfg = WorkloadConfig(source="azure", path=CONV, arrival="trace")
    with pytest.raises(WorkloadError, match="arrival: poisson"):
        with_rate(trace_cfg, 2.0)
