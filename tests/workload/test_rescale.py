"""Rescaling a trace's lengths: the target mean is met and the shape is kept."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dualpace_sim.workload import load_azure_trace, rescale_to_mean


@pytest.mark.parametrize("kind,column,target", [
    ("conv", "prompt_tokens", 1599.0), ("conv", "output_tokens", 114.0),
    ("code", "prompt_tokens", 2348.0), ("code", "output_tokens", 22.0),
])
def test_azure_lengths_reach_the_papers_means_with_their_shape(azure_dir, kind, column, target):
    """The DualPace paper's means for the two Azure traces (docs: ../shared/data/azure)."""
    trace = load_azure_trace(azure_dir / f"AzureLLMInferenceTrace_{kind}.csv", first_n=2000)
    before = getattr(trace, column)
    after = rescale_to_mean(before, target)
    assert after.dtype == np.int64 and after.min() >= 1
    assert after.mean() == pytest.approx(target, abs=0.5)
    # the shape: no two requests change places, and quantiles relative to the mean stay
    assert np.all(np.diff(after[np.argsort(before, kind="stable")]) >= 0)
    for q in (50, 90, 99):
        ratio_before = np.percentile(before, q) / before.mean()
        assert np.percentile(after, q) / after.mean() == pytest.approx(ratio_before, rel=0.05)


def test_prompt_output_correlation_survives_rescaling(azure_dir):
    trace = load_azure_trace(azure_dir / "AzureLLMInferenceTrace_conv.csv", first_n=2000)
    prompt = rescale_to_mean(trace.prompt_tokens, 1599.0)
    output = rescale_to_mean(trace.output_tokens, 114.0)
    before = stats.spearmanr(trace.prompt_tokens, trace.output_tokens).statistic
    assert stats.spearmanr(prompt, output).statistic == pytest.approx(before, abs=0.01)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50_000), min_size=1, max_size=300),
       target=st.floats(1.0, 20_000.0))
def test_the_mean_is_met_within_half_a_token_and_the_order_kept(lengths, target):
    values = np.array(lengths)
    out = rescale_to_mean(values, target)
    assert out.min() >= 1 and len(out) == len(values)
    assert np.all(np.diff(out[np.argsort(values, kind="stable")]) >= 0)  # order kept
    # each crossing of a rounding boundary moves one length by one token, so the rounded mean
    # moves in steps of at most one token and the nearest step is within half a token
    assert abs(out.mean() - target) <= 0.5 + 1e-9
