"""`python -m dualpace_sim.validation.analysis.repeatability`: the spread of real runs of one
scenario per headline metric, on hand-made summaries (its arithmetic) and on the committed runs
(a run shared by joined folders counts once)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.validation.analysis.running import run

METRICS = {"throughput_tok_s": 600.0, "normalized_latency_s": 0.10, "p99_ttft_s": 0.09,
           "p99_itl_s": 0.40, "p99_tpot_s": 0.30, "cpu_token_fraction": 0.38}


def write_run(folder, policy="dualpace", digest="abc", completed=500, **values):
    folder.mkdir(parents=True)
    summary = {"policy": policy, "submitted": 500, "completed": completed,
               "requests_sha256": digest, **METRICS, **values}
    (folder / "summary.json").write_text(json.dumps([summary]))
    return folder


def test_the_spread_is_max_less_min_over_the_median_and_named_when_wider(tmp_path):
    runs = [write_run(tmp_path / "a", normalized_latency_s=0.09),
            write_run(tmp_path / "b", normalized_latency_s=0.10),
            write_run(tmp_path / "c", normalized_latency_s=0.12),
            write_run(tmp_path / "cut", normalized_latency_s=9.0, completed=400)]  # left out
    out = run("repeatability", *map(str, runs))
    assert ("dualpace normalized_latency_s      3    30.0 %    10 %  0.09 0.1 0.12  wider than "
            "the target") in out, out
    assert "dualpace throughput_tok_s          3     0.0 %    10 %  600 600 600\n" in out, out


def test_one_run_in_two_folders_counts_once_and_other_workloads_are_refused(tmp_path):
    same = [write_run(tmp_path / "a"), write_run(tmp_path / "b")]
    assert "fewer than two distinct complete runs" in run("repeatability", *map(str, same))
    other = write_run(tmp_path / "other", digest="def")
    done = subprocess.run([sys.executable, "-m",
                           "dualpace_sim.validation.analysis.repeatability", str(same[0]),
                           str(other)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "runs of different workloads" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_committed_r3_runs_of_the_young_collector_and_before(tmp_path):
    """The young-collector run is partial (54 s of serving): left out, one run remains."""
    out = run("repeatability", "docs/validation/cpu-busy/session24/sustained-r3/real",
              "docs/validation/cpu-busy/session24/sustained-r3-young-gc/real")
    assert "dualpace fewer than two distinct complete runs" in out
