"""The analysis scripts behind figures in docs/validation/README.md still run and print them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "docs" / "validation" / "analysis"


def run(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, str(ANALYSIS / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_prefill_grid_error_is_the_documented_one():
    out = run("prefill_grid.py", "docs/validation/h200x2/r4/real/profile.yaml")
    assert "chunk  2048, context   2048: old grid +43%" in out
    assert "chunk  1024, context   1024: old grid +48%" in out
    assert out.strip().endswith("largest error +48% over 22 points")


def test_small_prefill_floors_are_the_documented_ones(azure_dir):
    out = run("small_prefill_floors.py", "4", env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "4 req/s dualpace CPU step in flight: False n= 45 median 1.45 ms" in out
    assert "4 req/s vllm     CPU step in flight: False n= 44 median 1.55 ms" in out
    two = run("small_prefill_floors.py", "--scenario",
              "scenarios/h200x2/validation/qwen3-14b-r8.yaml", "--real",
              "docs/validation/h200x2/r8/real", "--costs",
              "calibration/h200x2-xeon32/qwen3-14b.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "r8 vllm     CPU step in flight: False n= 20 median 2.32 ms" in two



def test_gpu_round_classes_are_the_documented_ones(azure_dir):
    env = {"DUALPACE_AZURE_DIR": str(azure_dir)}
    out = run("gpu_round_classes.py", "8", env=env)
    assert re.search(r"8  vllm +prefill, >= 1,024 +54 +5\.33 +5\.52 +0\.98", out)
    two = run("gpu_round_classes.py", "--scenario",
              "scenarios/h200x2/validation/qwen3-14b-r4.yaml", "--real",
              "docs/validation/h200x2/r4/real", env=env)
    assert re.search(r"-  vllm +decode only +2086 +16\.53 +14\.44 +1\.14", two)
    assert re.search(r"-  dualpace +decode only +1988 +16\.44 +13\.77 +1\.19", two)
    # priced with the re-profile that has gpu.rank_round at the model's depth
    costed = run("gpu_round_classes.py", "--scenario",
                 "scenarios/h200x2/validation/qwen3-14b-r4.yaml", "--real",
                 "docs/validation/h200x2/r4/real", "--costs",
                 "calibration/h200x2-xeon32/qwen3-14b.yaml", env=env)
    assert re.search(r"-  vllm +decode only +2086 +16\.53 +16\.17 +1\.02", costed)
    # the CPU-busy run: DualPace's slow prefill rounds are the Prefill-to-CPU ones
    busy = run("gpu_round_classes.py", "--scenario",
               "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml", "--real",
               "docs/validation/cpu-busy/session9/r3/real", env=env)
    assert re.search(r"-  dualpace >= 1,024, to CPU +50 +5\.45 +2\.09 +2\.50", busy)
    assert re.search(r"-  dualpace >= 1,024, GPU only +26 +1\.23 +1\.07 +1\.13", busy)


def test_cpu_step_figures_are_the_documented_ones(azure_dir):
    out = run("cpu_steps.py", "8", "12", env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"8  Fused-Assist +1-3 +4 +1\.24", out)
    assert re.search(r"12  Fused-Assist +4-15 +17 +1\.58", out)


def test_assist_costs_are_the_documented_ones(azure_dir, tmp_path):
    out = run("assist_costs.py", "--scenario", "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml",
              "--real", "docs/validation/cpu-busy/session9/r3/real", "--write-profile",
              str(tmp_path / "served.yaml"), env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "17536 assists over 548 CPU steps (median batch 21)" in out
    assert ("served, per assist: stage-boundary wait 0.234 ms, service 0.738 ms, CUDA 0.532 ms,"
            " host part 0.205 ms") in out
    assert "(served CUDA / g = 1.60)" in out
    assert "q = o + wait = 0.440 ms, o = 0.205 ms, g x 1.60" in out
    assert (tmp_path / "served.yaml").exists()


def test_engine_interference_is_the_documented_one(azure_dir):
    out = run("engine_interference.py", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml", "--real",
              "docs/validation/cpu-busy/session9/r3/real",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"r3 GPU rounds CPU engine idle  : n= +2942 .* median real/model 0\.975",
                     out)
    assert re.search(r"r3 GPU rounds beside a CPU step: n= +10904 .* median real/model 1\.149",
                     out)
    assert ("r3 excess beside a CPU step 10.89 s; the run's 17536 assists were served in "
            "12.94 s: within what the assists cost") in out


def test_rankings_name_the_misses_and_the_winners(tmp_path):
    table = tmp_path / "case" / "validation.csv"
    table.parent.mkdir()
    table.write_text("policy,metric,simulated,real,relative_error\n"
                     "dualpace,normalized_latency_s,0.050,0.049,0\n"
                     "vllm,normalized_latency_s,0.030,0.061,0\n"  # -51 %: a miss, and vLLM
                     "dualpace,throughput_tok_s,440,448,0\n"  # wins in the simulator only
                     "vllm,throughput_tok_s,470,477,0\n")  # 6 % apart on the box: no winner
    out = run("rankings.py", str(table))
    assert "case vllm     normalized_latency_s    -50.8 %  target 10 %: MISS" in out
    assert "case dualpace throughput_tok_s         -1.8 %  target 10 %: inside" in out
    assert ("case winner on normalized_latency_s  real DualPace simulated vLLM     DIFFERENT"
            in out)
    assert "winner on throughput" not in out
    assert out.strip().endswith("1 metric(s) outside their targets, 1 winner(s) different")
    committed = run("rankings.py", *(f"docs/validation/cpu-busy/r{r}/validation.csv"
                                     for r in (2, 3, 4)))
    assert "r4 winner on normalized_latency_s  real DualPace simulated DualPace same" in committed
    assert committed.strip().endswith("0 winner(s) different")


def test_neo_rounds_are_the_documented_ones_and_price_the_floors(azure_dir, tmp_path):
    """The real NEO run at 3 req/s by class: its GPU-only decode iterations are the 2.5x; priced
    with a profile that has NEO's decode floor, each class's layer is held to its floors."""
    from dualpace_sim.costs import load_profile

    env = {"DUALPACE_AZURE_DIR": str(azure_dir)}
    args = ("--scenario", "scenarios/h200/cpu-busy/llama-3.1-8b-r3.yaml",
            "--real", "docs/validation/cpu-busy/r3/real")
    out = run("neo_rounds.py", *args, env=env)
    assert re.search(r"GPU-only, decode +13900 +246\.91 +84\.21 +84\.21 +2\.50 +0\.431 +0\.147",
                     out)
    assert re.search(r"GPU-only, prefill +79 +2\.56 +1\.29 +2\.34 +1\.04 +0\.892 +0\.857", out)
    assert re.search(r"pipelined, prefill +105 +10\.99 +3\.90 +3\.98 +2\.89 +3\.171 +1\.019", out)
    assert re.search(r"all +14241 +264\.31", out)
    profile = load_profile("docs/validation/cpu-busy/r3/real/profile.yaml")
    profile.neo.eager_decode_layer_s = 2e-3  # above every class's kernels
    profile.save(tmp_path / "floor.yaml")
    priced = run("neo_rounds.py", *args, "--costs", str(tmp_path / "floor.yaml"), env=env)
    layer = {line[:25].strip(): float(line.split()[-1]) for line in priced.splitlines()[1:]}
    eager = profile.gpu.eager_layer_s * 1e3
    assert layer["GPU-only, decode"] == 2.0
    assert layer["GPU-only, prefill"] == round(eager, 3)
    assert layer["pipelined, prefill"] == round(eager + 2.0, 3)  # both sub-batches issued


def test_sim_vs_real_rounds_are_the_documented_ones(azure_dir):
    """The session-12 tables, simulated and priced with the run's own profile: w2-r3's prefill
    rounds (simulated 30.9 ms, real 66.1 ms, model 27.5 ms for 256-1,023-token rounds with a
    Prefill-to-CPU chunk) and their excess."""
    out = run("sim_vs_real_rounds.py", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-w2-r3.yaml", "--real",
              "docs/validation/cpu-busy/w2-r3/real", "--costs",
              "docs/validation/cpu-busy/w2-r3/real/profile.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert re.search(r"256-1,023, to CPU\s+43\s+30\.9\s+38\s+66\.1\s+27\.5", out), out
    assert re.search(r"CPU busy, to CPU\s+129\s+1\.00", out), out
    assert re.search(r"16-63\s+365\s+0\.188\s+360\s+0\.189", out), out


def test_prefill_excess_is_the_documented_one(azure_dir):
    """sustained-r5's eager prefill rounds: a step of about 20 ms once assists flow, not a cost
    a assist; its decode rounds' excess grows with the assists inside them."""
    out = run("prefill_excess.py", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml", "--real",
              "docs/validation/cpu-busy/sustained-r5/real", "--costs",
              "docs/validation/cpu-busy/sustained-r5/real/profile.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "prefill rounds (eager): 448; excess = 9.21 ms + 0.661 ms a assist" in out, out
    assert re.search(r"0-0\.5\s+50\s+0\.00\s+1\.48", out), out
    assert re.search(r"2-5\s+210\s+3\.48\s+21\.00", out), out
    assert re.search(r"0\.5-2\s+10196\s+0\.89\s+0\.68", out), out


def test_cpu_step_parts_are_the_documented_ones(azure_dir):
    """Session 16's sustained-r5: the assists' CUDA intervals as served run 1.25-1.85x the
    profile's idle-GPU g_x, and the CPU engine's own work 1.03-1.18x its model."""
    out = run("cpu_step_parts.py", "--scenario",
              "scenarios/h200/cpu-busy/llama-3.1-8b-sustained-r5.yaml", "--real",
              "docs/validation/cpu-busy/session16/sustained-r5/real", "--costs",
              "calibration/h200-spr16/llama-3.1-8b.yaml",
              env={"DUALPACE_AZURE_DIR": str(azure_dir)})
    assert "670 Fused-Assist steps" in out, out
    assert re.search(r"64-127\s+133\s+356\.9\s+40\.1\s+32\.6\s+17\.6\s+1\.85\s+316\.8\s+271\.2"
                     r"\s+1\.17", out), out
    assert re.search(r">= 180\s+95\s+601\.9\s+36\.3\s+30\.6\s+23\.3\s+1\.31\s+565\.7\s+478\.7"
                     r"\s+1\.18", out), out
