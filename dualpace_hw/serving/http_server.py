"""`dualpace-hw serve`'s HTTP side: an OpenAI-compatible API (FastAPI, uvicorn) over the
engine service.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed as server-sent events
with `"stream": true`), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
Fields beyond OpenAI's, as vLLM names them: `top_k`, `ignore_eos`. A bad request is an HTTP 400
whose JSON error names the field (`param`), as OpenAI's do; it never reaches the runtime.

Shutdown on SIGTERM or Ctrl-C: new requests get 503, requests in flight are cancelled (each
ends in the core after at most one more token, its client told `finish_reason: "abort"`), the
runtime stops, and the CPU engine's process and the shared memory go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from dualpace_hw.executors.sampling import SamplingParams
from dualpace_hw.serving.service import Delta, EngineService, Generation

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for completions


class BadRequest(Exception):
    """A request the server refuses: HTTP 400 naming `param`."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationFields(BaseModel):
    """What completions and chat share. Unknown fields are ignored, as OpenAI's API does."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM's; -1 also turns it off
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False  # vLLM's: generate max_tokens tokens whatever is sampled


class CompletionRequest(GenerationFields):
    prompt: str | list[int] | list[str]


class TextPart(BaseModel):
    """A part of a message's content; only text is served (no images or audio)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]  # a string, or parts as load tools such as guidellm send

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content)


class ChatRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def error_body(message: str, param: str | None, status: int = 400) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class Api:
    """The routes over one engine service and one served model."""

    def __init__(self, svc: EngineService, model: str, max_context: int, vocab_size: int,
                 default_max_tokens: int) -> None:
        self.svc, self.model, self.max_context = svc, model, max_context
        self.vocab_size = vocab_size  # the model's (a tokenizer may know fewer ids)
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())

    # --- checks ---------------------------------------------------------------------------
    def _generation(self, body: GenerationFields, prompt: list[int], chat: bool,
                    max_tokens: int | None) -> Generation:
        if self.svc.closing or not self.svc.healthy:
            raise BadRequest("", "the server is shutting down or its runtime failed")
        if body.model != self.model:
            raise BadRequest("model", f"model {body.model!r} is not served here; this server "
                                      f"serves {self.model!r} (see /v1/models)")
        if body.n != 1:
            raise BadRequest("n", f"n {body.n}: this server returns one choice (n = 1)")
        if not prompt:
            raise BadRequest("messages" if chat else "prompt", "the prompt is empty")
        vocab = self.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise BadRequest("prompt", f"token ids must be in [0, {vocab})")
        room = self.max_context - len(prompt)
        if room < 1:
            raise BadRequest("messages" if chat else "prompt",
                             f"the prompt has {len(prompt)} tokens; a request may hold at most "
                             f"{self.max_context} tokens with its output (the KV pool's size)")
        if max_tokens is None:
            max_tokens = min(room, self.default_max_tokens if chat else DEFAULT_COMPLETION_TOKENS)
        field = "max_completion_tokens" if chat and body.max_tokens is None else "max_tokens"
        if not 1 <= max_tokens <= room:
            raise BadRequest(field, f"{field} {max_tokens}: must be in [1, {room}] for this "
                                    f"{len(prompt)}-token prompt ({self.max_context} in all)")
        try:
            top_k = 0 if body.top_k == -1 else body.top_k
            sampling = SamplingParams(body.temperature, body.top_p, top_k, body.seed)
        except ValueError as e:
            raise BadRequest(str(e).split()[0], str(e)) from None
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if any(not s for s in stop) or len(stop) > 4:
            raise BadRequest("stop", "stop: up to 4 non-empty strings")
        return self.svc.submit(prompt, max_tokens, stop, body.ignore_eos, sampling)

    def completion_prompt(self, body: CompletionRequest) -> list[int]:
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise BadRequest("prompt", "one prompt per request (a list of one string)")
            p = p[0]
        return self.svc.tokenizer.encode(p) if isinstance(p, str) else list(p)

    # --- responses ------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        gen = self._generation(body, self.completion_prompt(body), False, body.max_tokens)
        return await self._respond(gen, body, request, chat=False)

    async def chat(self, body: ChatRequest, request: Request):
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            prompt = self.svc.tokenizer.chat_prompt(messages)
        except Exception as e:  # noqa: BLE001 - the template's own errors, from jinja2
            raise BadRequest("messages", f"the chat template failed on them: {e}") from None
        gen = self._generation(body, prompt, True,
                               body.max_tokens if body.max_tokens is not None
                               else body.max_completion_tokens)
        return await self._respond(gen, body, request, chat=True)

    async def _respond(self, gen: Generation, body: GenerationFields, request: Request,
                       chat: bool):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(self._events(gen, rid, chat, usage),
                                     media_type="text/event-stream")
        text, reason = "", None
        try:
            while reason is None:
                d: Delta = await gen.queue.get()
                text, reason = text + d.text, d.finish_reason
        finally:
            self.svc.cancel(gen)  # a client that left: nothing more for it (no-op once done)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": reason, "logprobs": None} if chat
                  else {"index": 0, "text": text, "finish_reason": reason, "logprobs": None})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model, "choices": [choice],
                "usage": self._usage(gen)}

    def _usage(self, gen: Generation) -> dict[str, int]:
        p, c = len(gen.prompt_ids), len(gen.ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def _events(self, gen: Generation, rid: str, chat: bool,
                      usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict], **extra) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": self.model,
                    "choices": choices, **extra}
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}])
            reason = None
            while reason is None:
                d: Delta = await gen.queue.get()
                reason = d.finish_reason
                if not (d.text or reason):
                    continue
                yield chunk([{"index": 0, "delta": {"content": d.text} if d.text else {},
                              "finish_reason": reason, "logprobs": None} if chat
                             else {"index": 0, "text": d.text, "finish_reason": reason,
                                   "logprobs": None}])
            if usage:
                yield chunk([], usage=self._usage(gen))
            yield "data: [DONE]\n\n"
        finally:
            self.svc.cancel(gen)  # the client went away mid-stream (no-op once done)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.created,
             "owned_by": "dualpace", "max_model_len": self.max_context}]}


def create_app(svc: EngineService, model: str, max_context: int, vocab_size: int,
               default_max_tokens: int = 256) -> FastAPI:
    """The FastAPI app; its lifespan runs the service's token pump."""
    api = Api(svc, model, max_context, vocab_size, default_max_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        pump = asyncio.create_task(svc.pump())
        yield
        pump.cancel()

    app = FastAPI(title="dualpace-hw serve", lifespan=lifespan)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest) -> JSONResponse:
        status = 503 if not e.param and svc.closing else 400
        return JSONResponse(error_body(e.message, e.param or None, status), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        where = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(f"the body is not valid JSON: {first.get('msg')}",
                                           None), status_code=400)
        param = where[0] if where else None
        path = ".".join(where) or "body"
        return JSONResponse(error_body(f"{path}: {first.get('msg')}", param), status_code=400)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await api.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await api.chat(body, request)

    @app.get("/v1/models")
    async def models():
        return api.models()

    @app.get("/health")
    async def health():
        if svc.healthy:
            return {"status": "ok"}
        reason = "shutting down" if svc.closing else f"runtime failed: {svc.failure}"
        return JSONResponse({"status": reason}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(svc.metrics(), media_type="text/plain; version=0.0.4")

    return app


def run_server(svc: EngineService, app: FastAPI, host: str, port: int) -> None:
    """Serve until SIGTERM or Ctrl-C; in-flight requests are cancelled first, so streams end
    promptly (uvicorn waits for open connections before it stops)."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's, less its re-raising the signal once it has stopped: that would kill
            this process before it writes the served run's results."""
            handled = (signal.SIGINT, signal.SIGTERM)
            before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame) -> None:
            svc.begin_shutdown()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    Server(config).run()
