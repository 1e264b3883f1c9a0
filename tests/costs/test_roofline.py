from pathlib import Path

import pytest
import yaml

from dualpace_sim.costs import (
    CostModel,
    ModelShape,
    ProfileError,
    load_profile,
    load_spec,
    synthesize,
)
from dualpace_sim.costs.roofline import GIB, main, with_cpu_cores

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "calibration" / "roofline").glob("*/*.yaml"))
PAPER_BOX = ROOT / "calibration/roofline/rtx4090-xeon4510-12c/llama-3.1-8b.yaml"
SPECS = ["rtx4090-xeon4510-12c", "2xh20-xeon8469c-24c", "4xh20-xeon8469c-48c", "h200-spr16"]


@pytest.fixture(scope="module")
def rtx() -> CostModel:
    return CostModel(load_profile(PAPER_BOX))


def _cpu_full_iteration(cm: CostModel, b: int, context_per_request: int) -> float:
    layer = cm.cpu_layer_local(b, b * context_per_request) + cm.cpu_post_attn(b)
    return (
        cm.cpu_pre_layer(b) + cm.n_layers * layer + cm.cpu_post_layer(b) + cm.cpu_iteration_overhead
    )


def test_committed_profiles_exist():
    names = {f"{p.parent.name}/{p.stem}" for p in COMMITTED}
    assert names == {
        "rtx4090-xeon4510-12c/llama-3.1-8b",
        "rtx4090-xeon4510-2x12c/llama-3.1-8b",
        "2xh20-xeon8469c-24c/qwen3-14b",
        "4xh20-xeon8469c-48c/qwen3-32b",
        "h200-spr16/llama-3.1-8b",
        "h200-spr16/qwen3-32b",
        "h200x2-xeon32/qwen3-14b",
        "h200x4-xeon64/qwen3-32b",
    }
    assert all(p.stat().st_size < 150_000 for p in COMMITTED)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_profiles_match_the_synthesizer(path):
    """Regenerate with `python -m dualpace_sim.costs.roofline SPEC MODEL --out PATH`."""
    committed = load_profile(path)
    prov = committed.provenance
    assert prov.method == "roofline"
    fresh = synthesize(
        load_spec(prov.spec_name), ModelShape.from_name(committed.model.name), **prov.parameters
    )
    volatile = {"provenance": {"date", "command"}}
    assert fresh.model_dump(exclude=volatile) == committed.model_dump(exclude=volatile)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_roofline_is_monotone(path):
    profile = load_profile(path)
    tables_1d = {
        f"{section}.{name}": table
        for section in ("gpu", "cpu", "assist")
        for name, table in getattr(profile, section)
        if hasattr(table, "y") and not hasattr(table, "z")
    }
    assert len(tables_1d) == 14
    for name, table in tables_1d.items():
        assert all(b >= a for a, b in zip(table.y, table.y[1:], strict=False)), name
    for table in (profile.gpu.decode_attn, profile.cpu.decode_attn, profile.gpu.prefill_attn):
        for row in table.z:  # grows with context
            assert all(b >= a for a, b in zip(row, row[1:], strict=False))
        for i in range(len(table.y)):  # grows with batch / chunk
            column = [row[i] for row in table.z]
            assert all(b >= a for a, b in zip(column, column[1:], strict=False))


def test_rtx4090_sanity_numbers(rtx):
    """The paper box: a small HBM KV pool, a ~25 GB/s link, CPU decode in the 100s of ms."""
    decode = rtx.gpu_forward(64, [], 64, 64 * 1300)
    # Weights (15 GiB) + KV (10.9 GB) + LM head at 1008 GB/s is already 26 ms.
    assert 0.026 < decode < 0.040
    assert 0.08 < rtx.gpu_forward(1024, [(1024, 1024)], 0, 0) < 0.2
    assert 0.1 < _cpu_full_iteration(rtx, 64, 1300) < 0.3
    assert _cpu_full_iteration(rtx, 256, 1300) > 3 * _cpu_full_iteration(rtx, 64, 1300)
    kv_gib = rtx.gpu_kv_blocks * rtx.kv_block_bytes / GIB
    assert 2 < kv_gib < 6
    assert rtx.kv_block_bytes == 16 * 131072
    assert rtx.profile.link.h2d_bytes_per_s == pytest.approx(25e9, rel=0.05)
    assert rtx.assist_gpu("p", 64) < rtx.cpu_post_attn(64)


def test_capacity_formulas():
    spec, shape = load_spec("rtx4090-xeon4510-12c"), ModelShape.from_name("llama-3.1-8b")
    profile = synthesize(spec, shape, host_kv_gib=64.0)
    assert profile.cpu.kv_capacity_blocks == 64 * GIB // (16 * 131072)
    default = synthesize(spec, shape)
    host_gib = spec.cpu.host_memory_gib - shape.weight_bytes / GIB - 16
    assert default.cpu.kv_capacity_blocks == int(host_gib * GIB // (16 * 131072))
    assert synthesize(spec, shape, gpu_mem_util=0.95).gpu.kv_capacity_blocks > (
        default.gpu.kv_capacity_blocks
    )
    with pytest.raises(ValueError, match="no room for KV cache on the GPU"):
        synthesize(spec, ModelShape.from_name("qwen3-32b"))


def test_tensor_parallel_shards_work_and_adds_all_reduce():
    spec = load_spec("2xh20-xeon8469c-24c")
    single = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"count": 1})})
    shape = ModelShape.from_name("qwen3-14b")
    tp2, tp1 = synthesize(spec, shape), synthesize(single, shape)
    assert tp2.box.tensor_parallel == 2
    assert tp2.gpu.kv_capacity_blocks > 2 * tp1.gpu.kv_capacity_blocks
    big = -1  # 16384 tokens: compute-bound, halves; all-reduce keeps it above half
    assert 0.5 * tp1.gpu.post_attn.y[big] < tp2.gpu.post_attn.y[big] < tp1.gpu.post_attn.y[big]
    assert tp2.link.h2d_bytes_per_s == pytest.approx(2 * tp1.link.h2d_bytes_per_s)


@pytest.mark.parametrize("name", SPECS)
def test_packaged_specs_load(name):
    spec = load_spec(name)
    assert spec.name == name and spec.reference


def test_spec_errors_name_file_and_field(tmp_path):
    data = load_spec("2xh20-xeon8469c-24c").model_dump(mode="json")
    data["gpu"]["interconnect_bytes_per_s"] = None
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"spec.yaml: gpu: interconnect_bytes_per_s is required"):
        load_spec(path)
    data = load_spec("h200-spr16").model_dump(mode="json")
    data["efficiency"]["gpu_mem"] = 1.5
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"spec.yaml: efficiency.gpu_mem: Input should be"):
        load_spec(path)
    with pytest.raises(ProfileError, match="no such spec file or packaged spec"):
        load_spec("no-such-box")


def test_cli_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["h200-spr16", "tiny-qwen3", "--out", str(out), "--host-kv-gib", "1"]) == 0
    profile = load_profile(out)
    assert profile.model.name == "tiny-qwen3"
    assert profile.provenance.command.endswith(f"--out {out} --host-kv-gib 1")
    assert main(["h200-spr16", "no-such-model", "--out", str(out)]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_cpu_tensor_parallel_shards_cpu_work_and_adds_allreduce():
    """Two CPU ranks halve the per-rank weight and KV traffic of CPU stages; the Gloo
    all-reduces keep it from being a clean 2x."""
    one = CostModel(synthesize(load_spec("rtx4090-xeon4510-12c"), ModelShape.from_name(
        "llama-3.1-8b")))
    two = CostModel(synthesize(load_spec("rtx4090-xeon4510-2x12c"), ModelShape.from_name(
        "llama-3.1-8b")))
    for b in (16, 64, 256):
        assert 0.5 * one.cpu_post_attn(b) < two.cpu_post_attn(b) < one.cpu_post_attn(b)
        assert two.cpu_layer_local(b, b * 1000) < 0.6 * one.cpu_layer_local(b, b * 1000)


def test_more_cpu_cores_scale_compute_and_bandwidth_up_to_the_socket_ceiling():
    """Below the ceiling bandwidth grows with the cores (bandwidth-bound CPU attention speeds up
    with them); above it only compute grows (compute-bound dense stages still speed up)."""
    spec, shape = load_spec("rtx4090-xeon4510-12c"), ModelShape.from_name("llama-3.1-8b")
    ceiling = 2.2e11  # above the 1.5e11 B/s the spec's 12 cores draw
    specs = {n: with_cpu_cores(spec, n, ceiling) for n in (6, 12, 48)}
    assert specs[12].cpu.model_dump(exclude={"name"}) == spec.cpu.model_dump(exclude={"name"})
    assert specs[6].cpu.dram_bytes_per_s == pytest.approx(spec.cpu.dram_bytes_per_s / 2)
    assert specs[48].cpu.dram_bytes_per_s == ceiling
    assert specs[48].cpu.amx_bf16_flops == pytest.approx(4 * spec.cpu.amx_bf16_flops)
    assert specs[48].gpu == spec.gpu and specs[48].link == spec.link
    cm = {n: CostModel(synthesize(s, shape)) for n, s in specs.items()}
    context = 64 * 2000  # 64 requests of 2,000 tokens: KV reads dominate
    attn = {n: m.cpu_decode_attn(64, context) for n, m in cm.items()}
    assert attn[6] == pytest.approx(2 * attn[12], rel=0.02)
    assert attn[48] == pytest.approx(attn[12] * spec.cpu.dram_bytes_per_s / ceiling, rel=0.02)
    dense = {n: m.cpu_post_attn(1024) for n, m in cm.items()}  # AMX-bound at 1,024 rows
    assert dense[48] == pytest.approx(dense[12] / 4, rel=0.05)
    with pytest.raises(ValueError, match="cores must be >= 1"):
        with_cpu_cores(spec, 0, ceiling)
    with pytest.raises(ValueError, match="below the 1.5e\\+11 B/s that rtx4090-xeon4510-12c"):
        with_cpu_cores(spec, 24, 1e11)
