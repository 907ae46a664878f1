"""A gateway that serves TGI's HTTP API and relays a TGI server, one upstream event per SSE message.

Why a gateway and not a patch: TGI is a Rust router with no plugin hooks, so the only place to add keep-alive,
event ids, resume and the HTTP/3 transport is a process in front of it. This module only translates: streaming
routes (``/generate_stream``, ``/`` with ``"stream": true``, ``/v1/chat/completions`` and ``/v1/completions`` with
``"stream": true``) answer ``200 text/event-stream`` at once and forward each upstream event's payload byte for
byte, framed the way the upstream framed it (``data:`` with or without the space); every other route
(``/generate``, ``/info``, ``/health``, ``/tokenize``, ``/metrics``, ...) is proxied unchanged. Wrap the app in
``EloquentMiddleware`` for the stream improvements.

Failures the upstream cannot report itself (unreachable, a rejected request after our 200 went out, a body that
ends early) become in-band error events in TGI's own shapes: ``{"error", "error_type"}`` on the generate routes
(what the ``text-generation`` client turns into its typed exceptions) and ``{"error": {"message",
"http_status_code"}}`` followed by ``[DONE]`` on the OpenAI routes. A client that goes away cancels the relay,
which closes the upstream request, so TGI frees the batch slot.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.sse_reader import SSEParser

__all__ = ["TGIGatewayError", "create_tgi_gateway"]

DONE = b"[DONE]"
KEEPALIVE = b":\n\n"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
"""TGI's stream headers (no charset on the content type, as axum writes it); ``x-accel-buffering`` for nginx."""
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"})
_MAX_ERROR_BODY = 64 * 1024


class TGIGatewayError(ConfigError):
    """The gateway was configured with something it cannot use (e.g. a non-HTTP upstream URL)."""


# --------------------------------------------------------------------------------------------- dialects


@dataclass(slots=True)
class _GenerateDialect:
    """``/generate_stream`` and ``/``: the stream is complete once an event carries ``generated_text``."""

    last: bytes = b""

    def observe(self, payload: bytes) -> None:
        self.last = payload

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        del status  # TGI's stream errors carry no status: they all arrive under the 200
        return [_dump({"error": message, "error_type": error_type})]

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        obj = _json_object(body)
        if obj is not None and "error" in obj and "error_type" in obj:
            return [body.strip()]  # already TGI's error shape: forward it unchanged
        message = _error_text(obj, body) or f"upstream answered HTTP {status}"
        return self.error(message, "validation" if status in (400, 413, 415, 422) else "generation", status)

    def unfinished(self) -> list[bytes]:
        obj = _json_object(self.last)
        if obj is not None and ("error" in obj or obj.get("generated_text") is not None):
            return []
        # TGI's own text for a backend stream that stops without its End message; the type is the one the
        # text-generation client maps to IncompleteGenerationError.
        return self.error("Incomplete generation stream", "incomplete_generation", 500)


@dataclass(slots=True)
class _OpenAIDialect:
    """``/v1/chat/completions`` and ``/v1/completions``: the stream is complete at ``[DONE]``."""

    done: bool = False

    def observe(self, payload: bytes) -> None:
        if payload.strip() == DONE:
            self.done = True

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        del error_type  # TGI's OpenAI error events carry a status code, not a type
        self.done = True
        return [_dump({"error": {"message": message, "http_status_code": status}}), DONE]

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        obj = _json_object(body)
        return self.error(_error_text(obj, body) or f"upstream answered HTTP {status}", "", status)

    def unfinished(self) -> list[bytes]:
        return [] if self.done else self.error("Incomplete generation stream", "incomplete_generation", 500)


_Dialect = _GenerateDialect | _OpenAIDialect


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _error_text(obj: dict[str, Any] | None, body: bytes) -> str:
    if obj is not None:
        err = obj.get("error")
        if isinstance(err, dict):
            err = err.get("message")
        if err is not None:
            return str(err)
    return body.decode("utf-8", errors="replace").strip()


# --------------------------------------------------------------------------------------------- responses


class _EventStream(StreamingResponse):
    """A StreamingResponse that always watches ``receive`` for ``http.disconnect``.

    Starlette only does so for ASGI spec < 2.4 and otherwise relies on ``send`` raising, which uvicorn's does not
    after a disconnect; a silent upstream (TGI queueing, 15 s between keep-alives) would then never notice that
    the client left. Cancelling the body iterator closes the upstream request.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                await self.stream_response(send)
                tg.cancel_scope.cancel()

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            tg.start_soon(watch)


# --------------------------------------------------------------------------------------------- gateway


@dataclass(slots=True)
class _Gateway:
    base_url: str
    config: StreamConfig
    timeout: httpx.Timeout
    stream_idle_timeout: float | None = 60.0
    transport: httpx.AsyncBaseTransport | None = None
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    @property
    def client(self) -> httpx.AsyncClient:
        # Created on first use, not at startup: hosts that run the app with ``lifespan="off"`` still work.
        if self._client is None or self._client.is_closed:
            # Idle pooled connections are dropped well before common server keep-alive timeouts (uvicorn 5 s):
            # reusing one the server is closing at that moment fails the request with a ReadError.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, limits=limits,
                                             transport=self.transport, follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # -- request helpers

    async def read_body(self, request: Request) -> bytes | Response:
        limit = self.config.max_request_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return JSONResponse({"error": f"request body is larger than {limit} bytes",
                                     "error_type": "validation"}, status_code=413)
            chunks.append(chunk)
        return b"".join(chunks)

    def upstream_request(self, request: Request, body: bytes, *, accept_encoding: str | None,
                         stream: bool = False) -> httpx.Request:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        headers.append(("accept-encoding", accept_encoding or "identity"))
        url = httpx.URL(path=request.url.path, query=request.url.query.encode())
        timeout = self.timeout
        if stream and self.stream_idle_timeout is not None:
            # TGI writes at least a keep-alive every 15 s on a live stream; this much silence means it is gone.
            timeout = httpx.Timeout(connect=timeout.connect, read=self.stream_idle_timeout, write=timeout.write,
                                    pool=timeout.pool)
        return self.client.build_request(request.method, url, headers=headers, content=body, timeout=timeout)

    # -- routes

    async def stream_route(self, request: Request, dialect_for: Callable[[dict[str, Any]], _Dialect | None]
                           ) -> Response:
        body = await self.read_body(request)
        if isinstance(body, Response):
            return body
        obj = _json_object(body)
        dialect = dialect_for(obj) if obj is not None else None
        if dialect is None:
            # Not a stream request (or not JSON: let TGI answer it with its own status and body).
            return await self.proxy(request, body)
        upstream = self.upstream_request(request, body, accept_encoding=None, stream=True)
        return _EventStream(self.relay(upstream, dialect), headers=SSE_HEADERS)

    async def _send_fresh_on_stale(self, upstream: httpx.Request) -> httpx.Response:
        """Send; if the connection failed before any response byte, send once more on a new connection. The
        common cause is a pooled connection the server closed while idle, which never saw the request."""
        try:
            return await self.client.send(upstream, stream=True)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            return await self.client.send(upstream, stream=True)

    async def relay(self, upstream: httpx.Request, dialect: _Dialect) -> AsyncIterator[bytes]:
        """Upstream SSE in, one SSE message per upstream event out, the payload bytes unchanged."""
        space = True
        try:
            response = await self._send_fresh_on_stale(upstream)
        except httpx.HTTPError as exc:
            for payload in dialect.error(f"TGI upstream {self.base_url} unreachable: {exc!r}", "generation", 502):
                yield format_event(payload)
            return
        try:
            if response.status_code != 200:
                body = await _read_limited(response)
                for payload in dialect.rejected(response.status_code, body):
                    yield format_event(payload)
                return
            parser = SSEParser()
            comments = 0
            first = True
            try:
                async for chunk in response.aiter_bytes():
                    messages = parser.feed(chunk)
                    for message in messages:
                        if first:
                            # TGI before 2.1 (axum 0.6) writes ``data:`` without the space; keep its framing.
                            space = not (message.raw.startswith(b"data:") and message.raw[5:6] != b" ")
                            first = False
                        payload = message.data.encode()
                        dialect.observe(payload)
                        yield format_event(payload, space=space)
                    if parser.comments_seen > comments and not any(m.comments for m in messages):
                        yield KEEPALIVE  # TGI's own keep-alive, passed on
                    comments = parser.comments_seen
            except httpx.HTTPError as exc:
                for payload in dialect.error(f"TGI upstream stream broke: {exc!r}", "incomplete_generation", 502):
                    yield format_event(payload, space=space)
                return
            for payload in dialect.unfinished():
                yield format_event(payload, space=space)
        finally:
            # Shielded: this runs when the client went away and the relay is being cancelled; the close must
            # still happen, since closing is what tells TGI to drop the request.
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def proxy(self, request: Request, body: bytes | None = None) -> Response:
        """Any other route: status, headers and body as TGI sent them (streamed, not buffered)."""
        if body is None:
            read = await self.read_body(request)
            if isinstance(read, Response):
                return read
            body = read
        upstream = self.upstream_request(request, body, accept_encoding=request.headers.get("accept-encoding"))
        try:
            response = await self._send_fresh_on_stale(upstream)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": f"TGI upstream {self.base_url} unreachable: {exc!r}",
                                 "error_type": "generation"}, status_code=502)
        async def body_iter() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()

        out = _EventStream(body_iter(), status_code=response.status_code)
        # Raw pairs, so repeated headers (set-cookie, ...) survive; content-length stays, the bytes are TGI's own.
        out.raw_headers = [(k.lower(), v) for k, v in response.headers.raw
                           if k.lower().decode("latin-1") not in _HOP_BY_HOP - {"content-length"}]
        return out


async def _read_limited(response: httpx.Response) -> bytes:
    out = bytearray()
    async for chunk in response.aiter_bytes():
        out += chunk
        if len(out) >= _MAX_ERROR_BODY:
            break
    return bytes(out[:_MAX_ERROR_BODY])


def _generate_stream(obj: dict[str, Any]) -> _Dialect | None:
    return _GenerateDialect()


def _compat(obj: dict[str, Any]) -> _Dialect | None:
    return _GenerateDialect() if obj.get("stream") is True else None


def _openai(obj: dict[str, Any]) -> _Dialect | None:
    return _OpenAIDialect() if obj.get("stream") is True else None


def create_tgi_gateway(upstream_url: str, config: StreamConfig | None = None, *,
                       timeout: httpx.Timeout | None = None, stream_idle_timeout: float | None = 60.0,
                       transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The TGI-compatible gateway app for the TGI server at ``upstream_url`` (``http://host:port``).

    ``timeout`` is for the upstream: by default connecting may take 10 s and reading has no limit, because a
    non-streaming TGI request may queue and generate for minutes. A stream that stays silent for
    ``stream_idle_timeout`` seconds (TGI sends a keep-alive every 15 s) is ended with an ``incomplete_generation``
    event; None waits forever. ``transport`` lets tests and embedders route the upstream traffic.
    """
    url = httpx.URL(upstream_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise TGIGatewayError(f"TGI upstream must be an http:// or https:// URL, got {upstream_url!r}")
    if stream_idle_timeout is not None and stream_idle_timeout <= 0:
        raise TGIGatewayError(f"stream_idle_timeout must be > 0 seconds or None, got {stream_idle_timeout}")
    gateway = _Gateway(str(url).rstrip("/"), config or StreamConfig(),
                       timeout or httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None),
                       stream_idle_timeout, transport)

    def stream(choose: Callable[[dict[str, Any]], _Dialect | None]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await gateway.stream_route(request, choose)

        return endpoint

    async def proxy(request: Request) -> Response:
        return await gateway.proxy(request)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await gateway.aclose()

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [
        Route("/generate_stream", stream(_generate_stream), methods=["POST"]),
        Route("/", stream(_compat), methods=["POST"]),
        Route("/v1/chat/completions", stream(_openai), methods=["POST"]),
        Route("/v1/completions", stream(_openai), methods=["POST"]),
        Route("/generate", proxy, methods=["POST"]),
        Route("/info", proxy, methods=["GET"]),
        Route("/health", proxy, methods=["GET"]),
        Route("/{path:path}", proxy, methods=methods),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.tgi_upstream = gateway.base_url
    return app
