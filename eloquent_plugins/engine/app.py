"""The OpenAI-compatible Starlette app around an ``Engine``.

Streaming uses a ``StreamingResponse`` over an async generator, so Starlette's disconnect listener cancels the
generator and the engine counts an abort -- the behaviour vLLM has and that the transport layers rely on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eloquent_plugins.core.codecs.openai import openai_error
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.engine.core import Engine
from eloquent_plugins.engine.errors import APIError, EngineError
from eloquent_plugins.engine.render import DONE, ChunkWriter, dumps, full_response, utf8
from eloquent_plugins.engine.requests import GenerationRequest, parse_request


class _Admission:
    """Counts admitted requests so that more than ``limit`` concurrent ones get a 503 instead of queueing."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def acquire(self) -> None:
        if self.active >= self.limit:
            raise APIError(
                503,
                f"server is at its concurrency limit ({self.limit} requests)",
                type="server_overloaded",
                code="server_overloaded",
            )
        self.active += 1

    def release(self) -> None:
        self.active -= 1


class _EngineStream(StreamingResponse):
    """A StreamingResponse that always closes its generator and releases its admission slot.

    Starlette leaves a cancelled body iterator to the garbage collector; closing it here makes the engine's
    abort accounting happen before the response coroutine returns.
    """

    def __init__(self, body: AsyncIterator[bytes], admission: _Admission) -> None:
        super().__init__(body, media_type="text/event-stream")
        self._gen = body
        self._admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._admission.release()
            aclose = getattr(self._gen, "aclose", None)
            if aclose is not None:
                await aclose()


def _json(obj: Any, status: int = 200) -> Response:
    return Response(utf8(dumps(obj)), status_code=status, media_type="application/json")


def _error(exc: APIError) -> Response:
    return _json(exc.body(), exc.status)


async def _read_json(request: Request, limit: int) -> Any:
    """Read at most ``limit`` bytes (trusting neither Content-Length nor its absence) and decode JSON."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):  # isdigit alone accepts "²"
            raise APIError(400, "invalid Content-Length header", code="invalid_request_body")
        if len(declared) > 18 or int(declared) > limit:
            raise APIError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise APIError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def create_engine_app(config: EngineConfig | None = None, engine: Engine | None = None) -> Starlette:
    """Build the app; ``app.state.engine`` is the engine (tests read its counters)."""
    if engine is None:
        engine = Engine(config)
    elif config is not None and config != engine.config:
        raise ConfigError("pass either a config or an engine built with it, not two different configs")
    cfg = engine.config
    admission = _Admission(cfg.max_concurrency)

    async def stream_body(req: GenerationRequest, writer: ChunkWriter) -> AsyncIterator[bytes]:
        gen = engine.generate(
            req.prompt, max_tokens=req.max_tokens, seed=req.seed, controls=req.controls, stop=req.stop,
            prefix=req.prefix)
        async with contextlib.aclosing(gen):
            first = req.chat
            finish, count = "length", 0
            try:
                async for tok in gen:
                    if first:
                        first = False
                        yield writer.role()
                    if tok.text:
                        yield writer.token(tok.text)
                    if tok.finish_reason is not None:
                        finish, count = tok.finish_reason, tok.index + 1
            except EngineError as exc:
                if cfg.raise_errors:
                    raise
                yield writer.error(str(exc), "EngineError", 500)
                yield DONE
                return
        yield writer.finish(finish)
        if req.include_usage:
            # A continuation's prompt holds the answer's first tokens, as a real engine counts them.
            skip = engine.continued(req.prompt, req.prefix, req.seed)[1] if req.prefix else 0
            yield writer.usage(req.prompt_tokens + skip, count)
        yield DONE

    async def collect(req: GenerationRequest) -> tuple[str, str, int]:
        gen = engine.generate(
            req.prompt, max_tokens=req.max_tokens, seed=req.seed, controls=req.controls, stop=req.stop,
            prefix=req.prefix)
        parts: list[str] = []
        finish, count = "length", 0
        async with contextlib.aclosing(gen):
            async for tok in gen:
                parts.append(tok.text)
                if tok.finish_reason is not None:
                    finish, count = tok.finish_reason, tok.index + 1
        return "".join(parts), finish, count

    async def complete(req: GenerationRequest, request: Request, request_id: str, created: int) -> Response:
        """Non-streaming: generate everything, but abort if the client goes away meanwhile."""
        work = asyncio.ensure_future(collect(req))
        watch = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        if work.cancelled():
            return Response(status_code=499)  # nobody is listening any more
        try:
            text, finish, count = work.result()
        except EngineError as exc:
            return _json(openai_error(str(exc), error_type="EngineError", code=500), 500)
        return _json(
            full_response(
                chat=req.chat,
                request_id=request_id,
                created=created,
                model=cfg.model,
                text=text,
                finish_reason=finish,
                prompt_tokens=req.prompt_tokens,
                completion_tokens=count,
            )
        )

    async def handle(request: Request, chat: bool) -> Response:
        try:
            body = await _read_json(request, cfg.max_body_bytes)
            req = parse_request(body, chat=chat, config=cfg)
            admission.acquire()
        except APIError as exc:
            return _error(exc)
        except ClientDisconnect:
            return Response(status_code=499)
        request_id = ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()
        created = int(time.time())
        if req.stream:
            writer = ChunkWriter(
                chat=chat, request_id=request_id, created=created, model=cfg.model, include_usage=req.include_usage,
                include_obfuscation=req.include_obfuscation,
            )
            return _EngineStream(stream_body(req, writer), admission)
        try:
            return await complete(req, request, request_id, created)
        finally:
            admission.release()

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def models(request: Request) -> Response:
        return _json(
            {"object": "list", "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "eloquent"}]}
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def stats(request: Request) -> Response:
        s = engine.stats()
        return _json({"running": s.running, "completed": s.completed, "aborted": s.aborted, "failed": s.failed})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
        return _json(openai_error(str(exc.detail), error_type="invalid_request_error", code=code), exc.status_code)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/engine/stats", stats, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.engine = engine
    app.state.engine_config = cfg
    return app
