"""`python -m dualpace_sim.validation.analysis.rankings` on committed runs prints the
figures docs/validation/ cites."""

from __future__ import annotations

from tests.validation.analysis.running import run


def test_rankings_name_the_misses_and_the_winners(tmp_path):
    table = tmp_path / "case" / "validation.csv"
    table.parent.mkdir()
    table.write_text("policy,metric,simulated,real,relative_error\n"
                     "dualpace,normalized_latency_s,0.050,0.049,0\n"
                     "vllm,normalized_latency_s,0.030,0.061,0\n"  # -51 %: a miss, and vLLM
                     "dualpace,throughput_tok_s,440,448,0\n"  # wins in the simulator only
                     "vllm,throughput_tok_s,470,477,0\n")  # 6 % apart on the box: no winner
    out = run("rankings", str(table))
    assert "case vllm     normalized_latency_s    -50.8 %  target 10 %: MISS" in out
    assert "case dualpace throughput_tok_s         -1.8 %  target 10 %: inside" in out
    assert ("case winner on normalized_latency_s  real DualPace simulated vLLM     DIFFERENT"
            in out)
    assert "winner on throughput" not in out
    assert out.strip().endswith("1 metric(s) outside their targets, 1 winner(s) different")
    committed = run("rankings",
                    "docs/validation/cpu-busy/session24/sustained-r3/validation.csv",
                    "docs/validation/cpu-busy/session23/sustained-r4/validation.csv",
                    "docs/validation/cpu-busy/session22/sustained-r5/validation.csv")
    assert ("sustained-r4 winner on normalized_latency_s  real DualPace simulated DualPace same"
            in committed)
    assert "sustained-r5 dualpace throughput_tok_s         -0.6 %  target 10 %: inside" in committed
    assert committed.strip().endswith("0 winner(s) different")
