"""`dualpace-hw serve` on 127.0.0.1 with a tiny checkpoint, driven by the official `openai`
client: plain and streamed completions and chat with transformers' tokens, seeded sampling,
concurrent requests, the bad-request table (each a 400 naming its field, the server still up
after it), /metrics, and SIGTERM mid-stream (the stream ends, the process and the CPU engine's
process exit, and the served run validates against the simulator). Every request is bounded
in tokens and every wait in time."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from dualpace_hw.executors.checkpoint import load_checkpoint
from dualpace_hw.executors.sampling import SamplingParams
from tests.hw.checkpoints import make_checkpoint, reference_model, reference_tokens, tiny_scenario
from tests.hw.summaries import check_real_summary

openai = pytest.importorskip("openai", reason="the server tests need the serve extra")
httpx = pytest.importorskip("httpx")

MODEL = "tiny"
STARTUP_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `dualpace-hw serve` process on a free loopback port."""

    def __init__(self, tmp_path, ck_path, policy: str = "dualpace") -> None:
        scenario = tiny_scenario(tmp_path / "s.yaml", ck_path, ["dualpace", "vllm"])
        self.out = tmp_path / "served"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "serve",
             str(scenario), "--checkpoint", str(ck_path), "--out", str(self.out),
             "--policy", policy, "--port", str(self.port), "--model-name", MODEL,
             "--device", "cpu", "--dtype", "float32"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.scenario = scenario
        # Notices (a logged fallback, say) may come first; the banner is printed once the
        # runtime takes requests, and an exited server ends the output.
        self.banner = ""
        while not self.banner.startswith("serving "):
            line = self.proc.stdout.readline()
            if not line:
                break
            self.banner = line if line.startswith("serving ") else self.banner + line
        match = re.search(r"CPU engine process (\d+)", self.banner)
        self.cpu_pid = int(match.group(1)) if match else None
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.banner}{self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            self.proc.kill()
            raise RuntimeError("the server did not come up")
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=60,
                                    max_retries=0)

    def stop(self, timeout_s: float = 60) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return rc, self.proc.stdout.read()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
    return path, load_checkpoint(path), reference_model(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint):
    s = Server(tmp_path_factory.mktemp("srv"), checkpoint[0])
    yield s
    rc, output = s.stop()
    assert rc == 0, output


def expected(checkpoint, prompt_ids: list[int], n: int, params=None) -> str:
    _, ck, ref = checkpoint
    return ck.tokenizer.decode(reference_tokens(ref, prompt_ids, n, params))


GREEDY = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


def test_models_health_and_a_plain_and_a_streamed_completion(server, checkpoint):
    assert [m.id for m in server.client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    _, ck, _ = checkpoint
    prompt = "the quick brown fox"
    want = expected(checkpoint, ck.tokenizer.encode(prompt), 8)
    c = server.client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    assert c.choices[0].text == want and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 8
    assert c.usage.prompt_tokens == len(ck.tokenizer.encode(prompt))
    chunks = list(server.client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                                   **GREEDY))
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_plain_and_streamed(server, checkpoint):
    _, ck, _ = checkpoint
    messages = [{"role": "user", "content": "what is the capital of france?"}]
    want = expected(checkpoint, ck.tokenizer.chat_prompt(messages), 8)
    r = server.client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    stream = server.client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True},
        **GREEDY)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 8
    parts = [{"role": "user", "content": [{"type": "text", "text": "what is the capital"},
                                          {"type": "text", "text": " of france?"}]}]
    r = server.client.chat.completions.create(model=MODEL, messages=parts, **GREEDY)
    assert r.choices[0].message.content == want


def test_seeded_sampling_is_reproducible_and_matches_the_reference(server, checkpoint):
    _, ck, _ = checkpoint
    prompt = "hello world"
    kw = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "max_tokens": 10,
          "extra_body": {"ignore_eos": True, "top_k": 50}}
    a = server.client.completions.create(model=MODEL, prompt=prompt, **kw).choices[0].text
    b = server.client.completions.create(model=MODEL, prompt=prompt, **kw).choices[0].text
    assert a == b == expected(checkpoint, ck.tokenizer.encode(prompt), 10,
                              SamplingParams(0.9, 0.95, 50, seed=11))


def test_concurrent_requests_each_get_their_own_tokens(server, checkpoint):
    _, ck, _ = checkpoint
    prompts = ["the cpu engine decodes", "a paged kv cache", "dense assist runs the post",
               "hello world, how are", "user: what is", "the gpu engine prefills new"] * 2

    def ask(p: str) -> str:
        return server.client.completions.create(model=MODEL, prompt=p, **GREEDY).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(ask, prompts))
    assert got == [expected(checkpoint, ck.tokenizer.encode(p), 8) for p in prompts]


BAD_REQUESTS = [
    ("unknown model", {"model": "gpt-4", "prompt": "hi"}, "model", "not served here"),
    ("prompt longer than any pool holds", {"model": MODEL, "prompt": [5] * 7000},
     "prompt", "at most 6400 tokens"),
    ("max_tokens 0", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens",
     "must be in \\[1, "),
    ("max_tokens past the pool", {"model": MODEL, "prompt": "hi", "max_tokens": 10 ** 6},
     "max_tokens", "must be in \\[1, "),
    ("max_tokens not a number", {"model": MODEL, "prompt": "hi", "max_tokens": "lots"},
     "max_tokens", "valid integer"),
    ("temperature below 0", {"model": MODEL, "prompt": "hi", "temperature": -1},
     "temperature", "must be in"),
    ("top_p 0", {"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p", "must be in"),
    ("n of 2", {"model": MODEL, "prompt": "hi", "n": 2}, "n", "one choice"),
    ("no prompt", {"model": MODEL}, "prompt", "Field required"),
    ("token id past the vocabulary", {"model": MODEL, "prompt": [1, 99999]}, "prompt",
     "token ids must be in"),
]


@pytest.mark.parametrize("what, body, param, message", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_a_bad_request_is_a_400_naming_its_field_and_the_server_stays_up(
        server, what, body, param, message):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and re.search(message, error["message"]), error
    assert httpx.get(server.url + "/health").status_code == 200


def test_malformed_json_and_a_bad_chat_message_are_400s(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": "tiny", "mess',
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "robot", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match="not served here"):
        server.client.completions.create(model="nope", prompt="hi")
    assert httpx.get(server.url + "/health").status_code == 200


def test_metrics_are_prometheus_text(server):
    server.client.completions.create(model=MODEL, prompt="hi", **GREEDY)
    text = httpx.get(server.url + "/metrics").text
    for line in ('dualpace_kv_blocks_capacity{pool="hbm"} 10',
                 'dualpace_kv_blocks_capacity{pool="host"} 400',
                 'dualpace_queue_length{queue="cpu_running"}',
                 "dualpace_gpu_rounds_total", "dualpace_time_to_first_token_seconds_bucket",
                 'dualpace_inter_token_latency_seconds_bucket{le="+Inf"}'):
        assert line in text, line
    rounds = int(re.search(r"^dualpace_gpu_rounds_total (\d+)", text, re.M).group(1))
    assert rounds > 0


def test_sigterm_mid_stream_ends_the_stream_and_leaves_nothing_behind(tmp_path, checkpoint):
    s = Server(tmp_path, checkpoint[0])
    try:
        s.client.completions.create(model=MODEL, prompt="dense assist", **GREEDY)  # one whole
        stream = s.client.completions.create(model=MODEL, prompt="the quick", stream=True,
                                             max_tokens=5000, temperature=0,
                                             extra_body={"ignore_eos": True})
        first = [next(stream) for _ in range(3)]
        s.proc.send_signal(signal.SIGTERM)
        rest = list(stream)  # the server cancels it: the stream ends, told why
        rc = s.proc.wait(60)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    output = s.proc.stdout.read()
    assert rc == 0, output
    assert first and rest[-1].choices[0].finish_reason == "abort"
    assert len(first) + len(rest) < 5000
    assert s.cpu_pid is not None and not os.path.exists(f"/proc/{s.cpu_pid}")
    for name in ("requests.parquet", "summary.json", "journal-dualpace.jsonl.gz", "served.yaml",
                 "arrivals.csv", "profile.yaml"):
        assert (s.out / name).is_file(), name
    (summary,) = json.loads((s.out / "summary.json").read_text())
    check_real_summary(summary)
    assert summary["served"] and summary["rate"] is None and summary["finished"]["abort"] >= 1
    from dualpace_sim.validation.validate import validate

    moved = tmp_path / "moved"  # a served folder validates wherever it is copied to
    shutil.copytree(s.out, moved)
    assert yaml.safe_load((moved / "served.yaml").read_text())["profile"] == "profile.yaml"
    result = validate(moved, moved / "served.yaml")
    assert set(result.table["policy"]) == {"dualpace"}
    assert result.replays and result.replays[0].calls > 0
