"""A run's results in the result-JSON layout of vLLM's serving benchmark.

``vllm bench serve --save-result`` (formerly ``benchmarks/benchmark_serving.py``) writes one JSON
object per run: run settings, totals and throughputs, per-request lists (input and output
lengths, TTFTs, each request's inter-token gaps) and, for each of TTFT, TPOT, ITL and E2EL,
``mean_/median_/std_<m>_ms`` and ``p<P>_<m>_ms``. Scripts written against those files read
these too. The native names (summary.json) stay in seconds; this layout is in milliseconds for
the statistics and seconds for the per-request lists, as vLLM's is.

Differences, because a simulation is not a client: ``generated_texts`` are empty strings (there
are no tokens' texts); ``duration`` is the run's makespan (first arrival to last token); a
request that did not produce all its tokens is a failure with an ``errors`` entry, as a failed
request is in vLLM; ``request_goodput`` uses the scenario's targets (metrics.good_requests), and
is null, as vLLM's without ``--goodput``, for a run whose summary records no scenario.
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import pandas as pd

from dualpace_sim.results.metrics import (
    DEFAULT_PERCENTILES,
    LATENCIES,
    percentile_word,
    request_arrays,
    serving_metrics,
)

# The keys vLLM's benchmark writes before the per-latency statistics, in its order.
HEAD_KEYS = (
    "date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
    "max_concurrency", "duration", "completed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
)


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else value * 1000.0


def vllm_result(df: pd.DataFrame, summary: dict) -> dict:
    """One policy's records (``df``) and summary.json entry (``summary``) as vLLM's benchmark
    would have saved them."""
    record = summary.get("provenance") or {}
    scenario = record.get("scenario") or {}
    percentiles = (scenario.get("metrics") or {}).get("percentiles") or DEFAULT_PERCENTILES
    targets = scenario.get("targets")  # None for a run without provenance (no SLOs known)
    window = float(summary["makespan_s"])
    native = serving_metrics(df, window, percentiles, targets)
    *_, n_tokens, done = request_arrays(df)
    times = df["token_times_s"]
    model = (record.get("profile") or {}).get("model")
    result = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": f"dualpace-sim/{summary['policy']}",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": int(summary["submitted"]),
        "request_rate": summary.get("rate"),
        "burstiness": 1.0,  # Poisson arrivals; vLLM's gamma shape 1
        "max_concurrency": None,
        "duration": window,
        "completed": int(done.sum()),
        "total_input_tokens": int(df["prompt_tokens"].to_numpy(dtype=np.int64)[done].sum()),
        "total_output_tokens": int(n_tokens[done].sum()),
        "request_throughput": native["request_throughput_req_s"],
        "request_goodput": native["goodput_req_s"] if targets else None,  # as without --goodput
        "output_throughput": int(n_tokens[done].sum()) / window if window > 0 else None,
        "total_token_throughput": native["total_token_throughput_tok_s"],
        "input_lens": [int(v) for v in df["prompt_tokens"]],
        "output_lens": [int(v) for v in n_tokens],
        "ttfts": [float(t[0] - a) if len(t) else 0.0 for t, a in zip(times, df["arrival_s"],
                                                                      strict=True)],
        "itls": [np.diff(np.asarray(t, dtype=float)).tolist() for t in times],
        "generated_texts": [""] * len(df),
        "errors": ["" if ok else f"produced {n} of {m} tokens" for ok, n, m in
                   zip(done, n_tokens, df["max_tokens"], strict=True)],
    }
    for name in LATENCIES:
        result[f"mean_{name}_ms"] = _ms(native[f"mean_{name}_s"])
        result[f"median_{name}_ms"] = _ms(native[f"median_{name}_s"])
        result[f"std_{name}_ms"] = _ms(native[f"std_{name}_s"])
        for p in percentiles:
            word = percentile_word(p)
            result[f"p{word}_{name}_ms"] = _ms(native[f"p{word}_{name}_s"])
    return result
