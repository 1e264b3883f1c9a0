from importlib.resources import files

import numpy as np
import pytest
from scipy import stats

from dualpace_sim.workload import WorkloadError, load_azure_trace, load_length_table, sample_lengths
from dualpace_sim.workload.default import TABLE_RESOURCE, main


@pytest.mark.parametrize("kind", ["conv", "code"])
def test_samples_match_trace_means_and_correlation_sign(azure_dir, kind):
    trace = load_azure_trace(azure_dir / f"AzureLLMInferenceTrace_{kind}.csv", first_n=2000)
    prompt, output = sample_lengths(kind, 20000, np.random.default_rng(3))
    assert prompt.mean() == pytest.approx(trace.prompt_tokens.mean(), rel=0.03)
    assert output.mean() == pytest.approx(trace.output_tokens.mean(), rel=0.03)
    measured = stats.spearmanr(trace.prompt_tokens, trace.output_tokens).statistic
    sampled = stats.spearmanr(prompt, output).statistic
    assert np.sign(sampled) == np.sign(measured)
    assert sampled == pytest.approx(measured, abs=0.05)


def test_samples_are_integers_within_the_table_and_reproducible():
    table = load_length_table("code")
    a = sample_lengths("code", 500, np.random.default_rng(1))
    b = sample_lengths("code", 500, np.random.default_rng(1))
    c = sample_lengths("code", 500, np.random.default_rng(2))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert a[0].dtype == np.int64 and a[0].min() >= 1
    assert a[0].max() <= table.prompt_quantiles[-1]


def test_table_is_monotone_and_stores_correlation():
    for kind in ("conv", "code"):
        table = load_length_table(kind)
        assert table.levels[0] == 0.0 and table.levels[-1] == 1.0
        assert np.all(np.diff(table.levels) > 0)
        assert np.all(np.diff(table.prompt_quantiles) >= 0)
        assert np.all(np.diff(table.output_quantiles) >= 0)
        assert -1 < table.spearman < 1
    assert load_length_table("conv").spearman > 0 > load_length_table("code").spearman
    with pytest.raises(WorkloadError, match="unknown trace"):
        load_length_table("chat")


def test_packaged_table_is_what_the_generator_writes(azure_dir, tmp_path, capsys):
    out = tmp_path / "table.yaml"
    main(["--regenerate", str(azure_dir), "--out", str(out)])
    assert "conv: prompt mean 1104.78" in capsys.readouterr().out
    packaged = files("dualpace_sim").joinpath(TABLE_RESOURCE).read_text()
    assert out.read_text() == packaged
    assert "CC-BY 4.0" in packaged and "Splitwise" in packaged
