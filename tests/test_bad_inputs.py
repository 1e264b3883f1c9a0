"""The bad-input suite: every input a user can get wrong, as an adversarial user would.

Each case is a command line of `dualpace-sim` or `dualpace-hw` given one bad input (a scenario
field, a scenario file, a profile, a trace, an option, a real run's files). Each must exit 2
with exactly one line on stderr that starts with ``error:``, names the file or option at fault
and says what is wrong, with no traceback and no partial output: the results folder the
command was given is not created.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.experiments.runner import run_scenario

from .conftest import RTX4090_LLAMA

runner = CliRunner()

BASE = {
    "name": "bad",
    "profile": str(RTX4090_LLAMA),
    "workload": {"source": "default", "trace": "conv", "num_requests": 8, "arrival": "poisson",
                 "rate": 4.0, "seed": 1},
}


@dataclass
class Case:
    """One bad command line. ``make(tmp)`` writes what it needs under ``tmp`` and returns the
    arguments; ``names`` (formatted with ``tmp``) must appear in the error line, and so must a
    match of ``expect``."""

    id: str
    make: Callable[[Path], list[str]]
    names: str
    expect: str
    cli: str = "sim"


def _merged(base: dict, fields: dict) -> dict:
    out = dict(base)
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _write(tmp: Path, name: str, data: bytes | str) -> Path:
    path = tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _scenario(tmp: Path, file: str = "s.yaml", **fields) -> Path:
    return _write(tmp, file, yaml.safe_dump(_merged(BASE, fields)))


def run_with(**fields) -> Callable[[Path], list[str]]:
    """`dualpace-sim run` of the base scenario with ``fields`` merged in."""
    return lambda tmp: ["run", str(_scenario(tmp, **fields)), "--out", str(tmp / "out")]


def run_text(text: bytes | str) -> Callable[[Path], list[str]]:
    """`dualpace-sim run` of a scenario file holding exactly ``text``."""
    return lambda tmp: ["run", str(_write(tmp, "s.yaml", text)), "--out", str(tmp / "out")]


# --- scenario fields ----------------------------------------------------------------------------

FIXED = {"distribution": "fixed", "mean": 8}
SYNTHETIC = {"source": "synthetic", "prompt": FIXED, "output": FIXED}

FIELD_CASES = [
    # (id, fields, the field the message must name, what else it must say)
    ("top-level typo", {"polices": ["dualpace"]}, "polices", "unknown key"),
    ("workload typo", {"workload": {"rtae": 3}}, "workload.rtae", "unknown key"),
    ("scheduler typo", {"scheduler": {"host_kv_block": 8}}, "scheduler.host_kv_block",
     "unknown key"),
    ("vllm typo", {"policies": ["vllm"], "vllm": {"max_num_seq": 4,
                                                   "max_num_batched_tokens": 512}},
     "vllm", "unknown key|max_num_seqs"),
    ("neo typo", {"neo": {"max_batch": 4}}, "neo.max_batch", "unknown key"),
    ("targets typo", {"targets": {"p99_ttf_s": 1}}, "targets.p99_ttf_s", "unknown key"),
    ("sweep typo", {"sweep": {"rate": [1, 2]}}, "sweep", "unknown key|rates"),
    ("roofline typo", {"profile": None, "roofline": {"hardware": "rtx4090-xeon4510-12c",
                                                      "model": "llama-3.1-8b", "gpu_mem": 1}},
     "roofline.gpu_mem", "unknown key"),
    ("no workload", {"workload": None}, "workload", ""),
    ("neither profile nor roofline", {"profile": None}, "", "exactly one of profile"),
    ("both profile and roofline", {"roofline": {"hardware": "rtx4090-xeon4510-12c",
                                                "model": "llama-3.1-8b"}}, "", "exactly one"),
    ("unknown policy", {"policies": ["dualpace", "magic"]}, "policies.1", "magic"),
    ("repeated policy", {"policies": ["dualpace", "dualpace"]}, "", "once"),
    ("no policies", {"policies": []}, "policies", ""),
    ("vllm without section", {"policies": ["vllm"]}, "", "vllm section"),
    ("policies not a list", {"policies": "dualpace"}, "policies", ""),
    ("name not text", {"name": ["a"]}, "name", ""),
    ("profile not text", {"profile": 3}, "profile", ""),
    ("num_requests true", {"workload": {"num_requests": True}}, "workload.num_requests", "True"),
    ("num_requests false", {"workload": {"num_requests": False}}, "workload.num_requests", ""),
    ("num_requests text", {"workload": {"num_requests": "many"}}, "workload.num_requests", ""),
    ("num_requests float", {"workload": {"num_requests": 8.5}}, "workload.num_requests", ""),
    ("num_requests 0", {"workload": {"num_requests": 0}}, "workload.num_requests", ""),
    ("num_requests negative", {"workload": {"num_requests": -5}}, "workload.num_requests", ""),
    ("num_requests 10^8", {"workload": {"num_requests": 100_000_000}}, "workload.num_requests",
     "2000000"),
    ("seed -1", {"workload": {"seed": -1}}, "workload.seed", ">= 0|greater than or equal"),
    ("seed true", {"workload": {"seed": True}}, "workload.seed", ""),
    ("seed float", {"workload": {"seed": 1.5}}, "workload.seed", ""),
    ("rate 0", {"workload": {"rate": 0}}, "workload.rate", ""),
    ("rate negative", {"workload": {"rate": -1}}, "workload.rate", ""),
    ("rate text", {"workload": {"rate": "fast"}}, "workload.rate", ""),
    ("rate nan", {"workload": {"rate": float("nan")}}, "workload.rate", ""),
    ("rate inf", {"workload": {"rate": float("inf")}}, "workload.rate", ""),
    ("rate true", {"workload": {"rate": True}}, "workload.rate", ""),
    ("poisson without rate", {"workload": {"rate": None}}, "workload", "rate"),
    ("time_scale with poisson", {"workload": {"time_scale": 2.0}}, "workload", "time_scale"),
    ("unknown source", {"workload": {"source": "mystery"}}, "workload.source", "mystery"),
    ("unknown arrival", {"workload": {"arrival": "burst"}}, "workload.arrival", "burst"),
    ("unknown default trace", {"workload": {"trace": "chat"}}, "workload", "conv or code"),
    ("default with path", {"workload": {"path": "t.csv"}}, "workload", "no path"),
    ("default with trace arrivals", {"workload": {"arrival": "trace", "rate": None}},
     "workload", "no timestamps"),
    ("vidur without path", {"workload": {"source": "vidur"}}, "workload", "needs path"),
    ("unregistered trace", {"workload": {"source": "trace", "trace": "nope"}}, "workload",
     "one of"),
    ("synthetic without output", {"workload": {"source": "synthetic", "prompt": FIXED}},
     "workload", "synthetic needs output"),
    ("length distribution typo", {"workload": {**SYNTHETIC, "prompt": {"distribution": "fixed",
                                                                       "meen": 4}}},
     "workload.prompt.meen", "did you mean mean"),
    ("unknown length distribution", {"workload": {**SYNTHETIC, "output": {
        "distribution": "pareto", "mean": 4}}}, "workload.output.distribution", "pareto"),
    ("lognormal mean below median", {"workload": {**SYNTHETIC, "prompt": {
        "distribution": "lognormal", "mean": 100, "median": 200}}}, "workload.prompt",
     "raise mean"),
    ("zipf mean out of reach", {"workload": {**SYNTHETIC, "output": {
        "distribution": "zipf", "max": 100, "mean": 90}}}, "workload.output", "change max"),
    ("uniform with sigma", {"workload": {**SYNTHETIC, "prompt": {
        "distribution": "uniform", "mean": 10, "sigma": 1}}}, "workload.prompt",
     "sigma does not apply"),
    ("length mean negative", {"workload": {**SYNTHETIC, "prompt": {
        "distribution": "fixed", "mean": -3}}}, "workload.prompt.mean", ""),
    ("prompt_mean 0", {"workload": {"prompt_mean": 0}}, "workload.prompt_mean", ""),
    ("output_mean with synthetic", {"workload": {**SYNTHETIC, "output_mean": 5}}, "workload",
     "output.mean"),
    ("max_prompt_tokens 0", {"workload": {"max_prompt_tokens": 0}},
     "workload.max_prompt_tokens", ""),
    ("max_output_tokens true", {"workload": {"max_output_tokens": True}},
     "workload.max_output_tokens", ""),
    ("gpu_kv_blocks 0", {"scheduler": {"gpu_kv_blocks": 0}}, "scheduler.gpu_kv_blocks", ""),
    ("gpu_kv_blocks true", {"scheduler": {"gpu_kv_blocks": True}}, "scheduler.gpu_kv_blocks",
     ""),
    ("host_kv_blocks negative", {"scheduler": {"host_kv_blocks": -1}},
     "scheduler.host_kv_blocks", ""),
    ("host_kv_blocks text", {"scheduler": {"host_kv_blocks": "lots"}},
     "scheduler.host_kv_blocks", ""),
    ("gpu_max_rows 0", {"scheduler": {"gpu_max_rows": 0}}, "scheduler.gpu_max_rows", ""),
    ("gpu_token_limit 0", {"scheduler": {"gpu_token_limit": 0}}, "scheduler.gpu_token_limit",
     ""),
    ("gpu_hard_token_limit float", {"scheduler": {"gpu_hard_token_limit": 1.5}},
     "scheduler.gpu_hard_token_limit", ""),
    ("staging_blocks negative", {"scheduler": {"staging_blocks": -1}},
     "scheduler.staging_blocks", ""),
    ("cpu_batch_limit 0", {"scheduler": {"cpu_batch_limit": 0}}, "scheduler.cpu_batch_limit",
     ""),
    ("host_max_requests 0", {"scheduler": {"host_max_requests": 0}},
     "scheduler.host_max_requests", ""),
    ("route_p negative", {"scheduler": {"route_p": -1}}, "scheduler.route_p", ""),
    ("route_f true", {"scheduler": {"route_f": True}}, "scheduler.route_f", ""),
    ("illegal thresholds", {"scheduler": {"route_p": 2, "route_f": 5}}, "scheduler",
     "illegal routing thresholds"),
    ("scheduler not a mapping", {"scheduler": [1, 2]}, "scheduler", ""),
    ("vllm batched tokens 0", {"policies": ["vllm"], "vllm": {"max_num_batched_tokens": 0,
                                                              "max_num_seqs": 4}},
     "vllm.max_num_batched_tokens", ""),
    ("vllm seqs true", {"policies": ["vllm"], "vllm": {"max_num_batched_tokens": 512,
                                                       "max_num_seqs": True}},
     "vllm.max_num_seqs", ""),
    ("neo batch 0", {"neo": {"max_batch_size": 0}}, "neo.max_batch_size", ""),
    ("neo tokens text", {"neo": {"max_tokens_in_batch": "x"}}, "neo.max_tokens_in_batch", ""),
    ("neo swap_in_fraction 2", {"neo": {"swap_in_fraction": 2}}, "neo.swap_in_fraction", ""),
    ("target 0", {"targets": {"p99_ttft_s": 0}}, "targets.p99_ttft_s", ""),
    ("target text", {"targets": {"normalized_latency_s": "low"}},
     "targets.normalized_latency_s", ""),
    ("sweep one rate", {"sweep": {"rates": [1.0]}}, "sweep.rates", ""),
    ("sweep decreasing", {"sweep": {"rates": [2.0, 1.0]}}, "sweep", "increasing"),
    ("sweep rate 0", {"sweep": {"rates": [0.0, 1.0]}}, "sweep", "> 0"),
    ("roofline unknown hardware", {"profile": None, "roofline": {"hardware": "abacus",
                                                                 "model": "llama-3.1-8b"}},
     "roofline", "abacus"),
    ("roofline unknown model", {"profile": None, "roofline": {"hardware":
                                                              "rtx4090-xeon4510-12c",
                                                              "model": "gpt-9"}},
     "roofline", "gpt-9"),
    ("roofline gpu_mem_util 0", {"profile": None, "roofline": {
        "hardware": "rtx4090-xeon4510-12c", "model": "llama-3.1-8b", "gpu_mem_util": 0}},
     "roofline.gpu_mem_util", ""),
    ("request beyond host pool", {"scheduler": {"host_kv_blocks": 2}}, "workload",
     "scheduler.host_kv_blocks"),
    ("request beyond HBM for vllm", {"policies": ["vllm"], "vllm": {
        "max_num_batched_tokens": 512, "max_num_seqs": 4}, "scheduler": {"gpu_kv_blocks": 2}},
     "workload", "scheduler.gpu_kv_blocks"),
    ("prompt beyond NEO's batch", {"policies": ["neo"], "neo": {"max_tokens_in_batch": 4}},
     "workload", "neo.max_tokens_in_batch"),
    ("NEO host pool no larger than HBM", {"policies": ["neo"], "scheduler": {
        "gpu_kv_blocks": 4096, "host_kv_blocks": 2048}}, "scheduler",
     "NEO needs a host KV pool larger than the HBM pool.*scheduler.host_kv_blocks above 4096"),
    ("shared budget of an absent policy", {"shared_gpu_budget": "neo"}, "", "not one of the "
                                                                              "policies"),
    ("shared budget unknown", {"shared_gpu_budget": "sglang"}, "shared_gpu_budget", "sglang"),
]

CASES = [Case(f"scenario field: {name}", run_with(**fields), "{tmp}/s.yaml",
              re.escape(field) + (f".*({expect})" if expect else ""))
         for name, fields, field, expect in FIELD_CASES]


# --- scenario files -----------------------------------------------------------------------------

def _alias_bomb(key: str = "x") -> str:
    lines = [f'a0: &a0 ["{key}", "{key}", "{key}", "{key}", "{key}", "{key}", "{key}", "{key}"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 8) + "]")
    return "\n".join(lines) + "\n"


BASE_TEXT = yaml.safe_dump(BASE)

CASES += [
    Case("scenario file: UTF-16", run_text(BASE_TEXT.encode("utf-16")), "{tmp}/s.yaml",
         "UTF-16.*UTF-8"),
    Case("scenario file: Latin-1", run_text(("description: caf\xe9\n" + BASE_TEXT)
                                            .encode("latin-1")), "{tmp}/s.yaml", "not UTF-8"),
    Case("scenario file: control characters", run_text(b"\x00\x01" * 4), "{tmp}/s.yaml",
         "YAML"),
    Case("scenario file: nested 100,000 deep (flow)",
         run_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n"), "{tmp}/s.yaml", "nesting"),
    Case("scenario file: nested 5,000 deep (block)",
         run_text("a:\n" + "".join(" " * i + "- \n" for i in range(1, 5000))), "{tmp}/s.yaml",
         "nesting|YAML"),
    Case("scenario file: duplicate top-level key",
         run_text(BASE_TEXT + "workload: {source: default, num_requests: 3, rate: 1}\n"),
         "{tmp}/s.yaml", "'workload' appears twice"),
    Case("scenario file: duplicate nested key",
         run_text(BASE_TEXT.replace("seed: 1", "seed: 1\n  seed: 2")), "{tmp}/s.yaml",
         "'seed' appears twice"),
    Case("scenario file: duplicate key in a flow mapping",
         run_text(BASE_TEXT + "scheduler: {gpu_kv_blocks: 4, gpu_kv_blocks: 8}\n"),
         "{tmp}/s.yaml", "'gpu_kv_blocks' appears twice"),
    Case("scenario file: alias bomb", run_text(BASE_TEXT + _alias_bomb()), "{tmp}/s.yaml",
         "alias"),
    Case("scenario file: a list", run_text("- 1\n- 2\n"), "{tmp}/s.yaml", "mapping"),
    Case("scenario file: a scalar", run_text("just text\n"), "{tmp}/s.yaml", "mapping"),
    Case("scenario file: empty", run_text(""), "{tmp}/s.yaml", "mapping"),
    Case("scenario file: YAML syntax", run_text("name: [unclosed\n"), "{tmp}/s.yaml", "YAML"),
    Case("scenario file: tabs", run_text("name: x\n\tworkload: 1\n"), "{tmp}/s.yaml", "YAML"),
    Case("scenario file: missing",
         lambda tmp: ["run", str(tmp / "nope.yaml"), "--out", str(tmp / "out")],
         "{tmp}/nope.yaml", "no such"),
    Case("scenario file: a directory",
         lambda tmp: ["run", str(tmp), "--out", str(tmp / "out")], "{tmp}", "directory"),
    Case("scenario file: /dev/zero",
         lambda tmp: ["run", "/dev/zero", "--out", str(tmp / "out")], "/dev/zero",
         "not a regular file"),
    Case("scenario file: a FIFO", lambda tmp: ["run", str(_fifo(tmp)), "--out",
                                               str(tmp / "out")], "{tmp}/fifo", "regular"),
    Case("scenario file: 100 MB", lambda tmp: ["run", str(_sparse(tmp, 100 * 2**20)), "--out",
                                               str(tmp / "out")], "{tmp}/big.yaml", "bytes"),
]


def _fifo(tmp: Path) -> Path:
    import os

    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _sparse(tmp: Path, size: int) -> Path:
    path = tmp / "big.yaml"
    with path.open("wb") as f:
        f.truncate(size)
    return path


# --- profiles -----------------------------------------------------------------------------------

def _profile_data() -> dict:
    return yaml.load(RTX4090_LLAMA.read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                yaml.SafeLoader))


def _zeroed(node):
    """Every cost table's values set to 0."""
    if isinstance(node, dict):
        if "z" in node:
            return {**node, "z": [[0.0] * len(row) for row in node["z"]]}
        if "x" in node and isinstance(node.get("y"), list) and not isinstance(node["y"][0], list):
            return {**node, "y": [0.0] * len(node["y"])}
        return {k: _zeroed(v) for k, v in node.items()}
    return node


def run_profile_edit(edit: Callable[[dict], object], suffix: str = ".yaml",
                     raw: bytes | None = None) -> Callable[[Path], list[str]]:
    """`dualpace-sim run` of the base scenario over a copy of the profile changed by ``edit``
    (or holding ``raw`` bytes)."""

    def make(tmp: Path) -> list[str]:
        if raw is None:
            data = _profile_data()
            edit(data)
            text = (json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
            path = _write(tmp, f"p{suffix}", text)
        else:
            path = _write(tmp, f"p{suffix}", raw)
        return ["run", str(_scenario(tmp, profile=str(path))), "--out", str(tmp / "out")]

    return make


def _set(dotted: str, value) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node[part]
        node[last] = value
    return edit


def _zero_all(data: dict, controls: bool = False) -> None:
    for section in ("gpu", "cpu", "assist"):
        data[section] = _zeroed(data[section])
    if controls:
        data["controls"] = {"route_p": 0, "route_f": 0, "gpu_token_limit": 512,
                            "cpu_batch_limit": 8}


def _reverse(dotted: str) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        node = data
        for part in dotted.split("."):
            node = node[part]
        node["y"] = node["y"][::-1]
    return edit


def _bomb_in_spec() -> bytes:
    """The profile with an alias bomb as its free-form provenance.spec."""
    data = _profile_data()
    data["provenance"]["spec"] = "BOMB"
    bomb = "".join(f"    {line}\n" for line in _alias_bomb("s").splitlines())
    return yaml.safe_dump(data).replace("spec: BOMB\n", "spec:\n" + bomb).encode()


def fit_zero_profile(tmp: Path) -> list[str]:
    data = _profile_data()
    _zero_all(data)
    return ["profile", "fit", str(_write(tmp, "p.yaml", yaml.safe_dump(data)))]


PROFILE = "{tmp}/p.yaml"
CASES += [
    Case("profile: /dev/zero", run_with(profile="/dev/zero"), "/dev/zero", "regular file"),
    Case("profile: missing", run_with(profile="no/such/p.yaml"), "no/such/p.yaml",
         "does not exist"),
    Case("profile: a directory", lambda tmp: run_with(profile=str(tmp))(tmp), "profile",
         "directory"),
    Case("profile: UTF-16", run_profile_edit(None, raw="format: x\n".encode("utf-16")), PROFILE,
         "UTF-8"),
    Case("profile: alias bomb in provenance.spec", run_profile_edit(None, raw=_bomb_in_spec()),
         PROFILE, "alias"),
    Case("profile: all-zero costs without controls", run_profile_edit(_zero_all), PROFILE,
         "every value is 0"),
    Case("profile: all-zero costs with controls",
         run_profile_edit(lambda d: _zero_all(d, controls=True)), PROFILE, "every value is 0"),
    Case("profile: reversed gpu.post_attn", run_profile_edit(_reverse("gpu.post_attn")),
         PROFILE, "gpu.post_attn.y.*reversed"),
    Case("profile: reversed cpu.pre_layer", run_profile_edit(_reverse("cpu.pre_layer")),
         PROFILE, "cpu.pre_layer.y.*reversed"),
    Case("profile: milliseconds", run_profile_edit(lambda d: d["gpu"]["post_attn"].update(
        y=[v * 1000 for v in d["gpu"]["post_attn"]["y"]])), PROFILE, "milliseconds"),
    Case("profile: link in GB/s", run_profile_edit(_set("link.h2d_bytes_per_s", 25.0)), PROFILE,
         "link.h2d_bytes_per_s"),
    Case("profile: cpu.kv_capacity_blocks 0", run_profile_edit(
        _set("cpu.kv_capacity_blocks", 0)), PROFILE, "cpu.kv_capacity_blocks is 0.*"
        "scheduler.host_kv_blocks"),
    Case("profile: gpu.kv_capacity_blocks 0", run_profile_edit(
        _set("gpu.kv_capacity_blocks", 0)), PROFILE, "gpu.kv_capacity_blocks is 0"),
    Case("profile: block_size true", run_profile_edit(_set("block_size", True)), PROFILE,
         "block_size"),
    Case("profile: block_size 0", run_profile_edit(_set("block_size", 0)), PROFILE,
         "block_size"),
    Case("profile: a negative cost", run_profile_edit(lambda d: d["gpu"]["post_attn"]["y"]
                                                       .__setitem__(0, -1.0)), PROFILE,
         "gpu.post_attn.y"),
    Case("profile: x not increasing", run_profile_edit(lambda d: d["gpu"]["post_attn"]["x"]
                                                        .reverse()), PROFILE,
         "gpu.post_attn.x.*increasing"),
    Case("profile: y shorter than x", run_profile_edit(lambda d: d["gpu"]["post_attn"]["y"]
                                                        .pop()), PROFILE, "gpu.post_attn.y"),
    Case("profile: nan cost", run_profile_edit(lambda d: d["gpu"]["post_attn"]["y"]
                                                .__setitem__(1, float("nan"))), PROFILE,
         "gpu.post_attn.y"),
    Case("profile: unknown key", run_profile_edit(_set("gpu.post_atn", 1)), PROFILE,
         "gpu.post_atn"),
    Case("profile: unknown format", run_profile_edit(_set("format", "dualpace-profile/9")),
         PROFILE, "format"),
    Case("profile: missing section", run_profile_edit(lambda d: d.pop("link")), PROFILE,
         "link"),
    Case("profile: duplicate key", run_profile_edit(None, raw=(
        RTX4090_LLAMA.read_text() + "\nblock_size: 32\n").encode()), PROFILE,
         "'block_size' appears twice"),
    Case("profile: invalid JSON", run_profile_edit(None, suffix=".json", raw=b"{nope"),
         "{tmp}/p.json", "invalid JSON"),
    Case("profile: JSON nested deep", run_profile_edit(None, suffix=".json",
                                                       raw=b"[" * 100_000 + b"]" * 100_000),
         "{tmp}/p.json", "nested|mapping"),
    Case("profile: JSON list", run_profile_edit(None, suffix=".json", raw=b"[1, 2]"),
         "{tmp}/p.json", "mapping"),
    Case("profile: JSON Latin-1", run_profile_edit(None, suffix=".json",
                                                   raw='{"a": "caf\xe9"}'.encode("latin-1")),
         "{tmp}/p.json", "UTF-8"),
]


# --- traces -------------------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def run_trace(text: bytes | str | None, name: str = "t.csv", source: str = "azure",
              rows: int = 2, arrival: str = "trace",
              path: str | None = None) -> Callable[[Path], list[str]]:
    """`dualpace-sim run` replaying a trace file holding ``text`` (or the file at ``path``)."""

    def make(tmp: Path) -> list[str]:
        where = path if path is not None else str(_write(tmp, name, text))
        workload = {"source": source, "path": where, "num_requests": rows, "arrival": arrival}
        workload.update({"rate": 1.0} if arrival == "poisson" else {})
        doc = {**BASE, "workload": workload}
        return ["run", str(_write(tmp, "s.yaml", yaml.safe_dump(doc))), "--out",
                str(tmp / "out")]

    return make


CASES += [
    Case("trace: /dev/zero", run_trace(None, path="/dev/zero"), "/dev/zero", "regular file"),
    Case("trace: missing", run_trace(None, path="nope.csv"), "nope.csv", "not found"),
    Case("trace: a directory", lambda tmp: run_trace(None, path=str(tmp))(tmp), "{tmp}",
         "directory"),
    Case("trace: mixed time zones", run_trace(
        AZURE_HEADER + "2024-05-10 00:00:00.00993+00:00,10,5\n"
                       "2024-05-10 00:00:01.00993+02:00,10,5\n"), "{tmp}/t.csv",
         "line 3, column TIMESTAMP.*offset"),
    Case("trace: bad timestamp", run_trace(AZURE_HEADER + "yesterday,10,5\n2023-11-16 18:17:03"
                                           ",10,5\n"), "{tmp}/t.csv", "line 2, column TIMESTAMP"),
    Case("trace: unsorted", run_trace(AZURE_HEADER + "2023-11-16 18:17:04,10,5\n"
                                      "2023-11-16 18:17:03,10,5\n"), "{tmp}/t.csv",
         "line 3.*sort"),
    Case("trace: zero tokens", run_trace(AZURE_HEADER + "2023-11-16 18:17:03,0,5\n"
                                         "2023-11-16 18:17:04,10,5\n"), "{tmp}/t.csv",
         "line 2, column ContextTokens"),
    Case("trace: fractional tokens", run_trace(AZURE_HEADER + "2023-11-16 18:17:03,10,5.5\n"
                                               "2023-11-16 18:17:04,10,5\n"), "{tmp}/t.csv",
         "column GeneratedTokens"),
    Case("trace: missing column", run_trace("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,10\n"
                                            "2023-11-16 18:17:04,10\n"), "{tmp}/t.csv",
         "GeneratedTokens"),
    Case("trace: header only", run_trace(AZURE_HEADER), "{tmp}/t.csv", "no data rows"),
    Case("trace: empty", run_trace(""), "{tmp}/t.csv", "readable CSV"),
    Case("trace: fewer rows than asked", run_trace(AZURE_HEADER + "2023-11-16 18:17:03,10,5\n",
                                                   rows=5), "{tmp}/t.csv", "only 1 data rows"),
    Case("trace: UTF-16 CSV", run_trace((AZURE_HEADER + "2023-11-16 18:17:03,10,5\n")
                                        .encode("utf-16")), "{tmp}/t.csv", ""),
    Case("trace: vidur without arrivals", run_trace(
        "num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n", source="vidur"), "t.csv",
         "arrival"),
    Case("trace: mooncake bad JSON line", run_trace(
        '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{oops\n', name="t.jsonl",
        source="mooncake"), "{tmp}/t.jsonl", "line 2.*JSON"),
    Case("trace: mooncake not an object", run_trace("[1, 2]\n[3]\n", name="t.jsonl",
                                                    source="mooncake"), "{tmp}/t.jsonl",
         "line 1.*object"),
    Case("trace: mooncake missing key", run_trace(
        '{"timestamp": 0, "input_length": 5}\n{"timestamp": 1, "input_length": 5}\n',
        name="t.jsonl", source="mooncake"), "{tmp}/t.jsonl", "output_length"),
    Case("trace: mooncake Latin-1", run_trace(b'{"timestamp": 0, "x": "caf\xe9"}\n',
                                              name="t.jsonl", source="mooncake"),
         "{tmp}/t.jsonl", "readable"),
]


# --- sim command-line options -------------------------------------------------------------------

def _file(tmp: Path, name: str = "afile") -> Path:
    return _write(tmp, name, "x")


def sweep_args(tmp: Path, out: Path | None = None, **fields) -> list[str]:
    fields.setdefault("sweep", {"rates": [1.0, 2.0]})
    return ["sweep", str(_scenario(tmp, **fields)), "--out", str(out or tmp / "out"), "-j", "1"]


def _foreign_sweep_csv(tmp: Path) -> list[str]:
    (tmp / "mine").mkdir()
    _write(tmp / "mine", "sweep.csv", "my,own\n1,2\n")
    return sweep_args(tmp, out=tmp / "mine")


CASES += [
    Case("run --out ''", lambda tmp: ["run", str(_scenario(tmp)), "--out", ""], "--out",
         "empty"),
    Case("run --out a file", lambda tmp: ["run", str(_scenario(tmp)), "--out",
                                          str(_file(tmp))], "{tmp}/afile", "is a file"),
    Case("run --trace-events a directory", lambda tmp: ["run", str(_scenario(tmp)), "--out",
                                                        str(tmp / "out"), "--trace-events",
                                                        str(tmp)], "--trace-events",
         "directory"),
    Case("run --trace-events /dev/full", lambda tmp: ["run", str(_scenario(tmp)), "--out",
                                                      str(tmp / "out"), "--trace-events",
                                                      "/dev/full"], "--trace-events /dev/full",
         "regular file"),
    Case("run --trace-events under a file", lambda tmp: [
        "run", str(_scenario(tmp)), "--out", str(tmp / "out"), "--trace-events",
        str(_file(tmp) / "t.json")], "--trace-events", "cannot create its folder"),
    Case("sweep --out ''", lambda tmp: sweep_args(tmp)[:2] + ["--out", ""], "--out", "empty"),
    Case("sweep --out a file", lambda tmp: sweep_args(tmp, out=_file(tmp)), "{tmp}/afile",
         "is a file"),
    Case("sweep --out a foreign sweep.csv", _foreign_sweep_csv, "{tmp}/mine",
         "no sweep wrote there"),
    Case("sweep without a sweep section", lambda tmp: sweep_args(tmp, sweep=None), "sweep",
         "no sweep section"),
    Case("sweep --workers 0", lambda tmp: sweep_args(tmp)[:-2] + ["-j", "0"], "--workers",
         ""),
    Case("plot a file", lambda tmp: ["plot", str(_file(tmp))], "{tmp}/afile", "not a sweep"),
    Case("plot --compare without --out", lambda tmp: ["plot", "--compare", str(tmp)],
         "", "not a sweep"),
    Case("profile show /dev/zero", lambda tmp: ["profile", "show", "/dev/zero"], "/dev/zero",
         ""),
    Case("profile show missing", lambda tmp: ["profile", "show", str(tmp / "nope.yaml")],
         "{tmp}/nope.yaml", "no such"),
    Case("profile fit all-zero", fit_zero_profile, "{tmp}/p.yaml", "every value is 0"),
]


# --- validate inputs ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_run_dir(tmp_path_factory) -> tuple[Path, Path]:
    """A small run written as `dualpace-hw run` writes it (the simulator's own run)."""
    tmp = tmp_path_factory.mktemp("real")
    scenario = _scenario(tmp, policies=["dualpace"], workload={"num_requests": 6})
    run_scenario(scenario, tmp / "real", progress=False)
    return scenario, tmp / "real"


def _journal_lines(*entries: dict) -> bytes:
    return gzip.compress("".join(json.dumps(e) + "\n" for e in entries).encode())


SUBMIT = {"t": 0.0, "engine": "load", "call": "submit", "data": {"req": 0}}
JOURNAL_CASES = [
    ("journal not gzip", b"this is plain text\n", "not a gzip"),
    ("journal truncated", _journal_lines(SUBMIT, SUBMIT)[:-9], "cut short"),
    ("journal unknown call", _journal_lines({**SUBMIT, "call": "frobnicate"}),
     "line 1.*unknown call load/frobnicate"),
    ("journal entry lacks data", _journal_lines({"t": 0.0, "engine": "load",
                                                 "call": "submit"}), "line 1.*data"),
    ("journal data lacks req", _journal_lines({**SUBMIT, "data": {}}),
     "line 1: load/submit lacks"),
    ("journal line not JSON", gzip.compress(b"{nope\n"), "line 1: not JSON"),
    ("journal entry a list", _journal_lines([1, 2]), "line 1: not a journal entry"),
    ("journal t text", _journal_lines({**SUBMIT, "t": "soon"}), "line 1"),
]

VALIDATE_FILE_CASES = [
    ("summary.json not JSON", "summary.json", b"{not json", "summary.json"),
    ("summary.json empty list", "summary.json", b"[]", "summary.json"),
    ("requests.parquet not parquet", "requests.parquet", b"not parquet", "requests.parquet"),
]


@pytest.mark.parametrize("name, data, expect", JOURNAL_CASES, ids=[c[0] for c in JOURNAL_CASES])
def test_bad_journals_are_one_line_and_write_nothing(real_run_dir, tmp_path, name, data,
                                                     expect):
    scenario, real = real_run_dir
    journal = real / "journal-dualpace.jsonl.gz"
    journal.write_bytes(data)
    try:
        _check(runner.invoke(sim_app, ["validate", str(scenario), "--real", str(real), "--out",
                                       str(tmp_path / "out")]),
               str(journal), expect, tmp_path / "out")
    finally:
        journal.unlink()


@pytest.mark.parametrize("name, file, data, expect", VALIDATE_FILE_CASES,
                         ids=[c[0] for c in VALIDATE_FILE_CASES])
def test_bad_real_run_files_are_one_line(real_run_dir, tmp_path, name, file, data, expect):
    scenario, real = real_run_dir
    copy = tmp_path / "real"
    copy.mkdir()
    for f in real.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    (copy / file).write_bytes(data)
    _check(runner.invoke(sim_app, ["validate", str(scenario), "--real", str(copy), "--out",
                                   str(tmp_path / "out")]), str(copy / file), expect,
           tmp_path / "out")


def test_validate_quiet_fails_on_a_diverged_replay(real_run_dir, tmp_path):
    """--quiet prints nothing on success, but a DIVERGED replay still fails the check."""
    scenario, real = real_run_dir
    journal = real / "journal-dualpace.jsonl.gz"
    journal.write_bytes(_journal_lines(SUBMIT, {"t": 0.0, "engine": "gpu", "call": "schedule",
                                                "data": {"plan": {"bogus": 1},
                                                         "committed": False}}))
    try:
        result = runner.invoke(sim_app, ["validate", str(scenario), "--real", str(real),
                                         "--out", str(tmp_path / "out"), "--quiet"])
    finally:
        journal.unlink()
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert "DIVERGED" in result.stderr and len(result.stderr.splitlines()) == 1


# --- dualpace-hw arguments ----------------------------------------------------------------------

def hw_run(*extra: str, **fields) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        args = ["run", str(_scenario(tmp, **fields)), "--out", str(tmp / "out"), *extra]
        return [a.replace("{tmp}", str(tmp)) for a in args]
    return make


def hw_profile(*extra: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        args = ["profile", "--model", "tiny-llama", "--out", str(tmp / "p.yaml"),
                "--gpu-device", "cpu", *extra]
        return [a.replace("{tmp}", str(tmp)) for a in args]
    return make


HW_CASES = [
    Case("hw profile --cpu-cores 0", hw_profile("--cpu-cores", "0"), "--cpu-cores 0",
         "at least 1", "hw"),
    Case("hw profile --cpu-cores -4", hw_profile("--cpu-cores", "-4"), "--cpu-cores -4",
         "at least 1", "hw"),
    Case("hw profile --cpu-cores 100000", hw_profile("--cpu-cores", "100000"),
         "--cpu-cores 100000", "affinity", "hw"),
    Case("hw profile --gpu-device tpu", hw_profile("--gpu-device", "tpu"), "--device tpu",
         "cuda", "hw"),  # --gpu-device is --device's older name; the error uses the new one
    Case("hw profile --out a directory", hw_profile("--out", "{tmp}"), "--out", "directory",
         "hw"),
    Case("hw profile --out under a file", lambda tmp: hw_profile(
        "--out", str(_file(tmp) / "p.yaml"))(tmp), "--out", "is a file", "hw"),
    Case("hw profile --out /dev/full", hw_profile("--out", "/dev/full"), "--out /dev/full",
         "regular file", "hw"),
    Case("hw profile --host-kv-gib 0", hw_profile("--host-kv-gib", "0"), "--host-kv-gib",
         "> 0", "hw"),
    Case("hw profile --host-kv-gib beyond memory", hw_profile("--host-kv-gib", "1e9"),
         "--host-kv-gib", "available", "hw"),
    Case("hw profile --gpu-kv-gib -1", hw_profile("--gpu-kv-gib", "-1"), "--gpu-kv-gib",
         "> 0", "hw"),
    Case("hw profile unknown model", hw_profile("--model", "gpt-9"), "--model gpt-9", "",
         "hw"),
    Case("hw profile model config not JSON", lambda tmp: hw_profile(
        "--model", str(_write(tmp, "config.json", "{nope")))(tmp), "{tmp}/config.json",
         "invalid JSON", "hw"),
    Case("hw profile model config lacks a field", lambda tmp: hw_profile(
        "--model", str(_write(tmp, "config.json", '{"hidden_size": 64}')))(tmp),
         "{tmp}/config.json", "has no", "hw"),
    Case("hw run --cpu-cores 0", hw_run("--cpu-cores", "0", "--device", "cpu"),
         "--cpu-cores 0", "at least 1", "hw"),
    Case("hw run --cpu-cores -2", hw_run("--cpu-cores", "-2", "--device", "cpu"),
         "--cpu-cores -2", "at least 1", "hw"),
    Case("hw run --cpu-cores 100000", hw_run("--cpu-cores", "100000", "--device", "cpu"),
         "--cpu-cores 100000", "affinity", "hw"),
    Case("hw run --device tpu", hw_run("--device", "tpu"), "--device tpu", "cuda", "hw"),
    Case("hw run --out a file", lambda tmp: ["run", str(_scenario(tmp)), "--out",
                                             str(_file(tmp)), "--device", "cpu"],
         "{tmp}/afile", "is a file", "hw"),
    Case("hw run --out ''", lambda tmp: ["run", str(_scenario(tmp)), "--out", "",
                                         "--device", "cpu"], "--out", "empty", "hw"),
    Case("hw run --trace-events /dev/full", hw_run("--trace-events", "/dev/full", "--device",
                                                   "cpu"), "--trace-events /dev/full",
         "regular file", "hw"),
    Case("hw run --trace-events a directory", hw_run("--trace-events", "{tmp}", "--device",
                                                     "cpu"), "--trace-events", "directory",
         "hw"),
    Case("hw run host KV beyond memory", hw_run("--device", "cpu",
                                                scheduler={"host_kv_blocks": 10**9}),
         "{tmp}/s.yaml", "1,000,000,000 blocks.*scheduler.host_kv_blocks", "hw"),
    Case("hw run bad scenario", hw_run("--device", "cpu", workload={"num_requests": True}),
         "{tmp}/s.yaml", "workload.num_requests", "hw"),
]
CASES += HW_CASES


def _check(result, names: str, expect: str, out: Path) -> str:
    """Exit 2, one ``error:`` line on stderr naming ``names`` and matching ``expect``, nothing
    on stdout, no traceback, and no results folder."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    assert names in line, (names, line)
    assert re.search(expect, line), (expect, line)
    assert "Traceback" not in result.output and result.stdout == ""
    assert not out.exists(), f"partial output left in {out}"
    return line


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: Case, tmp_path):
    if case.cli == "hw":
        pytest.importorskip("torch")
        from dualpace_hw.cli import app
    else:
        app = sim_app
    args = case.make(tmp_path)
    _check(runner.invoke(app, args), case.names.format(tmp=tmp_path), case.expect,
           tmp_path / "out")


def test_the_suite_is_large_enough():
    """At least 150 bad inputs in all, over every kind of input."""
    total = len(CASES) + len(JOURNAL_CASES) + len(VALIDATE_FILE_CASES)
    assert total >= 150, total


# --- usage errors, as the installed commands print them -----------------------------------------

USAGE_CASES = [
    ("sim", ["run"], "dualpace-sim run: Missing argument 'scenario'"),
    ("sim", ["run", "x.yaml", "--bogus"], "dualpace-sim run: No such option: --bogus"),
    ("sim", ["profile", "show"], "dualpace-sim profile show: Missing argument 'profile'"),
    ("sim", ["bogus"], "dualpace-sim: No such command 'bogus'"),
    ("hw", ["profile", "--bogus"], "dualpace-hw profile: No such option: --bogus"),
]


@pytest.mark.parametrize("cli, args, expect", USAGE_CASES,
                         ids=[" ".join(c[1]) + f" ({c[0]})" for c in USAGE_CASES])
def test_usage_errors_are_one_line_exit_2(cli, args, expect):
    """A missing argument or an unknown option or command is one `error:` line naming the
    command and its --help, not the parser's usage block and boxed message."""
    import subprocess
    import sys

    if cli == "hw":
        pytest.importorskip("torch")
    module = "dualpace_sim.cli.main" if cli == "sim" else "dualpace_hw.cli"
    done = subprocess.run([sys.executable, "-c", f"from {module} import main; main()", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
    assert "--help" in lines[0] and done.stdout == ""
