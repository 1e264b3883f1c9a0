"""The figures people look for (throughput and goodput, utilisation, CDFs per rate, queues and
KV over time), their counter tracks in the trace, and the fixes to the old ones: one shared
legend outside the data, an empty CPU panel that says so, mathtext in the Figure-7 panels."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pandas as pd
import pytest
from typer.testing import CliRunner

import dualpace_sim.plots.layout as layout
import dualpace_sim.plots.runs as run_plots
import dualpace_sim.plots.serving as serving_plots
import dualpace_sim.plots.sweeps as sweep_plots
from dualpace_sim.cli.main import app
from dualpace_sim.experiments.sweep import run_sweep
from dualpace_sim.plots.tables import series_table
from dualpace_sim.results.node_series import ENGINES, read_series
from dualpace_sim.results.records import records_frame

runner = CliRunner()


def written(stem) -> bool:
    png, pdf = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")
    return (png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 1000
            and pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 1000)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from tests.conftest import RTX4090_LLAMA

    folder = tmp_path_factory.mktemp("serving")
    path = folder / "s.yaml"
    path.write_text(json.dumps({
        "name": "serving", "profile": str(RTX4090_LLAMA), "policies": ["dualpace", "vllm"],
        "vllm": {"max_num_batched_tokens": 2048, "max_num_seqs": 256},
        "scheduler": {"gpu_kv_blocks": 400},
        "workload": {"num_requests": 40, "rate": 2.0, "seed": 1},
        "sweep": {"rates": [2.0, 8.0]}}))
    run_sweep(path, folder / "sw", workers=1, progress=False)
    return folder / "sw"


def test_every_new_sweep_figure_is_written(sweep):
    result = runner.invoke(app, ["plot", str(sweep)])
    assert result.exit_code == 0, result.output
    for stem in ("throughput_vs_rate", "utilisation_vs_rate", "latency_cdf_by_rate_dualpace",
                 "latency_cdf_by_rate_vllm", "state_over_time@8.0", "latency_vs_rate",
                 "p99_vs_rate", "timeline@8.0"):
        assert written(sweep / "plots" / stem), stem


def test_a_run_dir_gets_its_state_figure(sweep):
    point = sweep / "points" / "dualpace@2.0"
    result = runner.invoke(app, ["plot", str(point), "--out", str(sweep / "one")])
    assert result.exit_code == 0, result.output
    assert written(sweep / "one" / "state_over_time")


def test_seeded_sweeps_are_drawn_with_bands(write_scenario, tmp_path):
    path = write_scenario(workload={"num_requests": 20},
                          sweep={"rates": [2.0, 6.0], "seeds": [1, 2, 3]})
    run_sweep(path, tmp_path / "sw", workers=1, progress=False)
    table = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    series = series_table(table)
    assert len(series) == 2 and "workload.seed" not in series.columns
    row = series.iloc[1]
    assert row["p99_ttft_s_ci_low"] <= row["p99_ttft_s"] <= row["p99_ttft_s_ci_high"]
    assert row["p99_ttft_s"] == pytest.approx(table[table["rate"] == 6.0]["p99_ttft_s"].mean())
    result = runner.invoke(app, ["plot", str(tmp_path / "sw")])
    assert result.exit_code == 0, result.output
    assert written(tmp_path / "sw" / "plots" / "throughput_vs_rate")


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plot functions save, kept for inspection."""
    kept = []
    real = layout.save_figure

    def keep(fig, out_stem):
        kept.append(fig)
        return real(fig, out_stem)

    for module in (run_plots, sweep_plots, serving_plots):
        monkeypatch.setattr(module, "save_figure", keep)
    return kept


def gpu_only_frame():
    reqs = [SimpleNamespace(req_id=i, arrival_s=float(i), prompt_tokens=10, max_tokens=3,
                            token_times=[i + 0.5, i + 1.0, i + 1.5], token_owners=bytearray(3),
                            migrations=[]) for i in range(5)]
    return records_frame(reqs, "vllm")


def test_an_unused_cpu_panel_says_so_instead_of_a_flat_line(figures, tmp_path):
    run_plots.plot_timeline({"vllm": gpu_only_frame()}, tmp_path / "t", annotate_stalls=True)
    _, cpu_ax = figures[0].axes
    assert not cpu_ax.get_lines()
    assert [t.get_text() for t in cpu_ax.texts] == ["no CPU-decoded tokens"]


def test_one_shared_legend_below_the_panels_and_mathtext(figures, tmp_path):
    table = pd.DataFrame({"policy": ["a", "a", "b", "b"], "rate": [1.0, 2.0, 1.0, 2.0],
                          "p99_ttft_s": [1, 6, 2, 7.0], "p99_itl_s": [0.1, 2, 0.2, 3.0],
                          "p99_tpot_s": [0.1, 2, 0.3, 3.0]})
    sweep_plots.plot_p99_vs_rate(table, tmp_path / "p", {"p99_ttft_s": 5.0, "p99_itl_s": 1.5,
                                                   "p99_tpot_s": 1.0})
    fig = figures[0]
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a", "b"]
    assert fig.legends[0]._loc_used_default is False  # placed outside, not "best" over data
    assert all("$P_{99}$" in ax.get_ylabel() for ax in fig.axes)
    assert "sustainable" in fig.axes[0].get_title()


def test_the_state_figure_of_a_gpu_only_run_says_which_panels_are_unused(figures,
                                                                           write_scenario,
                                                                           tmp_path):
    """vLLM has no host pool and no CPU engine: those panels say so; the others draw the
    series from the run's state.parquet and utilisation.parquet."""
    out = tmp_path / "o"
    path = write_scenario(policies=["vllm"], vllm={"max_num_batched_tokens": 2048,
                                                   "max_num_seqs": 256})
    result = runner.invoke(app, ["run", str(path), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    figures.clear()
    result = runner.invoke(app, ["plot", str(out)])
    assert result.exit_code == 0, result.output
    fig = next(f for f in figures if "utilisation over time" in f.get_suptitle())
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    assert texts["Host KV held, and with reserved growth (dashed)"] == ["no host KV used"]
    assert texts["CPU engine utilisation"] == ["no CPU engine work"]
    assert texts["PCIe utilisation"] == ["no PCIe transfers"]
    gpu_ax = next(ax for ax in fig.axes if ax.get_title() == "GPU utilisation")
    assert gpu_ax.get_lines() and max(gpu_ax.get_lines()[0].get_ydata()) > 0.5
    assert written(out / "plots" / "state_over_time")


def test_a_run_without_series_files_gets_a_line_not_a_figure(write_scenario, tmp_path):
    out = tmp_path / "o"
    assert runner.invoke(app, ["run", str(write_scenario()), "-o", str(out), "-q"]).exit_code == 0
    (out / "state.parquet").unlink()
    result = runner.invoke(app, ["plot", str(out)])
    assert result.exit_code == 0, result.output
    assert "has no dualpace state.parquet (made by an older version)" in result.output
    assert not (out / "plots" / "state_over_time.png").exists()


def test_the_trace_has_counter_tracks_for_the_same_series(write_scenario, tmp_path):
    trace = tmp_path / "t.json.gz"
    result = runner.invoke(app, ["run", str(write_scenario()), "-o", str(tmp_path / "o"), "-q",
                                 "--trace-events", str(trace)])
    assert result.exit_code == 0, result.output
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"requests", "KV blocks", "utilisation"}
    series = read_series(tmp_path / "o")["dualpace"]
    kv = [e for e in counters if e["name"] == "KV blocks"]
    # one sample per row of state.parquet, the same values
    assert [e["args"]["hbm_kv_blocks"] for e in kv] == series.state["hbm_kv_blocks"].tolist()
    assert [e["args"]["host_kv_growth_blocks"] for e in kv] == \
        series.state["host_kv_growth_blocks"].tolist()
    assert max(e["args"]["hbm_kv_blocks"] for e in kv) > 0 and kv[-1]["args"]["hbm_kv_blocks"] == 0
    util = [e["args"] for e in counters if e["name"] == "utilisation"]
    assert len(util) == len(series.utilisation) + 1  # each bin, then 0 at the end
    assert [a["gpu"] for a in util[:-1]] == pytest.approx(series.utilisation["gpu"].tolist(),
                                                          abs=1e-6)
    assert all(0 <= a[e] <= 1 for a in util for e in ENGINES)
