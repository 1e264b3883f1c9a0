"""The bridge between an asynchronous HTTP server and the real runtime's engine threads.

The runtime runs as in `dualpace-hw run` (its two engines' loops unchanged) in a thread of its
own, accepting requests through `submit_now`. Its engines append each sampled token to the
token store after the core's apply; a pump on the server's event loop reads every live
request's new tokens under the runtime's lock every `POLL_S`, detokenizes them, applies stop
strings and EOS (ending the request in the core with `finish_early`) and hands the text to the
request's queue. Polling keeps the engines' loops free of server code; it adds at most
`POLL_S` to what a client sees, never to the runtime's own records (the engines' clock).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from dualpace_hw.executors.checkpoint import TextTokenizer
from dualpace_hw.executors.sampling import SamplingParams
from dualpace_sim.core import Request

POLL_S = 0.002
# Prometheus histogram bounds (seconds) of time to first token and inter-token latency.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Delta:
    """What a client gets next: new text and token ids, and why it ended (once it has)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "abort"


@dataclass
class Generation:
    """One request as the server follows it."""

    req: Request
    prompt_ids: list[int]
    stop: list[str]
    ignore_eos: bool
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    ids: list[int] = field(default_factory=list)  # output tokens the client is owed
    seen: int = 0  # output tokens read from the token store
    text: str = ""  # text sent so far
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class Histogram:
    """A cumulative Prometheus histogram."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        out, running = [f"# TYPE {name} histogram"], 0
        for b, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += c
            out.append(f'{name}_bucket{{le="{"+Inf" if b == float("inf") else b}"}} {running}')
        return out + [f"{name}_sum {self.total:.6g}", f"{name}_count {running}"]


class EngineService:
    """The runtime in a thread, requests in and deltas out (see the module docstring)."""

    def __init__(self, runtime, tokenizer: TextTokenizer, eos_ids: frozenset[int],
                 max_rows: int, max_context: int) -> None:
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.live: list[Generation] = []
        self.failure: BaseException | None = None
        self.closing = False
        self.ttft, self.itl = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS)
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        self.requests_done: list[Request] = []  # what serve() returned, after the run
        self._thread = threading.Thread(target=self._serve, name="runtime", daemon=True)
        runtime.accept_requests(max_rows, max_context)

    # --- the runtime's thread ---------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self.requests_done = self.runtime.serve()
        except BaseException as e:  # noqa: BLE001 - reported through /health and requests
            self.failure = e
        finally:
            self.runtime.started.set()  # a runtime that failed to start wakes `start` too

    def start(self, timeout_s: float = 600.0) -> None:
        """Start the runtime (warm-up included) and wait until it takes requests."""
        self._thread.start()
        if not self.runtime.started.wait(timeout_s):
            raise RuntimeError(f"the runtime did not start in {timeout_s:.0f} s")
        if self.failure is not None:
            raise self.failure

    @property
    def healthy(self) -> bool:
        return self.failure is None and self._thread.is_alive() and not self.closing

    # --- requests -------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], max_tokens: int, stop: list[str],
               ignore_eos: bool, sampling: SamplingParams) -> Generation:
        req = self.runtime.submit_now(prompt_ids, max_tokens, sampling)
        gen = Generation(req, prompt_ids, stop, ignore_eos)
        self.live.append(gen)
        return gen

    def cancel(self, gen: Generation) -> None:
        """The client went away: end the request in the core, send nothing more."""
        if not gen.done:
            self._finish(gen, "abort")

    async def pump(self) -> None:
        """Deliver new tokens to every live generation, forever (a task of the server)."""
        while True:
            if self.live:
                self.poll()
            await asyncio.sleep(POLL_S if self.live else 10 * POLL_S)

    def poll(self) -> None:
        with self.runtime.lock:
            fresh = [(g, self.runtime.tokens.generated(g.req.req_id)[g.seen:], g.req.finished)
                     for g in self.live]
        for gen, new, finished in fresh:
            if self.failure is not None and not gen.done:
                self._finish(gen, "abort")
            self._advance(gen, new, finished)
        self.live = [g for g in self.live if not g.done]

    def _advance(self, gen: Generation, new: list[int], finished: bool) -> None:
        gen.seen += len(new)
        if gen.done:
            return
        reason, before = None, len(gen.ids)
        for t in new:
            gen.ids.append(t)
            if t in self.eos_ids and not gen.ignore_eos:
                reason = "stop"
                break
        text = self.tokenizer.decode(gen.ids)
        cut = min((i for i in (text.find(s) for s in gen.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop"
        if reason is None and finished:
            reason = "length"
        if reason is None:
            text = text[: len(text) - held_back(text, gen.stop)]
        delta = text[len(gen.text):] if text.startswith(gen.text) else ""
        gen.text += delta
        added = gen.ids[before:]
        if added or reason:
            gen.queue.put_nowait(Delta(delta, added, reason))
        if reason is not None:
            self._finish(gen, reason, notify=False)

    def _finish(self, gen: Generation, reason: str, notify: bool = True) -> None:
        gen.finish_reason = reason
        self.finished[reason] += 1
        if not gen.req.finished:
            self.runtime.finish_early(gen.req)
        with self.runtime.lock:
            times = list(gen.req.token_times)
        if times:
            self.ttft.observe(times[0] - gen.req.arrival_s)
            for a, b in zip(times, times[1:], strict=False):
                self.itl.observe(b - a)
        if notify:
            gen.queue.put_nowait(Delta("", [], reason))

    # --- shutdown ---------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """SIGTERM: take no more requests; cancel those in flight (each ends within one
        token, its client told `abort`)."""
        self.closing = True
        for gen in list(self.live):
            self.cancel(gen)

    def close(self, drain_s: float = 30.0) -> list[Request]:
        """Let the cancelled requests finish in the core (bounded), then stop the runtime and
        wait for its thread (which stops the CPU engine's process and frees shared memory)."""
        self.begin_shutdown()
        rt = self.runtime
        deadline = drain_s
        while deadline > 0 and self._thread.is_alive() and self.failure is None:
            with rt.lock:
                busy = any(not r.finished for r in rt.requests)
            if not busy:
                break
            self._thread.join(0.05)
            deadline -= 0.05
        rt.stop.set()
        rt.wake()
        self._thread.join()
        return self.requests_done

    # --- /metrics ---------------------------------------------------------------------------
    def metrics(self) -> str:
        """The engine counters, queues, KV occupancy per pool and latency histograms, in
        Prometheus' text format."""
        rt = self.runtime
        lines: list[str] = []

        def gauge(name: str, value: float, kind: str = "gauge", **labels: str) -> None:
            tag = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"# TYPE dualpace_{name} {kind}")
            lines.append(f"dualpace_{name}{{{tag}}} {value:.6g}" if tag
                         else f"dualpace_{name} {value:.6g}")

        with rt.lock:
            queues = rt.queue_lengths()
            pools = rt.pool_occupancy()
            submitted = len(rt.requests)
        stats = rt.stats
        gauge("requests_submitted_total", submitted, "counter")
        for reason, n in self.finished.items():
            gauge("requests_finished_total", n, "counter", reason=reason)
        gauge("requests_live", len(self.live))
        for name in ("gpu_rounds", "cpu_rounds", "assist_calls"):
            gauge(f"{name}_total", getattr(stats, name), "counter")
        for name in ("gpu_busy_s", "cpu_busy_s", "cpu_assist_s"):
            gauge(f"{name}_total", getattr(stats, name), "counter")
        for route, n in sorted(stats.routes.items()):
            gauge("cpu_rounds_by_route_total", n, "counter", route=route)
        for queue, n in queues.items():
            gauge("queue_length", n, queue=queue)
        for pool, (used, capacity) in pools.items():
            gauge("kv_blocks_used", used, pool=pool)
            gauge("kv_blocks_capacity", capacity, pool=pool)
        lines += self.ttft.lines("dualpace_time_to_first_token_seconds")
        lines += self.itl.lines("dualpace_inter_token_latency_seconds")
        return "\n".join(lines) + "\n"


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` not to send yet: an incomplete UTF-8 sequence (the
    replacement characters a later byte may still complete), or the start of a stop string
    that may complete next token."""
    if text.endswith("\ufffd"):
        return len(text) - len(text.rstrip("\ufffd"))
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1)
                if s.startswith(text[-k:])), default=0)
