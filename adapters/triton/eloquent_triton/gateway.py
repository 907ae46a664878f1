"""A thin ASGI gateway in front of Triton's generate extension.

``POST /v2/models/{model}[/versions/{version}]/generate_stream`` answers with headers at once (Triton
itself holds them back until the model's first response, which is what kills silent streams behind
proxies) and then relays Triton's events unchanged in meaning: ``data: {"id"?, "model_name",
"model_version", <outputs>}``, or ``data: {"error": "..."}`` as the last event. The upstream is Triton
over HTTP (``http://host:port``) or gRPC (``grpc://host:port``); both give the same bytes.

What is checked before the headers go out, and so gets a real status with ``{"error": "..."}``:
a body that is not a JSON object (400), a body that does not fit the model's inputs (400), a model
Triton does not serve (404), an unreachable upstream (502). Everything the model does after that,
including failing before its first token, arrives in-band under 200.

``POST .../generate`` (one response) is answered with one JSON body and Triton's status.

A client that disconnects cancels the upstream request. Keep-alive, event ids, resume and the
Eloquent transport are the job of ``eloquent_plugins``' middleware, which wraps this app.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eloquent_plugins.core.codecs.triton import triton_error
from eloquent_plugins.core.errors import ConfigError

from eloquent_triton.errors import TritonGatewayError, UpstreamError
from eloquent_triton.payload import JSON_MEDIA_TYPE, SSE_MEDIA_TYPE, encode_event, encode_json
from eloquent_triton.tensors import build_request

PayloadStream = AsyncGenerator[dict[str, Any], None]


@dataclass(frozen=True)
class GatewaySettings:
    """Knobs of :func:`create_triton_gateway`."""

    connect_timeout_s: float = 10.0
    """Limit on connecting to Triton and on the model lookup (never on the stream itself)."""
    model_cache_ttl_s: float = 30.0
    """How long a successful model lookup is trusted."""
    max_request_bytes: int = 1 << 20
    """Larger request bodies get 413."""


class _Backend:
    """Hides how each upstream kind opens a stream, so the routes are the same for both."""

    def __init__(self, url: str, settings: GatewaySettings) -> None:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            from eloquent_triton.http_upstream import HttpUpstream

            self.kind = "http"
            self.upstream: Any = HttpUpstream(
                url, connect_timeout_s=settings.connect_timeout_s, model_cache_ttl_s=settings.model_cache_ttl_s
            )
        elif parts.scheme == "grpc":
            from eloquent_triton.grpc_upstream import GrpcUpstream

            if not parts.hostname or not parts.port:
                raise ConfigError(f"Triton gRPC upstream needs grpc://host:port, got {url!r}")
            self.kind = "grpc"
            self.upstream = GrpcUpstream(
                f"{parts.hostname}:{parts.port}",
                connect_timeout_s=settings.connect_timeout_s,
                model_cache_ttl_s=settings.model_cache_ttl_s,
            )
        else:
            raise ConfigError(f"Triton upstream must be http://host:port or grpc://host:port, got {url!r}")

    async def _prepare(self, model: str, version: str, body: dict[str, Any]) -> Any:
        """Look the model up and map the body onto its inputs: 404/400 here, before any header."""
        config = await self.upstream.model_config(model, version)
        return None if config is None else build_request(config, model, version, body)

    async def open_stream(self, model: str, version: str, body: dict[str, Any], raw: bytes) -> PayloadStream:
        request = await self._prepare(model, version, body)
        if self.kind == "http":
            return self.upstream.stream(model, version, raw)  # Triton maps the JSON itself
        return self.upstream.stream(request)

    async def generate(self, model: str, version: str, body: dict[str, Any], raw: bytes) -> Response:
        request = await self._prepare(model, version, body)
        if self.kind == "http":
            status, content, media_type = await self.upstream.generate(model, version, raw)
            return Response(content, status_code=status, media_type=media_type)
        status, payload = await self.upstream.generate(request)
        return Response(encode_json(payload), status_code=status, media_type=JSON_MEDIA_TYPE)


def _error_response(status: int, message: str) -> Response:
    return Response(encode_json(triton_error(message)), status_code=status, media_type=JSON_MEDIA_TYPE)


async def _read_body(request: Request, limit: int) -> tuple[dict[str, Any], bytes]:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise TritonGatewayError(413, f"request body larger than {limit} bytes")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise TritonGatewayError(400, f"failed to parse the request JSON buffer: {exc}") from exc
    if not isinstance(body, dict):
        raise TritonGatewayError(400, "the request body must be a JSON object")
    return body, bytes(raw)


class TritonEventStream:
    """ASGI response: headers now, then one SSE event per upstream payload.

    It always watches ``receive()`` for ``http.disconnect`` (whatever ASGI spec version the server
    claims; uvicorn's ``send`` is a silent no-op after a disconnect), because closing the payload
    stream is what cancels the upstream request.
    """

    def __init__(self, payloads: PayloadStream) -> None:
        self.payloads = payloads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", SSE_MEDIA_TYPE.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async with anyio.create_task_group() as group:

            async def pump() -> None:
                try:
                    await self._pump(send)
                finally:
                    group.cancel_scope.cancel()

            group.start_soon(pump)
            await self._wait_disconnect(receive)
            group.cancel_scope.cancel()

    async def _pump(self, send: Send) -> None:
        try:
            try:
                async for payload in self.payloads:
                    await send({"type": "http.response.body", "body": encode_event(payload), "more_body": True})
            except Exception as exc:  # upstream broke mid-stream: tell the client in Triton's way
                message = str(exc) if isinstance(exc, UpstreamError) else f"Triton gateway: {exc!r}"
                event = encode_event(triton_error(message))
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client is gone (ASGI 2.4 servers raise here); the finally below cancels upstream
        finally:
            with anyio.CancelScope(shield=True):
                await self.payloads.aclose()

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return


def _route_params(request: Request) -> tuple[str, str]:
    return request.path_params["model"], request.path_params.get("version", "")


def create_triton_gateway(upstream_url: str, settings: GatewaySettings | None = None, **overrides: Any) -> Starlette:
    """Build the gateway app for one Triton (``http://host:port`` or ``grpc://host:port``).

    ``overrides`` are :class:`GatewaySettings` fields, for convenience.
    """
    settings = settings or GatewaySettings()
    if overrides:
        settings = GatewaySettings(**{**asdict(settings), **overrides})
    backend = _Backend(upstream_url, settings)

    def guarded(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        async def endpoint(request: Request) -> Any:
            try:
                return await handler(request)
            except TritonGatewayError as exc:
                return _error_response(exc.status, exc.message)

        return endpoint

    async def generate_stream(request: Request) -> Any:
        model, version = _route_params(request)
        body, raw = await _read_body(request, settings.max_request_bytes)
        return TritonEventStream(await backend.open_stream(model, version, body, raw))

    async def generate(request: Request) -> Response:
        model, version = _route_params(request)
        body, raw = await _read_body(request, settings.max_request_bytes)
        return await backend.generate(model, version, body, raw)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await backend.upstream.aclose()

    routes = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes.append(Route(prefix + "/generate_stream", guarded(generate_stream), methods=["POST"]))
        routes.append(Route(prefix + "/generate", guarded(generate), methods=["POST"]))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.triton_upstream_kind = backend.kind
    return app
