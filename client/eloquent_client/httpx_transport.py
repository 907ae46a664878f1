"""httpx transports, so code built on httpx (the openai SDK, httpx-sse, most LLM clients) gets Eloquent delivery
unchanged: ``httpx.AsyncClient(transport=AsyncEloquentTransport(verify=False))``, or ``EloquentTransport`` for
``httpx.Client``.

A streaming request (a JSON body with ``"stream": true``, or ``Accept: text/event-stream``) goes through an
``EloquentClient`` for its origin -- HTTP/3 datagrams when UDP answers, else SSE over TCP, resumed across cuts --
and comes back as an ordinary response whose body is the SSE bytes the plain path gives (``id:`` + ``data:``
per event), built from what was delivered, so the caller's own SSE parser reads it. Everything else goes over
HTTP/3 when the path is up, else over plain HTTP (httpx's own transport, byte for byte). Each response carries
``eloquent-delivery: datagram | h3-stream | sse``; status and headers are the server's.

Failures raise the client's errors, made to be httpx's too (``ConnectError`` is also ``httpx.ConnectError``,
``StreamBroken`` also ``httpx.ReadError``), so both ``except ClientError`` and httpx-aware retry logic work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from functools import cache
from typing import Any

import httpx

from eloquent_plugins.core.protocol import DELIVERY_HEADER, TRANSPORT_HEADER

from eloquent_client.attempts import sse_bytes
from eloquent_client.client import EloquentClient, Transport
from eloquent_client.errors import ClientError, ConnectError, HTTPStatusError
from eloquent_client.paths import DEFAULT_UDP_RETRY_AFTER, PathMemory
from eloquent_client.sync import LoopThread

_DROP_REQUEST = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding",
                           "keep-alive", "upgrade"})
_DROP_RESPONSE = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection"})


@cache
def _dual(ours: type[ClientError], theirs: type[httpx.TransportError]) -> type[Exception]:
    return type(ours.__name__, (ours, theirs), {"__module__": __name__})


def as_httpx_error(exc: ClientError, request: httpx.Request) -> Exception:
    """The same error, also an instance of the httpx exception a transport is expected to raise."""
    theirs = httpx.ConnectError if isinstance(exc, ConnectError) else httpx.ReadError
    dual = _dual(type(exc), theirs)
    error = dual.__new__(dual)
    Exception.__init__(error, str(exc))
    error.__dict__.update(exc.__dict__)
    error._request = request  # httpx.RequestError.request reads it
    error.__cause__ = exc.__cause__ or exc
    return error


def is_streaming(request: httpx.Request, body: bytes) -> bool:
    if "text/event-stream" in request.headers.get("accept", ""):
        return True
    if request.method != "POST" or not body or "json" not in request.headers.get("content-type", ""):
        return False
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("stream") is True


class _EventBytes(httpx.AsyncByteStream):
    """The response body: each delivered event as SSE bytes; closing it ends the stream (and its request)."""

    def __init__(self, manager: Any, response: Any, request: httpx.Request) -> None:
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


class AsyncEloquentTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, transport: Transport = "auto", verify: bool | str = True, h3_port: int | None = None,
                 scheme: str | None = None, timeout: float = 30.0, h3_probe_timeout: float = 1.0,
                 stream_idle_timeout: float | None = 3.0, quic_idle_timeout: float = 60.0,
                 udp_retry_after: float = DEFAULT_UDP_RETRY_AFTER, path_memory: PathMemory | None = None,
                 http_transport: httpx.AsyncBaseTransport | None = None) -> None:
        """The options are ``EloquentClient``'s; ``http_transport`` carries what goes over plain HTTP (default:
        ``httpx.AsyncHTTPTransport(verify=verify)``)."""
        self.options: dict[str, Any] = {
            "transport": transport, "verify": verify, "h3_port": h3_port, "scheme": scheme, "timeout": timeout,
            "h3_probe_timeout": h3_probe_timeout, "stream_idle_timeout": stream_idle_timeout,
            "quic_idle_timeout": quic_idle_timeout, "udp_retry_after": udp_retry_after, "path_memory": path_memory}
        EloquentClient("http://127.0.0.1", **self.options)  # validates the options now, not on the first request
        self._plain = http_transport or httpx.AsyncHTTPTransport(verify=verify)
        self._clients: dict[str, EloquentClient] = {}

    def client_for(self, url: httpx.URL) -> EloquentClient:
        origin = f"{url.scheme}://{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        client = self._clients.get(origin)
        if client is None:
            sse = httpx.AsyncClient(transport=self._plain, timeout=httpx.Timeout(self.options["timeout"], read=None))
            client = self._clients[origin] = EloquentClient(origin, http_client=sse, **self.options)
        return client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        client = self.client_for(request.url)
        path = request.url.raw_path.decode("ascii")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        try:
            if is_streaming(request, body):
                return await self._stream(client, request, path, body, headers)
            if client.transport == "sse" or await client._h3_connection(probe=client.transport == "auto") is None:
                response = await self._plain.handle_async_request(request)
                client._learn(response.headers)
                response.headers[DELIVERY_HEADER] = "sse"
                return response
            answer = await client.request(request.method, path, content=body, headers=headers)
        except ClientError as exc:
            raise as_httpx_error(exc, request) from exc
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP_RESPONSE}
        out[DELIVERY_HEADER] = answer.delivery
        return httpx.Response(answer.status, headers=out, content=answer.content, request=request)

    async def _stream(self, client: EloquentClient, request: httpx.Request, path: str, body: bytes,
                      headers: dict[str, str]) -> httpx.Response:
        manager = client.stream(request.method, path, content=body, headers=headers)
        try:
            response = await manager.__aenter__()
        except HTTPStatusError as exc:  # the server's own answer: an ordinary response, as httpx would give it
            out = {k: v for k, v in exc.headers.items() if k.lower() not in _DROP_RESPONSE}
            out[DELIVERY_HEADER] = "sse" if client._h3 is None or client._h3.closed else "h3-stream"
            return httpx.Response(exc.status, headers=out, content=exc.content, request=request)
        out = {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}
        if response.deliveries[0] == "datagram":  # the datagram framing is undone here: the body is SSE again
            out.pop(TRANSPORT_HEADER.decode(), None)
            out["content-type"] = "text/event-stream; charset=utf-8"
        out[DELIVERY_HEADER] = response.deliveries[0]
        return httpx.Response(response.status, headers=out, stream=_EventBytes(manager, response, request),
                              request=request)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
            if client._http is not None:
                await client._http.aclose()
        await self._plain.aclose()


class _SyncEventBytes(httpx.SyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, portal: LoopThread) -> None:
        self._stream = stream
        self._portal = portal

    def __iter__(self) -> Iterator[bytes]:
        return self._portal.iterate(self._stream.__aiter__())

    def close(self) -> None:
        self._portal.run(self._stream.aclose())


class EloquentTransport(httpx.BaseTransport):
    """``AsyncEloquentTransport`` for sync code (``httpx.Client``, ``openai.OpenAI``): the same options; it runs
    on an event loop of its own in a background thread."""

    def __init__(self, **options: Any) -> None:
        self._portal = LoopThread("eloquent-httpx")

        async def build() -> AsyncEloquentTransport:
            return AsyncEloquentTransport(**options)

        try:
            self._inner = self._portal.run(build())
        except BaseException:
            self._portal.close()
            raise

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        copy = httpx.Request(request.method, request.url, headers=request.headers, content=request.read(),
                             extensions=request.extensions)
        response = self._portal.run(self._inner.handle_async_request(copy))
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_SyncEventBytes(stream, self._portal), request=request,
                              extensions=response.extensions)

    def close(self) -> None:
        if self._portal.loop.is_closed():
            return
        try:
            self._portal.run(self._inner.aclose())
        finally:
            self._portal.close()


__all__ = ["AsyncEloquentTransport", "EloquentTransport", "as_httpx_error", "is_streaming"]
