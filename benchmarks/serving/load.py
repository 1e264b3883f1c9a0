"""A served run driven by a load tool made for OpenAI endpoints (guidellm), then validated.

Starts `dualpace-hw serve SCENARIO --checkpoint DIR --out OUT`, waits until it takes
requests, runs guidellm's constant-rate profile at each `--rates` value for `--requests`
requests (synthetic prompts of `--prompt-tokens`, `--output-tokens` each, EOS ignored) on the
machine's last `--client-cores` cores, kept from the server's, with one worker process
(`--client-processes`), stops the server with SIGTERM (it writes the served run) and runs
`dualpace-sim validate` on it with the scenario of the arrivals it saw. Writes, beside the
runtime's own records in OUT:

* `guidellm.json`: guidellm's report, every rate;
* `load.json`: per rate, guidellm's client-side figures (TTFT, ITL, output tok/s), and for the
  whole run the runtime's own (engine clock) with the client / engine TTFT ratio, what HTTP,
  the token pump and the client add;
* `validation/`: `validate`'s table and replay check.

guidellm pins its own dependencies (click, torch), so it lives in a virtual environment of its
own (`make load-tool` makes `.venv-load`); `--guidellm` names its executable.

    python -m benchmarks.serving.load SCENARIO --checkpoint DIR --out OUT --rates 2 4 \\
        --requests 100 --prompt-tokens 512 --output-tokens 128 --cpu-cores 13 --client-cores 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_GUIDELLM = Path(__file__).resolve().parents[2] / ".venv-load" / "bin" / "guidellm"


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the server exited with {proc.returncode} before it took requests")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    sys.exit(f"error: the server did not take requests within {timeout_s:.0f} s")


def split_cores(box: set[int], cpu_cores: int | None, client_cores: int
                ) -> tuple[set[int] | None, set[int] | None]:
    """The server's and the load tool's cores on one machine: (server, client), disjoint.
    The CPU engine takes the first `cpu_cores` (as `serve --cpu-cores` does) and the client
    the last `client_cores`; the server's process keeps the rest with the engine's, and its own
    threads keep off the engine's. A load tool beside the engines preempts them: on the H200
    box, guidellm on all 16 cores stalled the CPU engine's OpenMP team, and on the two the
    server's own threads had, it starved the GPU engine (docs/serving.md). (None, None)
    leaves both unpinned: no `--cpu-cores`, or `--client-cores 0`."""
    if not cpu_cores or not client_cores:
        return None, None
    rest = sorted(box - set(range(cpu_cores)))
    if len(rest) <= client_cores:
        raise ValueError(f"--cpu-cores {cpu_cores} --client-cores {client_cores}: leave no "
                         f"core for the server's own threads on this {len(box)}-core machine; "
                         "give the CPU engine or the client fewer")
    client = set(rest[-client_cores:])
    return box - client, client


def run_guidellm(a: argparse.Namespace, url: str, report: Path, cores: set[int] | None) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1",
           "GUIDELLM__MAX_WORKER_PROCESSES": str(a.client_processes)}
    cmd = [str(a.guidellm), "run",
           "--backend", f"kind=openai_http,target={url},model={a.model_name}",
           "--profile", f"kind=constant,rate={a.rates[0]}",
           "--override", "profile.rate", ",".join(str(r) for r in a.rates),
           "--constraint", f"kind=max_requests,count={a.requests}",
           "--constraint", f"kind=max_duration,seconds={a.max_seconds}",
           "--data", f"kind=synthetic_text,prompt_tokens={a.prompt_tokens},"
                     f"output_tokens={a.output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={a.checkpoint}",
           "--output", f"kind=json,path={report}", "--disable-console-interactive"]
    print("$", " ".join(cmd), f"(on cores {sorted(cores)})" if cores else "", flush=True)
    subprocess.run(cmd, check=True, env=env, timeout=a.timeout_s,
                   preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)


def client_figures(report: Path) -> list[dict]:
    """guidellm's per-rate figures (successful requests)."""
    rows = []
    for b in json.loads(report.read_text())["benchmarks"]:
        m = b["metrics"]

        def stat(name: str, key: str, m=m) -> float:
            s = m[name]["successful"]
            return s["percentiles"][key] if key.startswith("p") else s[key]

        rows.append({
            "rate": b["config"]["strategy"]["rate"],
            "successful": len(b["requests"]["successful"]),
            # guidellm times a first token only where the stream carried text: a tokenizer
            # whose ids decode to nothing leaves it null and its TTFT figures meaningless.
            "timed_first_token": sum(r["time_to_first_token_ms"] is not None
                                     for r in b["requests"]["successful"]),
            "errored": len(b["requests"]["errored"]),
            "mean_ttft_s": stat("time_to_first_token_ms", "mean") / 1e3,
            "p99_ttft_s": stat("time_to_first_token_ms", "p99") / 1e3,
            "p99_itl_s": stat("inter_token_latency_ms", "p99") / 1e3,
            "output_tok_s": stat("output_tokens_per_second", "mean"),
        })
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", type=Path)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0])
    p.add_argument("--requests", type=int, default=20, help="per rate")
    p.add_argument("--max-seconds", type=float, default=300, help="per rate")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--policy", default="dualpace")
    p.add_argument("--device", default="cuda")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--model-name", default="served")
    p.add_argument("--cpu-cores", type=int, default=None,
                   help="the CPU engine's cores, the first of the machine's (`serve --cpu-cores`)")
    p.add_argument("--client-cores", type=int, default=2,
                   help="cores for guidellm, the last of the machine's, kept from the server "
                        "(0: neither pinned)")
    p.add_argument("--client-processes", type=int, default=1,
                   help="guidellm's worker processes (its default, 10, crowds a 16-core box)")
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                   help="more `dualpace-hw serve` options (last), e.g. --cpu-tp 2")
    p.add_argument("--guidellm", type=Path, default=DEFAULT_GUIDELLM)
    p.add_argument("--timeout-s", type=float, default=1800)
    a = p.parse_args()
    if not a.guidellm.is_file():
        sys.exit(f"error: --guidellm {a.guidellm}: no such executable; `make load-tool` "
                 "installs guidellm in .venv-load")
    try:
        server_cores, client = split_cores(os.sched_getaffinity(0), a.cpu_cores, a.client_cores)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    url = f"http://127.0.0.1:{a.port}"
    server = subprocess.Popen(
        [sys.executable, "-c", "from dualpace_hw.cli import main; main()", "serve",
         str(a.scenario), "--checkpoint", str(a.checkpoint), "--out", str(a.out),
         "--policy", a.policy, "--port", str(a.port), "--model-name", a.model_name,
         "--device", a.device,
         *(["--cpu-cores", str(a.cpu_cores)] if a.cpu_cores else []), *a.serve_args],
        preexec_fn=(lambda: os.sched_setaffinity(0, server_cores)) if server_cores else None)
    try:
        wait_healthy(url, server, a.timeout_s)
        a.out.mkdir(parents=True, exist_ok=True)
        run_guidellm(a, url, a.out / "guidellm.json", client)
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(a.timeout_s)
    if rc != 0:
        sys.exit(f"error: the server exited with {rc}")

    from dualpace_sim.validation.validate import format_table, validate

    result = validate(a.out, a.out / "served.yaml")
    print(format_table(result.table))
    for r in result.replays:
        print(r.line())
    clients = client_figures(a.out / "guidellm.json")
    engine = json.loads((a.out / "summary.json").read_text())[0]
    figures = {"client": clients, "engine": {k: engine[k] for k in (
        "submitted", "completed", "mean_ttft_s", "p99_ttft_s", "p99_itl_s",
        "throughput_tok_s", "cpu_token_fraction")}}
    n = sum(c["successful"] for c in clients)
    client_ttft = sum(c["mean_ttft_s"] * c["successful"] for c in clients) / max(n, 1)
    figures["client_over_engine_mean_ttft"] = client_ttft / engine["mean_ttft_s"]
    (a.out / "load.json").write_text(json.dumps(figures, indent=2) + "\n")
    for c in clients:
        if c["timed_first_token"] < c["successful"]:
            print(f"warning: guidellm saw text in {c['timed_first_token']} of {c['successful']} "
                  f"streams at rate {c['rate']:g}/s; its TTFT and ITL are not the streams'",
                  file=sys.stderr)
        print(f"guidellm rate {c['rate']:g}/s: {c['successful']} ok, {c['errored']} errors, "
              f"mean TTFT {c['mean_ttft_s'] * 1e3:.1f} ms, p99 ITL {c['p99_itl_s'] * 1e3:.1f} "
              f"ms, {c['output_tok_s']:.1f} output tok/s")
    print(f"runtime: {engine['completed']}/{engine['submitted']} requests, mean TTFT "
          f"{engine['mean_ttft_s'] * 1e3:.1f} ms (engine clock); client / engine mean TTFT = "
          f"{figures['client_over_engine_mean_ttft']:.2f}")


if __name__ == "__main__":
    main()
