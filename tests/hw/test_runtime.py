"""The real runtime end to end on the CPU with a tiny model: both engines, migrations and
Dense Assist, against greedy tokens from a dense forward of each request."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dualpace_hw.cli import app
from dualpace_hw.model import Model, ModelWeights, greedy
from dualpace_hw.runtime import AssistChannel
from dualpace_hw.serve import build_runtime
from dualpace_sim.core import Owner
from dualpace_sim.records import read_records
from dualpace_sim.scenario import load_scenario

from .reference import dense_logits


def scenario(tmp_path, policies, **scheduler) -> object:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "real-tiny",
        "roofline": {"hardware": "rtx4090-xeon4510-12c", "model": "tiny-llama"},
        "policies": policies,
        "vllm": {"max_num_batched_tokens": 64, "max_num_seqs": 8},
        # tiny pools: HBM for a few requests, so prompts go Prefill-to-CPU and decodes migrate
        "scheduler": {"gpu_kv_blocks": 10, "host_kv_blocks": 400, "gpu_token_limit": 64,
                      "cpu_batch_limit": 4, **scheduler},
        "workload": {"source": "default", "num_requests": 10, "rate": 5000.0, "seed": 2,
                     "max_prompt_tokens": 40, "max_output_tokens": 6},
    }))
    return path


def reference_tokens(model: Model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(greedy(dense_logits(model, ids)[-1:])[0]))
    return ids[len(prompt):]


@pytest.mark.parametrize("route", [(0, 0), (8, 4), (2, 1)],
                         ids=["fused-assist", "full-cpu", "split-final"])
def test_dualpace_runtime_serves_every_request_with_the_reference_tokens(tmp_path, route):
    loaded = load_scenario(scenario(tmp_path, ["dualpace"], route_p=route[0], route_f=route[1]))
    runtime = build_runtime(loaded, "dualpace", "cpu", None)
    requests = runtime.serve()
    model = Model(loaded.profile.model, ModelWeights.random(loaded.profile.model, seed=0))
    owners = b""
    for r in requests:
        ids = runtime.tokens.ids(r.req_id)
        assert r.generated == r.max_tokens == len(ids) - r.prompt_tokens
        assert ids[r.prompt_tokens:] == reference_tokens(model, ids[:r.prompt_tokens],
                                                         r.max_tokens), r.req_id
        owners += bytes(r.token_owners)
    assert Owner.CPU in owners, "the CPU engine decoded some tokens"
    if route != (8, 4):
        assert runtime.stats.assist_calls > 0
    runtime.state.check_invariants()
    assert runtime.state.hbm.used == runtime.state.host.used == 0


def test_run_command_writes_what_the_simulator_writes(tmp_path):
    out = tmp_path / "real"
    result = CliRunner().invoke(app, ["run", str(scenario(tmp_path, ["dualpace", "vllm", "neo"])),
                                      "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "neo: simulated only" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["dualpace", "vllm"]
    assert all(s["completed"] == s["submitted"] == 10 and s["real"] for s in summary)
    records = read_records(out / "requests.parquet")
    assert set(records["policy"]) == {"dualpace", "vllm"}
    assert (records["n_tokens"] == records["max_tokens"]).all()
    assert (out / "timeline.png").exists()


def test_assist_channel_hands_off_and_survives_a_stop():
    served = []

    class FakeGpu:
        def assist_post_layer(self, hidden):
            served.append(hidden)
            return hidden + 1

    stop = {"now": False}
    channel = AssistChannel(lambda: None, lambda: stop["now"])
    import threading

    results = []
    t = threading.Thread(target=lambda: results.append(channel.assist_post_layer(torch.ones(1))))
    t.start()
    while not channel.serve(FakeGpu()):
        pass
    t.join(2)
    assert results and float(results[0]) == 2.0 and channel.state == "idle"
    stop["now"] = True
    with pytest.raises(RuntimeError, match="stopped"):
        channel.assist_post_layer(torch.ones(1))
