import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from dualpace_sim.plots.runs import plot_latency_cdf, plot_timeline
from dualpace_sim.results.records import records_frame


def frame(policy: str, slowdown: float):
    rng = np.random.default_rng(1)
    reqs = []
    for i in range(50):
        times = 0.2 * i + np.cumsum(rng.exponential(0.05 * slowdown, 20))
        owners = bytearray(rng.integers(0, 2, 20).astype(np.uint8))
        reqs.append(SimpleNamespace(req_id=i, arrival_s=0.2 * i, prompt_tokens=10, max_tokens=20,
                                    token_times=times.tolist(), token_owners=owners, migrations=[]))
    return records_frame(reqs, policy)


@pytest.mark.parametrize("plot", [plot_timeline, plot_latency_cdf])
def test_plots_write_png_and_pdf(tmp_path, plot):
    frames = {"dualpace": frame("dualpace", 1.0), "vllm": frame("vllm", 2.0),
              "idle": records_frame([], "idle")}
    stem = tmp_path / "figs" / plot.__name__
    plot(frames, stem)
    png = stem.with_name(stem.name + ".png").read_bytes()
    pdf = stem.with_name(stem.name + ".pdf").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert pdf.startswith(b"%PDF") and len(pdf) > 1000


# ----------------------------------------------------------------------------- sweep figures

import json  # noqa: E402

import pandas as pd  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from dualpace_sim.cli.main import app  # noqa: E402
from dualpace_sim.plots.dirs import match_rate  # noqa: E402
from dualpace_sim.plots.sweeps import plot_sensitivity  # noqa: E402
from dualpace_sim.plots.tables import default_timeline_rate  # noqa: E402
from dualpace_sim.results.records import write_records  # noqa: E402
from dualpace_sim.results.sweep_dir import SWEEP_COLUMNS, point_dir  # noqa: E402

RATES = [1.0, 2.0, 3.0, 4.0]
TARGETS = {"normalized_latency_s": 1.0, "p99_ttft_s": 5.0, "p99_itl_s": 1.5, "p99_tpot_s": 1.0}


def sweep_table(scale: float = 1.0) -> pd.DataFrame:
    """Two policies; dualpace meets 1 s/token up to ~3.1 req/s, vllm up to ~2.1."""
    rows = []
    for policy, base in (("dualpace", 0.02), ("vllm", 0.07)):
        for rate in RATES:
            lat = scale * base * 3.5 ** rate  # spans decades
            rows.append({"policy": policy, "rate": rate, "normalized_latency_s": lat,
                         "p99_ttft_s": 10 * lat, "p99_itl_s": lat, "p99_tpot_s": lat / 2,
                         "throughput_tok_s": 100 * rate, "completed": 50, "submitted": 50,
                         "cpu_token_fraction": 0.3 if policy == "dualpace" else 0.0})
    return pd.DataFrame(rows, columns=list(SWEEP_COLUMNS[:10]))


def written(stem) -> bool:
    png, pdf = stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")
    return (png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 1000
            and pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 1000)


def gpu_only(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(token_owners=df["token_owners"].str.replace("C", "G"))


@pytest.fixture
def sweep_dir(tmp_path):
    """A sweep directory as `dualpace-sim sweep` leaves it, with synthetic records."""
    out = tmp_path / "sweep"
    out.mkdir()
    table = sweep_table()
    table.to_csv(out / "sweep.csv", index=False)
    (out / "sweep.json").write_text(json.dumps({"name": "synthetic", "targets": TARGETS}))
    for policy, rate in zip(table["policy"], table["rate"], strict=True):
        records = frame(policy, rate)
        if policy == "vllm":
            records = gpu_only(records)
        point_dir(out, policy, rate).mkdir(parents=True)
        write_records(records, point_dir(out, policy, rate) / "requests.parquet")
    return out


def test_sensitivity_figure(tmp_path):
    # Host KV 30..240 GiB: more host KV, lower latency; 30 GiB misses the target everywhere.
    settings = {f"{gib} GiB": sweep_table(60 / gib) for gib in (30, 60, 120, 240)}
    settings["30 GiB"] = sweep_table(100.0)
    plot_sensitivity(settings, "normalized_latency_s", tmp_path / "sens", "host KV", target=1.0)
    assert written(tmp_path / "sens")


def test_default_timeline_rate():
    table = sweep_table()
    assert default_timeline_rate(table, 1.0) == 2.0  # vllm misses 1 s/token above 2 req/s
    assert default_timeline_rate(table, 100.0) == 4.0
    assert default_timeline_rate(table, 0.01) == 1.0  # nobody meets it: the lowest rate


runner = CliRunner()


def test_plot_command_on_a_sweep_dir(sweep_dir):
    result = runner.invoke(app, ["plot", str(sweep_dir)])
    assert result.exit_code == 0, result.output
    plots = sweep_dir / "plots"
    for stem in ("latency_vs_rate", "p99_vs_rate", "timeline@2.0"):
        assert written(plots / stem), stem
    assert "timeline at 2 req/s" in result.output
    assert "stall at 2 req/s: dualpace:" in result.output
    assert "vllm: no CPU-produced tokens" in result.output


    result = runner.invoke(app, ["plot", str(sweep_dir), "--rate", "2.5"])
    assert result.exit_code == 2
    assert "not a swept rate" in result.output and len(result.output.splitlines()) == 1


def test_match_rate():
    assert match_rate(RATES, 4) == 4.0
    assert match_rate([0.1, 0.3], 0.1 + 0.2) == 0.3
    with pytest.raises(ValueError, match=r"--rate 2.5: not a swept rate; the sweep has 1, 2, 3"):
        match_rate(RATES, 2.5)


def test_plot_command_on_a_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_records(pd.concat([frame("dualpace", 1.0), gpu_only(frame("vllm", 2.0))]),
                  run_dir / "requests.parquet")
    (run_dir / "summary.json").write_text("[]")
    result = runner.invoke(app, ["plot", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert written(run_dir / "plots" / "timeline")
    assert written(run_dir / "plots" / "latency_cdf")
    assert "longest CPU-resident stall: dualpace:" in result.output


def test_plot_compare(sweep_dir, tmp_path):
    other = tmp_path / "other-sweep"
    shutil.copytree(sweep_dir, other)
    sweep_table(3.0).to_csv(other / "sweep.csv", index=False)
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["plot", str(sweep_dir), str(other), "--compare", "--out",
                                 str(out), "--label", "60 GiB", "--label", "30 GiB"])
    assert result.exit_code == 0, result.output
    assert written(out / "compare_vs_rate") and written(out / "compare_sustainable")


@pytest.mark.parametrize("args, expected", [
    (["--compare", "--label", "one"], "1 labels for 2 directories"),
    (["--compare"], "give --out"),
    ([], "several sweep directories with --compare"),
])
def test_plot_usage_errors_are_one_line(sweep_dir, tmp_path, args, expected):
    extra = ["--out", str(tmp_path / "o")] if "--label" in args else []
    result = runner.invoke(app, ["plot", str(sweep_dir), str(sweep_dir), *args, *extra])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and expected in result.output


def test_plot_rejects_a_folder_without_results(tmp_path):
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 2 and "not a sweep directory" in result.output
