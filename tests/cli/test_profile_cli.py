"""`dualpace-sim profile show|fit` through typer's CliRunner on ``profile_app``."""

from __future__ import annotations

import copy
import functools
import re
import shutil

import pytest
import typer
import yaml
from typer.testing import CliRunner

from dualpace_sim.cli.profile import profile_app
from dualpace_sim.costs import load_profile
from tests.conftest import RTX4090_LLAMA

runner = CliRunner()
NAMES = ["route_p", "route_f", "gpu_token_limit", "cpu_batch_limit"]


def _controls(stdout: str) -> dict[str, int]:
    last = stdout.strip().splitlines()[-4:]
    pairs = [line.split("=") for line in last]
    assert [name for name, _ in pairs] == NAMES
    return {name: int(value) for name, value in pairs}


def test_show_summarizes_the_profile():
    result = runner.invoke(profile_app, ["show", str(RTX4090_LLAMA)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "provenance: roofline" in out and "NOT a measurement" in out
    assert "model: llama-3.1-8b: 32 layers" in out
    assert "GPU 2613 blocks (5.10 GiB), host 49685 blocks (97.04 GiB)" in out
    assert "cpu.post_attn      x: batch 1..2048 (40 points)" in out
    assert "link: H2D 25.2 GB/s" in out and "q = {p: 30 \u00b5s" in out
    assert "controls: none" in out
    assert "rank_round" not in out  # one GPU: no rank group


def test_show_labels_the_rank_groups_round_work(tmp_path):
    from dualpace_sim.costs import load_profile
    from dualpace_sim.costs.profile import Table1D

    base = load_profile(RTX4090_LLAMA)
    tp = base.model_copy(update={"gpu": base.gpu.model_copy(update={
        "rank_round": Table1D(x=[1, 256], y=[1e-3, 4e-3])})})
    tp.save(tmp_path / "tp.yaml")
    result = runner.invoke(profile_app, ["show", str(tmp_path / "tp.yaml")])
    assert result.exit_code == 0, result.output
    assert "gpu.rank_round     x: rows 1..256 (2 points); y: 1 ms..4 ms (per round)" \
        in result.stdout


def test_fit_prints_controls_and_writes_figure(tmp_path):
    path = tmp_path / "llama.yaml"
    shutil.copy(RTX4090_LLAMA, path)
    result = runner.invoke(profile_app, ["fit", str(path)])
    assert result.exit_code == 0, result.output
    assert _controls(result.stdout) == {"route_p": 0, "route_f": 0, "gpu_token_limit": 512,
                                        "cpu_batch_limit": 152}
    assert "Dense Assist is cheaper at every profiled b" in result.stdout
    for suffix in (".png", ".pdf"):  # default: beside the profile
        assert (tmp_path / f"llama-fit{suffix}").stat().st_size > 10_000
    assert load_profile(path).controls is None  # no --write: the profile is untouched


def test_fit_out_dir(tmp_path):
    out_dir = tmp_path / "figs"
    result = runner.invoke(profile_app, ["fit", str(RTX4090_LLAMA), "--out-dir", str(out_dir),
                                         "--no-figure"])
    assert result.exit_code == 0, result.output
    assert not out_dir.exists() and "figure:" not in result.stdout


def test_fit_write_round_trips_and_mounts_as_a_sub_app(tmp_path):
    path = tmp_path / "llama.yaml"
    shutil.copy(RTX4090_LLAMA, path)
    before = load_profile(path)
    app = typer.Typer()
    app.add_typer(profile_app, name="profile")
    result = runner.invoke(app, ["profile", "fit", str(path), "--write", "--epsilon", "0.01",
                                 "--max-iteration-s", "0.4", "--no-figure"])
    assert result.exit_code == 0, result.output
    assert "wrote controls into" in result.stdout
    values = _controls(result.stdout)
    after = load_profile(path)
    assert after.provenance == before.provenance
    assert after.model_copy(update={"controls": None}) == before
    c = after.controls
    assert {name: getattr(c, name) for name in NAMES} == values
    assert (c.fit.epsilon, c.fit.k, c.fit.delta, c.fit.max_iteration_s) == (0.01, 5, 0.01, 0.4)
    shown = runner.invoke(profile_app, ["show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert f"cpu_batch_limit={values['cpu_batch_limit']}" in shown.stdout
    assert "epsilon 0.01, lambda_gpu 1" in shown.stdout


@functools.cache
def _rtx_data() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(RTX4090_LLAMA.read_text(), Loader=loader)


def _edited(tmp_path, edit) -> str:
    data = copy.deepcopy(_rtx_data())
    edit(data)
    path = tmp_path / "bad.yaml"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(data, Dumper=dumper, sort_keys=False))
    return str(path)


BAD = [
    ("missing table", lambda d: d["gpu"].pop("post_attn"), r"gpu\.post_attn: Field required"),
    ("non-monotone axis", lambda d: d["cpu"]["post_attn"]["x"].__setitem__(3, 1.0),
     r"cpu\.post_attn\.x: must be strictly increasing"),
    ("NaN", lambda d: d["assist"]["g_p"]["y"].__setitem__(2, float("nan")),
     r"assist\.g_p\.y\.2: .*finite"),
    ("negative", lambda d: d["cpu"]["assist_read"]["y"].__setitem__(0, -1e-5),
     r"cpu\.assist_read\.y: must be >= 0"),
    ("milliseconds", lambda d: d["gpu"]["post_attn"].__setitem__(
        "y", [v * 1e3 for v in d["gpu"]["post_attn"]["y"]]),
     r"gpu\.post_attn\.y: .*expected seconds"),
    ("constant in ms", lambda d: d["assist"]["q"].__setitem__("p", 30.0),
     r"assist\.q\.p: .*expected seconds"),
]


@pytest.mark.parametrize("command", ["show", "fit"])
@pytest.mark.parametrize(("what", "edit", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_profiles_give_one_line_and_exit_2(tmp_path, command, what, edit, message):
    path = _edited(tmp_path, edit)
    result = runner.invoke(profile_app, [command, path])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: ")
    assert re.search(message, lines[0]), lines[0]
    assert not list(tmp_path.glob("*-fit.png"))


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    result = runner.invoke(profile_app, ["fit", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {path}: no such profile file"


def test_list_keys_every_profile_by_box_model_and_splits(tmp_path):
    """The committed calibration/ as users see it: the 2-GPU measured profile keyed GPU TP 2,
    the two-rank CPU roofline keyed CPU TP 2; scenarios and specs beside them are skipped, and
    two profiles of one key and method are flagged."""
    root = RTX4090_LLAMA.parents[2]  # calibration/
    result = runner.invoke(profile_app, ["list", str(root)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "| box | model | GPU TP | CPU TP | CPU cores | method | date | file |"
    row = {tuple(c.strip() for c in line.strip("|").split("|")[:6]) for line in lines[2:]}
    row = {(box, model, gpu, cpu, method) for box, model, gpu, cpu, _, method in row}
    assert ("h200x2-xeon32", "qwen3-14b", "2", "1", "measured") in row
    assert ("rtx4090-xeon4510-2x12c", "llama-3.1-8b", "1", "2", "roofline") in row
    assert "note:" not in result.stdout  # the H200's 13- and 14-core profiles are two keys
    # the H200 profile's calibration passes and the profiles they ran with are not listed
    assert ("h200-spr16", "llama-3.1-8b", "1", "1", "measured") in row
    assert "| h200-spr16 | llama-3.1-8b | 1 | 1 | 13 | measured |" in result.stdout
    assert "llama-3.1-8b-calibration" not in result.stdout
    shutil.copy(RTX4090_LLAMA, tmp_path / "a.yaml")
    shutil.copy(RTX4090_LLAMA, tmp_path / "b.yaml")
    (tmp_path / "scenario.yaml").write_text("name: not-a-profile\n")
    result = runner.invoke(profile_app, ["list", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2 + 2 + 1
    assert "has several profiles:" in result.stdout


def test_list_fails_clearly_on_a_missing_or_empty_folder(tmp_path):
    result = runner.invoke(profile_app, ["list", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such folder" in result.output
    result = runner.invoke(profile_app, ["list", str(tmp_path)])
    assert result.exit_code == 2 and "no profiles under" in result.output


def test_show_on_a_scenario_says_it_is_a_scenario_and_names_its_profile():
    scenario = RTX4090_LLAMA.parents[3] / "scenarios" / "quickstart.yaml"
    result = runner.invoke(profile_app, ["show", str(scenario)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [f"error: {scenario}: a scenario, not a profile; its profile is "
                     f"{RTX4090_LLAMA} (give that file, or `dualpace-sim run {scenario}` to "
                     f"simulate the scenario)"]


def test_compare_names_the_two_profiles_it_compares(tmp_path):
    other = tmp_path / "other.yaml"
    shutil.copy(RTX4090_LLAMA, other)
    result = runner.invoke(profile_app, ["compare", str(RTX4090_LLAMA), str(other)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"A: {RTX4090_LLAMA} (roofline, ")
    assert lines[1].startswith(f"B: {other} (roofline, ")
    assert "| table | points | median A/B |" in result.output
    assert "measured/roofline" not in result.output
