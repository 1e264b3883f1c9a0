from pathlib import Path

import pytest
import yaml

from dualpace_sim.costs import (
    ModelShape,
    Profile,
    ProfileError,
    load_profile,
    load_spec,
    synthesize,
)
from dualpace_sim.costs.profile import QUICK_NOTE, Controls, check_magnitudes

ROOT = Path(__file__).resolve().parents[2]
RTX4090 = ROOT / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"


@pytest.fixture(scope="module")
def tiny_profile() -> Profile:
    return synthesize(load_spec("h200-spr16"), ModelShape.from_name("tiny-llama"))


def _write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(
        yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    )
    return path


def _load_error(tmp_path, data) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip(tmp_path, tiny_profile, suffix):
    path = tmp_path / f"profile{suffix}"
    tiny_profile.save(path)
    assert load_profile(path) == tiny_profile


def test_roofline_files_say_so(tmp_path, tiny_profile):
    path = tmp_path / "p.yaml"
    tiny_profile.save(path)
    assert "NOT a measurement" in path.read_text().splitlines()[0]


def test_non_increasing_axis_names_file_and_field(tmp_path, tiny_profile):
    data = tiny_profile.model_dump(mode="json")
    data["gpu"]["decode_attn"]["x"][1] = data["gpu"]["decode_attn"]["x"][0]
    assert _load_error(tmp_path, data) == "gpu.decode_attn.x: must be strictly increasing"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["cpu"]["post_attn"]["y"].pop(), "cpu.post_attn.y: has 39 values but x has 40"),
        (lambda d: d["assist"]["g_p"]["y"].__setitem__(0, -1.0), "assist.g_p.y: must be >= 0"),
        (lambda d: d["gpu"]["prefill_attn"]["z"].pop(), "gpu.prefill_attn.z: has 27 rows but x"),
        (lambda d: d["link"].update(h2d_bytes_per_s=0), "link.h2d_bytes_per_s: Input should be"),
        (lambda d: d["gpu"].update(bogus=1), "gpu.bogus: Extra inputs are not permitted"),
        (lambda d: d.update(format="dualpace-profile/9"), "format: Input should be"),
        (lambda d: d["provenance"].update(method="guessed"), "provenance.method: Input should be"),
        (lambda d: d["model"].update(n_heads=3), "model: n_heads (3) must be a multiple"),
        (lambda d: d.update(controls={"route_p": 4, "route_f": 8}), "controls: (route_p, route_f)"),
        (lambda d: d["cpu"].pop("assist_read"), "cpu.assist_read: Field required"),
    ],
)
def test_bad_profiles_give_one_line_errors(tmp_path, tiny_profile, edit, expected):
    data = tiny_profile.model_dump(mode="json")
    edit(data)
    assert _load_error(tmp_path, data).startswith(expected)


def test_several_errors_are_counted(tmp_path, tiny_profile):
    data = tiny_profile.model_dump(mode="json")
    data["gpu"]["iteration_overhead_s"] = -1
    data["cpu"]["iteration_overhead_s"] = -1
    assert _load_error(tmp_path, data).endswith("(+1 more)")


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("format: dualpace-profile/1\ngpu: [1, 2\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: not valid YAML at line \d+, column \d+"):
        load_profile(path)


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ProfileError, match="expected a mapping"):
        load_profile(_write(tmp_path, [1, 2]))


def test_unquoted_date_and_optional_sections(tmp_path, tiny_profile):
    data = tiny_profile.model_dump(mode="json", exclude={"neo", "controls"})
    path = _write(tmp_path, data)
    path.write_text(path.read_text().replace(f"'{data['provenance']['date']}'", "2026-01-31"))
    loaded = load_profile(path)
    assert loaded.provenance.date == "2026-01-31"
    assert loaded.neo.launch_s == 0.0008
    assert loaded.controls is None


def test_controls_accept_legal_thresholds(tmp_path, tiny_profile):
    data = tiny_profile.model_dump(mode="json")
    data["controls"] = {"route_p": 32, "route_f": 16, "gpu_token_limit": 1024}
    assert load_profile(_write(tmp_path, data)).controls.route_p == 32


@pytest.mark.parametrize(("provenance", "quick"), [
    ({"quick": True}, True),
    ({"quick": False, "command": "dualpace-hw profile --quick"}, False),  # the field decides
    ({"command": "dualpace-hw profile --model m --out p.yaml --quick"}, True),  # before the field
    ({"command": "dualpace-hw profile --model quick-llama --out p.yaml"}, False),
    ({"notes": f"timed on 2 cores. {QUICK_NOTE}: for tests, not for studies."}, True),
    ({}, False),
])
def test_a_profile_says_whether_it_is_a_quick_one(tmp_path, tiny_profile, provenance, quick):
    """`quick` in the provenance, or for a profile written before that field, the profiler's
    --quick in its command or its QUICK line in its notes; the file loads either way."""
    data = tiny_profile.model_dump(mode="json", exclude_none=True)
    data["provenance"] = {"method": "measured", "date": "2026-12-01", **provenance}
    assert load_profile(_write(tmp_path, data)).provenance.is_quick() is quick


def test_controls_fit_schema_is_strict():
    fit = {"epsilon": 0.0025, "lambda_gpu": 1.0, "k": 5, "delta": 0.01, "date": "2026-12-01"}
    Controls.model_validate({"route_p": 32, "route_f": 16, "fit": fit})
    with pytest.raises(ValueError, match="extra"):
        Controls.model_validate({"fit": {**fit, "lamda": 1}})
    with pytest.raises(ValueError):
        Controls.model_validate({"fit": {**fit, "delta": 1.5}})


def test_milliseconds_are_detected():
    rtx = load_profile(RTX4090)
    data = rtx.model_dump(mode="json")
    data["gpu"]["post_attn"]["y"] = [v * 1e3 for v in data["gpu"]["post_attn"]["y"]]
    ms = type(rtx).model_validate(data)
    with pytest.raises(ProfileError, match=r"^x\.yaml: gpu\.post_attn\.y: .*expected seconds"):
        check_magnitudes(ms, "x.yaml")
    data = rtx.model_dump(mode="json")
    data["link"]["h2d_bytes_per_s"] = 25.2
    with pytest.raises(ProfileError, match="link.h2d_bytes_per_s: .*bytes per second"):
        check_magnitudes(type(rtx).model_validate(data), "x.yaml")
