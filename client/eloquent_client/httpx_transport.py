"""httpx transports, so code built on httpx (the openai SDK, httpx-sse, most LLM clients) gets Eloquent delivery
unchanged. One transport serves both generations of httpx: ``httpx`` (0.x, the openai SDK 1.x and 2.x) and
``httpx2`` (the openai SDK 3.x, ``openai.DefaultAsyncHttpxClient``): each class derives from both modules' base
classes, and each request is answered with the module of the request it was given -- whatever the caller's client
is, it gets its own ``Response`` type back.

    openai.AsyncOpenAI(http_client=openai.DefaultAsyncHttpxClient(transport=AsyncEloquentTransport(verify=False)))
    httpx.AsyncClient(transport=AsyncEloquentTransport(verify=False))      # the same class, the older httpx

``EloquentTransport`` is the sync one (``httpx.Client``, ``httpx2.Client``, ``openai.DefaultHttpxClient``).

A streaming request (a JSON body with ``"stream": true``, or ``Accept: text/event-stream``) goes through an
``EloquentClient`` for its origin -- HTTP/3 datagrams when UDP answers, else SSE over TCP, resumed across cuts --
and comes back as an ordinary response whose body is the SSE bytes the plain path gives (``id:`` + ``data:``
per event), built from what was delivered, so the caller's own SSE parser reads it. Everything else goes over
HTTP/3 when the path is up, else over plain HTTP (the module's own transport, byte for byte). Each response
carries ``eloquent-delivery: datagram | h3-stream | sse`` (how it began); status and headers are the server's.

Failures raise the client's errors, made to be both modules' too (``ConnectError`` is also ``httpx.ConnectError``
and ``httpx2.ConnectError``, ``StreamBroken`` also their ``ReadError``), so both ``except ClientError`` and
httpx-aware retry logic (the SDK's ``max_retries``) work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from functools import cache
from types import ModuleType
from typing import Any, overload

import httpx
import httpx2

from eloquent_plugins.core.protocol import DELIVERY_HEADER, TRANSPORT_HEADER

from eloquent_client.attempts import sse_bytes
from eloquent_client.client import EloquentClient, Transport
from eloquent_client.errors import ClientError, ConnectError, HTTPStatusError
from eloquent_client.paths import DEFAULT_UDP_RETRY_AFTER, PathMemory
from eloquent_client.sync import LoopThread

_DROP_REQUEST = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding",
                           "keep-alive", "upgrade"})
_DROP_RESPONSE = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection"})
AnyRequest = httpx.Request | httpx2.Request
AnyResponse = httpx.Response | httpx2.Response


def module_of(request: AnyRequest) -> ModuleType:
    """``httpx2`` for an ``httpx2.Request``, else ``httpx``: the module whose types the answer must have."""
    return httpx2 if isinstance(request, httpx2.Request) else httpx


@cache
def _dual(ours: type[ClientError], connect: bool) -> type[Exception]:
    bases = (httpx.ConnectError, httpx2.ConnectError) if connect else (httpx.ReadError, httpx2.ReadError)
    return type(ours.__name__, (ours, *bases), {"__module__": __name__})


def as_httpx_error(exc: ClientError, request: AnyRequest) -> Exception:
    """The same error, also an instance of the exception an httpx (and an httpx2) transport is expected to
    raise."""
    dual = _dual(type(exc), isinstance(exc, ConnectError))
    error = dual.__new__(dual)
    Exception.__init__(error, str(exc))
    error.__dict__.update(exc.__dict__)
    error._request = request  # RequestError.request reads it
    error.__cause__ = exc.__cause__ or exc
    return error


def is_streaming(request: AnyRequest, body: bytes) -> bool:
    if "text/event-stream" in request.headers.get("accept", ""):
        return True
    if request.method != "POST" or not body or "json" not in request.headers.get("content-type", ""):
        return False
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("stream") is True


class _EventBytes(httpx.AsyncByteStream, httpx2.AsyncByteStream):
    """The response body: each delivered event as SSE bytes; closing it ends the stream (and its request)."""

    def __init__(self, manager: Any, response: Any, request: AnyRequest) -> None:
        self._manager = manager
        self._response = response
        self._request = request
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for event in self._response.events():
                yield sse_bytes(event)
        except ClientError as exc:
            raise as_httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._manager.__aexit__(None, None, None)


class AsyncEloquentTransport(httpx.AsyncBaseTransport, httpx2.AsyncBaseTransport):
    def __init__(self, *, transport: Transport = "auto", verify: bool | str = True, h3_port: int | None = None,
                 scheme: str | None = None, timeout: float = 30.0, h3_probe_timeout: float = 0.1,
                 stream_idle_timeout: float | None = 3.0, quic_idle_timeout: float = 60.0,
                 udp_retry_after: float = DEFAULT_UDP_RETRY_AFTER, path_memory: PathMemory | None = None,
                 http_transport: httpx.AsyncBaseTransport | httpx2.AsyncBaseTransport | None = None) -> None:
        """The options are ``EloquentClient``'s; ``http_transport`` carries what goes over plain HTTP for its own
        module (default: that module's ``AsyncHTTPTransport(verify=verify)``)."""
        self.options: dict[str, Any] = {
            "transport": transport, "verify": verify, "h3_port": h3_port, "scheme": scheme, "timeout": timeout,
            "h3_probe_timeout": h3_probe_timeout, "stream_idle_timeout": stream_idle_timeout,
            "quic_idle_timeout": quic_idle_timeout, "udp_retry_after": udp_retry_after, "path_memory": path_memory}
        EloquentClient("http://127.0.0.1", **self.options)  # validates the options now, not on the first request
        self._plain: dict[ModuleType, Any] = {}
        if http_transport is not None:
            self._plain[httpx2 if isinstance(http_transport, httpx2.AsyncBaseTransport) else httpx] = http_transport
        self._clients: dict[str, EloquentClient] = {}
        self._own_http: list[Any] = []

    def plain(self, hx: ModuleType) -> Any:
        """The plain-HTTP transport of module ``hx`` (the caller's own, or one made on first use)."""
        plain = self._plain.get(hx)
        if plain is None:
            plain = self._plain[hx] = hx.AsyncHTTPTransport(verify=self.options["verify"])
        return plain

    def client_for(self, url: httpx.URL | httpx2.URL, hx: ModuleType = httpx) -> EloquentClient:
        """The client of ``url``'s origin; its SSE path is made of module ``hx`` (the first caller's)."""
        origin = f"{url.scheme}://{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        client = self._clients.get(origin)
        if client is None:
            sse = hx.AsyncClient(transport=self.plain(hx), timeout=hx.Timeout(self.options["timeout"], read=None))
            self._own_http.append(sse)
            client = self._clients[origin] = EloquentClient(origin, http_client=sse, **self.options)
        return client

    @overload
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response: ...

    @overload
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response: ...

    async def handle_async_request(self, request: AnyRequest) -> AnyResponse:
        hx = module_of(request)
        body = await request.aread()
        client = self.client_for(request.url, hx)
        path = request.url.raw_path.decode("ascii")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        try:
            if is_streaming(request, body):
                return await self._stream(hx, client, request, path, body, headers)
            if client.transport == "sse" or await client.h3_if_up() is None:
                try:
                    response: AnyResponse = await self.plain(hx).handle_async_request(request)
                except hx.ConnectError as exc:
                    conn = await client.h3_after_tcp_failed(exc)
                    if conn is None:
                        raise
                else:
                    client._learn(response.headers)
                    response.headers[DELIVERY_HEADER] = "sse"
                    return response
            answer = await client.request(request.method, path, content=body, headers=headers)
        except ClientError as exc:
            raise as_httpx_error(exc, request) from exc
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP_RESPONSE}
        out[DELIVERY_HEADER] = answer.delivery
        result: AnyResponse = hx.Response(answer.status, headers=out, content=answer.content, request=request)
        return result

    async def _stream(self, hx: ModuleType, client: EloquentClient, request: AnyRequest, path: str, body: bytes,
                      headers: dict[str, str]) -> AnyResponse:
        manager = client.stream(request.method, path, content=body, headers=headers)
        try:
            response = await manager.__aenter__()
        except HTTPStatusError as exc:  # the server's own answer: an ordinary response, as httpx would give it
            out = {k: v for k, v in exc.headers.items() if k.lower() not in _DROP_RESPONSE}
            out[DELIVERY_HEADER] = "sse" if client._paths.up_now() is None else "h3-stream"
            error: AnyResponse = hx.Response(exc.status, headers=out, content=exc.content, request=request)
            return error
        out = {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
        if response.deliveries[0] == "datagram":  # the datagram framing is undone here: the body is SSE again
            out.pop(TRANSPORT_HEADER.decode(), None)
            out["content-type"] = "text/event-stream; charset=utf-8"
        out[DELIVERY_HEADER] = response.deliveries[0]
        streamed: AnyResponse = hx.Response(response.status, headers=out, request=request,
                                            stream=_EventBytes(manager, response, request))
        return streamed

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        owned, self._own_http = self._own_http, []
        for http in owned:
            await http.aclose()
        for plain in self._plain.values():
            await plain.aclose()


class _SyncEventBytes(httpx.SyncByteStream, httpx2.SyncByteStream):
    def __init__(self, stream: Any, portal: LoopThread) -> None:
        self._stream = stream
        self._portal = portal

    def __iter__(self) -> Iterator[bytes]:
        return self._portal.iterate(self._stream.__aiter__())

    def close(self) -> None:
        self._portal.run(self._stream.aclose())


class EloquentTransport(httpx.BaseTransport, httpx2.BaseTransport):
    """``AsyncEloquentTransport`` for sync code (``httpx.Client``, ``httpx2.Client``, ``openai.OpenAI``): the
    same options; it runs on an event loop of its own in a background thread."""

    def __init__(self, **options: Any) -> None:
        self._portal = LoopThread("eloquent-httpx")

        async def build() -> AsyncEloquentTransport:
            return AsyncEloquentTransport(**options)

        try:
            self._inner = self._portal.run(build())
        except BaseException:
            self._portal.close()
            raise

    @overload
    def handle_request(self, request: httpx.Request) -> httpx.Response: ...

    @overload
    def handle_request(self, request: httpx2.Request) -> httpx2.Response: ...

    def handle_request(self, request: AnyRequest) -> AnyResponse:
        hx = module_of(request)
        copy = hx.Request(request.method, request.url, headers=request.headers, content=request.read(),
                          extensions=request.extensions)
        response = self._portal.run(self._inner.handle_async_request(copy))
        result: AnyResponse = hx.Response(response.status_code, headers=response.headers, request=request,
                                          stream=_SyncEventBytes(response.stream, self._portal),
                                          extensions=response.extensions)
        return result

    def close(self) -> None:
        if self._portal.loop.is_closed():
            return
        try:
            self._portal.run(self._inner.aclose())
        finally:
            self._portal.close()


__all__ = ["AsyncEloquentTransport", "EloquentTransport", "as_httpx_error", "is_streaming", "module_of"]
