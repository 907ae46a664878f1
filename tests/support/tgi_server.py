"""A TGI-protocol server for tests: TGI's documented HTTP behaviour, replayed from recorded TGI outputs.

TGI itself cannot run on CI machines (Rust router, GPU or large CPU images, model weights), so the gateway is
tested against this reproduction, never against a live TGI. What it reproduces, with its source:

* Routes ``/generate_stream``, ``/`` (``"stream": true`` streams, otherwise ``[GenerateResponse]``),
  ``/generate``, ``/v1/chat/completions``, ``/info``, ``/health`` (router/src/server.rs).
* Stream events ``{"index","token":{"id","text","logprob","special"},"generated_text","details"}``; ``index``
  from 1; ``generated_text`` and ``details`` (``finish_reason``, ``generated_tokens``, ``seed``,
  ``input_length``) only on the last event; ``top_tokens`` left out when empty (router/src/lib.rs).
* ``data: `` with the space (axum 0.7, TGI >= 2.1) or ``data:`` without it (``space=False``: axum 0.6, TGI < 2.1).
* Every error on the generate stream routes, validation and overload included, is an in-band event
  ``{"error","error_type"}`` under HTTP 200; the chat route sends ``{"error":{"message","http_status_code":422}}``
  then ``[DONE]``; non-streaming routes answer with TGI's status codes (422, 429, 424, 500).
* ``:\\n\\n`` after ``keepalive`` seconds without an event (TGI: 15 s, axum's ``KeepAlive::default()``), timer
  reset by every event. One event per token, never merged. ``[DONE]`` ends the chat stream.
* A client that disconnects drops its request (counted in :class:`TGIServerState`).

Token data: the 10 Llama tokens of TGI's integration-test snapshot ``test_flash_llama/test_flash_llama_simple.json``
(the same tokens as ``reference/wire/tgi_generate_stream_derived.sse``), then ``</s>`` (special) when
``max_new_tokens`` allows more. Chat chunks follow TGI 3.x's ``ChatCompletionChunk`` (``"role":"assistant"`` in
every delta, empty ``id``), with a fixed ``created`` so that two runs compare equal.

Test controls ride in the prompt (or the last chat message) as ``!name=value`` words, which are not part of
TGI: ``!error=TYPE`` (an in-band error of that ``error_type``; ``!after=N`` tokens first), ``!delay=SECONDS``
between tokens, ``!hold=NAME`` (wait for :meth:`TGIServerState.release` before token ``!holdat=N``, default 0),
``!loop`` (cycle the tokens up to ``max_new_tokens`` instead of stopping at ``</s>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TOKENS: tuple[dict[str, Any], ...] = (
    {"id": 363, "text": " for", "logprob": -1.5351562, "special": False},
    {"id": 847, "text": " /", "logprob": -2.5722656, "special": False},
    {"id": 2754, "text": "api", "logprob": -2.2714844, "special": False},
    {"id": 29914, "text": "/", "logprob": -0.03414917, "special": False},
    {"id": 29894, "text": "v", "logprob": -0.95996094, "special": False},
    {"id": 29896, "text": "1", "logprob": -0.3635254, "special": False},
    {"id": 29914, "text": "/", "logprob": -0.013031006, "special": False},
    {"id": 16418, "text": "projects", "logprob": -3.1523438, "special": False},
    {"id": 29914, "text": "/", "logprob": -0.43701172, "special": False},
    {"id": 29896, "text": "1", "logprob": -1.9394531, "special": False},
)
"""From TGI's snapshot test_flash_llama_simple.json (``details.tokens``), in the wire order of ``Token``."""
EOS: dict[str, Any] = {"id": 2, "text": "</s>", "logprob": -0.23535156, "special": True}
BOS: dict[str, Any] = {"id": 1, "text": "<s>", "logprob": None}

ERROR_MESSAGES: dict[str, str] = {
    "validation": "Input validation error: rejected by the test control `!error=validation`",
    "generation": "Request failed during generation: Server error: simulated shard failure",
    "overloaded": "Model is overloaded",
    "incomplete_generation": "Incomplete generation",
    "tokenizer": "Tokenizer error: simulated tokenizer failure",
}
"""TGI's ``Display`` texts (router/src/infer/mod.rs, validation.rs); the last part of each is simulated."""
ERROR_STATUS: dict[str, int] = {"validation": 422, "generation": 424, "overloaded": 429,
                                "incomplete_generation": 500, "incomplete_generation_stream": 500,
                                "template_error": 422, "tokenizer": 422}
"""HTTP status of each error type on the non-streaming routes (``impl From<InferError> for (StatusCode, ..)``)."""


class InferError(Exception):
    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type

    @property
    def payload(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}

    @property
    def status(self) -> int:
        return ERROR_STATUS.get(self.error_type, 500)


@dataclass(frozen=True, slots=True)
class TGIServerConfig:
    space: bool = True
    """``data: `` (TGI >= 2.1, axum 0.7) or ``data:`` (TGI < 2.1, axum 0.6)."""
    keepalive: float = 15.0
    """Seconds of silence before ``:\\n\\n`` (TGI: 15, not configurable there)."""
    token_delay: float = 0.0
    max_concurrent_requests: int = 128
    max_stop_sequences: int = 4
    model_id: str = "huggingface/llama-7b"
    version: str = "3.3.7"
    created: int = 1732838400
    default_return_full_text: bool = False
    """What ``/`` uses when ``return_full_text`` is unset (TGI: true for ``text-generation`` pipeline models)."""


@dataclass(slots=True)
class TGIServerState:
    """What tests observe and steer; thread-safe, since the server runs in its own thread and event loop."""

    started: int = 0
    completed: int = 0
    disconnects: int = 0
    active: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _gates: dict[str, asyncio.Event] = field(default_factory=dict, repr=False)
    _released: set[str] = field(default_factory=set, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def _bump(self, name: str, delta: int = 1) -> None:
        with self._cond:
            setattr(self, name, getattr(self, name) + delta)
            self._cond.notify_all()

    def wait_for(self, name: str, count: int, timeout: float = 10.0) -> bool:
        """Block until counter ``name`` reaches ``count``; False if it did not within ``timeout`` (a hang guard)."""
        with self._cond:
            return self._cond.wait_for(lambda: getattr(self, name) >= count, timeout)

    def release(self, name: str) -> None:
        """Let streams held with ``!hold=NAME`` continue (now and for later requests)."""
        with self._cond:
            self._released.add(name)
            gate = self._gates.get(name)
            loop = self._loop
        if gate is not None and loop is not None:
            loop.call_soon_threadsafe(gate.set)

    async def _wait_gate(self, name: str) -> None:
        with self._cond:
            self._loop = asyncio.get_running_loop()
            gate = self._gates.setdefault(name, asyncio.Event())
            if name in self._released:
                gate.set()
        await gate.wait()


# --------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class _Plan:
    """One generation: the tokens to send and how the stream ends."""

    inputs: str
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    details: bool = False
    return_full_text: bool = False
    top_n_tokens: int = 0
    decoder_input_details: bool = False
    error: str | None = None
    error_after: int = 0
    delay: float = 0.0
    hold: str | None = None
    hold_at: int = 0
    loop: bool = False


def _controls(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for word in text.split():
        if word.startswith("!") and len(word) > 1:
            name, _, value = word[1:].partition("=")
            out[name] = value
    return out


def _validate(params: dict[str, Any], *, stream: bool, max_stop: int) -> None:
    """TGI's own validation texts (router/src/validation.rs) for the rules a client most often breaks."""

    def fail(text: str) -> None:
        raise InferError(f"Input validation error: {text}", "validation")

    best_of = params.get("best_of")
    if best_of is not None and best_of != 1 and stream:
        fail("`best_of` != 1 is not supported when streaming tokens")
    if stream and params.get("decoder_input_details"):
        fail("`decoder_input_details` == true is not supported when streaming tokens")
    temperature = params.get("temperature")
    if temperature is not None and temperature <= 0:
        fail("`temperature` must be strictly positive")
    top_p = params.get("top_p")
    if top_p is not None and not 0.0 < top_p < 1.0:
        fail("`top_p` must be > 0.0 and < 1.0")
    max_new = params.get("max_new_tokens")
    if max_new is not None and max_new <= 0:
        fail("`max_new_tokens` must be strictly positive")
    stop = params.get("stop") or []
    if len(stop) > max_stop:
        fail(f"`stop` supports up to {max_stop} stop sequences. Given: {len(stop)}")


def _plan(inputs: Any, params: dict[str, Any], *, stream: bool, config: TGIServerConfig,
          return_full_text_default: bool = False) -> _Plan:
    if not isinstance(inputs, str) or not isinstance(params, dict):
        raise InferError("Input validation error: `inputs` must be a string", "validation")
    controls = _controls(inputs)
    if not inputs.strip():
        raise InferError("Input validation error: `inputs` cannot be empty", "validation")
    _validate(params, stream=stream, max_stop=config.max_stop_sequences)
    rft = params.get("return_full_text")
    return _Plan(
        inputs=inputs,
        max_new_tokens=int(params.get("max_new_tokens") or 100),
        stop=tuple(params.get("stop") or ()),
        seed=params.get("seed"),
        details=bool(params.get("details")),
        return_full_text=return_full_text_default if rft is None else bool(rft),
        top_n_tokens=int(params.get("top_n_tokens") or 0),
        decoder_input_details=bool(params.get("decoder_input_details")),
        error=controls.get("error"),
        error_after=int(controls.get("after") or 0),
        delay=float(controls.get("delay") or config.token_delay),
        hold=controls.get("hold"),
        hold_at=int(controls.get("holdat") or 0),
        loop="loop" in controls,
    )


@dataclass(slots=True)
class _Step:
    index: int
    token: dict[str, Any]
    last: bool
    finish_reason: str | None = None
    generated_text: str | None = None


async def _generate(plan: _Plan, state: TGIServerState) -> AsyncIterator[_Step]:
    """The backend: one step per token; raises InferError where the plan says so."""
    text = ""
    for n in range(plan.max_new_tokens):
        if plan.hold is not None and n == plan.hold_at:
            await state._wait_gate(plan.hold)
        if plan.error is not None and n == plan.error_after:
            raise InferError(ERROR_MESSAGES.get(plan.error, f"simulated {plan.error} error"), plan.error)
        if plan.delay:
            await asyncio.sleep(plan.delay)
        if n < len(TOKENS) or plan.loop:
            token = TOKENS[n % len(TOKENS)]
        else:
            token = EOS
        if not token["special"]:
            text += token["text"]
        finish = None
        if token is EOS:
            finish = "eos_token"
        elif any(s and s in text for s in plan.stop):
            finish = "stop_sequence"
        elif n + 1 == plan.max_new_tokens:
            finish = "length"
        if finish is not None:
            full = plan.inputs + text if plan.return_full_text else text
            yield _Step(n + 1, token, True, finish, full)
            return
        yield _Step(n + 1, token, False)
        await asyncio.sleep(0)


def _top_tokens(token: dict[str, Any], n: int) -> list[dict[str, Any]]:
    return [token] + [dict(t) for t in TOKENS if t["id"] != token["id"]][: max(0, n - 1)]


def _stream_response(step: _Step, plan: _Plan, input_length: int) -> dict[str, Any]:
    out: dict[str, Any] = {"index": step.index, "token": step.token}
    if plan.top_n_tokens:
        out["top_tokens"] = _top_tokens(step.token, plan.top_n_tokens)
    out["generated_text"] = step.generated_text
    out["details"] = ({"finish_reason": step.finish_reason, "generated_tokens": step.index, "seed": plan.seed,
                       "input_length": input_length} if step.last and plan.details else None)
    return out


def _input_length(inputs: str) -> int:
    return len(inputs.split()) + 1  # a stand-in for the tokenizer: one token per word, plus <s>


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------------------------- app


@dataclass(slots=True)
class _Server:
    config: TGIServerConfig
    state: TGIServerState

    def frame(self, data: bytes) -> bytes:
        return (b"data: " if self.config.space else b"data:") + data + b"\n\n"

    async def keepalive(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """axum's ``Sse::keep_alive``: ``:\\n\\n`` once the stream has been silent for the interval."""
        iterator = events.__aiter__()
        pending: asyncio.Future[bytes] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(iterator.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=self.config.keepalive)
                if not done:
                    yield b":\n\n"
                    continue
                task, pending = pending, None
                try:
                    item = task.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            with contextlib.suppress(BaseException):
                await iterator.aclose()  # type: ignore[attr-defined]

    async def tracked(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Counts each request as started, then completed or disconnected (the client left before the end)."""
        self.state._bump("started")
        self.state._bump("active")
        finished = False
        try:
            async for chunk in body:
                yield chunk
            finished = True
        finally:
            self.state._bump("active", -1)
            self.state._bump("completed" if finished else "disconnects")

    def sse(self, events: AsyncIterator[bytes]) -> StreamingResponse:
        # axum sends ``text/event-stream`` with no charset (Starlette's media_type would add one).
        return StreamingResponse(self.tracked(self.keepalive(events)),
                                 headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                                          "x-accel-buffering": "no", "x-compute-type": "cpu-reproduction"})

    def admit(self, *, streaming: bool) -> None:
        # A stream is already counted in ``active`` when it gets here; a non-streaming request is not.
        if self.state.active - int(streaming) >= self.config.max_concurrent_requests:
            raise InferError(ERROR_MESSAGES["overloaded"], "overloaded")

    # -- /generate_stream and / (stream)

    async def generate_events(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        # As in TGI, permit, validation and scheduling run inside the stream: every failure is an event.
        try:
            self.admit(streaming=True)
            plan = _plan(body.get("inputs"), body.get("parameters") or {}, stream=True, config=self.config)
            input_length = _input_length(plan.inputs)
            async for step in _generate(plan, self.state):
                yield self.frame(_dumps(_stream_response(step, plan, input_length)))
        except InferError as err:
            yield self.frame(_dumps(err.payload))

    # -- /generate and / (no stream)

    async def generate_once(self, body: dict[str, Any], rft_default: bool) -> dict[str, Any]:
        self.admit(streaming=False)
        params = body.get("parameters") or {}
        plan = _plan(body.get("inputs"), params, stream=False, config=self.config,
                     return_full_text_default=rft_default)
        tokens: list[dict[str, Any]] = []
        last: _Step | None = None
        async for step in _generate(plan, self.state):
            tokens.append(step.token)
            last = step
        assert last is not None
        out: dict[str, Any] = {"generated_text": last.generated_text}
        if plan.details:
            details: dict[str, Any] = {"finish_reason": last.finish_reason, "generated_tokens": len(tokens),
                                       "seed": plan.seed,
                                       "prefill": [BOS] if plan.decoder_input_details else [], "tokens": tokens}
            if plan.top_n_tokens:
                details["top_tokens"] = [_top_tokens(t, plan.top_n_tokens) for t in tokens]
            out["details"] = details
        return out

    # -- /v1/chat/completions

    def chunk(self, content: str, finish: str | None, usage: dict[str, int] | None = None,
              choices: bool = True) -> bytes:
        return _dumps({
            "object": "chat.completion.chunk", "id": "", "created": self.config.created,
            "model": self.config.model_id, "system_fingerprint": f"{self.config.version}-native",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "logprobs": None,
                         "finish_reason": finish}] if choices else [],
            "usage": usage,
        })

    async def chat_events(self, plan: _Plan, include_usage: bool, prompt_tokens: int) -> AsyncIterator[bytes]:
        try:
            self.admit(streaming=True)
            n = 0
            async for step in _generate(plan, self.state):
                n = step.index
                finish = None if step.finish_reason is None else (
                    "length" if step.finish_reason == "length" else "stop")
                content = "" if step.token["special"] else step.token["text"]
                yield self.frame(self.chunk(content, finish))
            if include_usage:
                yield self.frame(self.chunk("", None, {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                                       "total_tokens": prompt_tokens + n}, choices=False))
        except InferError as err:
            yield self.frame(_dumps({"error": {"message": err.message, "http_status_code": 422}}))
        yield self.frame(b"[DONE]")


def create_tgi_server(config: TGIServerConfig | None = None,
                      state: TGIServerState | None = None) -> Starlette:
    """The reproduction as a Starlette app; ``app.state.tgi`` is its :class:`TGIServerState`."""
    server = _Server(config or TGIServerConfig(), state or TGIServerState())

    async def read_json(request: Request) -> dict[str, Any] | Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            # axum's Json extractor rejection (plain text, 400 for syntax errors)
            return Response(f"Failed to parse the request body as JSON: {exc}", status_code=400,
                            media_type="text/plain; charset=utf-8")
        if not isinstance(body, dict) or "inputs" not in body and "messages" not in body:
            return Response("Failed to deserialize the JSON body into the target type: missing field `inputs`",
                            status_code=422, media_type="text/plain; charset=utf-8")
        return body

    async def generate_stream(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, Response):
            return body
        return server.sse(server.generate_events(body))

    async def generate(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, Response):
            return body
        return await respond_once(body, rft_default=False, wrap=False)

    async def respond_once(body: dict[str, Any], *, rft_default: bool, wrap: bool) -> Response:
        try:
            out = await server.generate_once(body, rft_default)
        except InferError as err:
            return JSONResponse(err.payload, status_code=err.status)
        return Response(_dumps([out] if wrap else out), media_type="application/json",
                        headers={"x-compute-type": "cpu-reproduction"})

    async def compat(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, Response):
            return body
        rft = server.config.default_return_full_text
        if body.get("stream"):
            params = dict(body.get("parameters") or {})
            if params.get("return_full_text") is None:
                params["return_full_text"] = rft
            return server.sse(server.generate_events({**body, "parameters": params}))
        return await respond_once(body, rft_default=rft, wrap=True)

    async def chat(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            # Template errors happen before the stream starts: a plain 422, not an event.
            return JSONResponse({"error": "Template error: template not found: no messages",
                                 "error_type": "template_error"}, status_code=422)
        prompt = " ".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
        params = {"max_new_tokens": body.get("max_tokens"), "temperature": body.get("temperature"),
                  "top_p": body.get("top_p"), "seed": body.get("seed"), "stop": body.get("stop") or []}
        try:
            plan = _plan(prompt, {k: v for k, v in params.items() if v is not None}, stream=bool(body.get("stream")),
                         config=server.config)
        except InferError as err:
            if body.get("stream"):
                async def one_error(err: InferError = err) -> AsyncIterator[bytes]:
                    yield server.frame(_dumps({"error": {"message": err.message, "http_status_code": 422}}))
                    yield server.frame(b"[DONE]")
                return server.sse(one_error())
            return JSONResponse(err.payload, status_code=err.status)
        prompt_tokens = _input_length(prompt)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return server.sse(server.chat_events(plan, include_usage, prompt_tokens))
        try:
            server.admit(streaming=False)
            text, n, finish = "", 0, "stop"
            async for step in _generate(plan, server.state):
                n = step.index
                if not step.token["special"]:
                    text += step.token["text"]
                if step.finish_reason == "length":
                    finish = "length"
        except InferError as err:
            return JSONResponse(err.payload, status_code=err.status)
        return JSONResponse({
            "object": "chat.completion", "id": "", "created": server.config.created, "model": server.config.model_id,
            "system_fingerprint": f"{server.config.version}-native",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n},
        })

    async def info(request: Request) -> Response:
        c = server.config
        return JSONResponse({
            "model_id": c.model_id, "model_sha": None, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": c.max_concurrent_requests, "max_best_of": 2,
            "max_stop_sequences": c.max_stop_sequences, "max_input_tokens": 4095, "max_total_tokens": 4096,
            "validation_workers": 2, "max_client_batch_size": 4, "router": "text-generation-router",
            "version": c.version, "sha": None, "docker_label": None,
        })

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(routes=[
        Route("/generate_stream", generate_stream, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/", compat, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/info", info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])
    app.state.tgi = server.state
    app.state.tgi_config = server.config
    return app


# --------------------------------------------------------------------------------------------- hosting


@contextlib.contextmanager
def run_in_thread(app: Any, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread of its own; yields ``http://host:port``.

    A thread (not the test's loop) so that blocking clients (``text_generation.Client``, ``requests``) and
    async ones can both talk to it.
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="tgi-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def run_http3_in_thread(app_factory: Any, config: Any, *, host: str = "127.0.0.1") -> Iterator[int]:
    """Host ``app_factory()`` on the HTTP/3 front end in a thread with its own event loop; yields the UDP port.

    The app is built inside that loop, so anything it creates (resume stores, locks) belongs to it.
    """
    from eloquent_plugins.transports.http3.server import start_http3_server

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        box["loop"], box["stop"] = asyncio.get_running_loop(), stop
        try:
            server = await start_http3_server(app_factory(), host=host, port=0, config=config)
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            raise
        box["port"] = server.port
        ready.set()
        try:
            await stop.wait()
        finally:
            await server.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="tgi-test-h3", daemon=True)
    thread.start()
    if not ready.wait(20):
        raise RuntimeError("the HTTP/3 front end did not start")
    if "error" in box:
        raise RuntimeError(f"the HTTP/3 front end did not start: {box['error']!r}")
    try:
        yield int(box["port"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
