"""The streaming relay the upstream gateways share (TGI's, any OpenAI-compatible server's).

Why one module: a gateway in front of an inference server has the same hard parts whatever the server's schema --
answer a streaming route ``200 text/event-stream`` at once and relay each upstream SSE event as its own message
(so ``EloquentMiddleware`` can keep the line alive, number and store the events), turn what the upstream cannot
report itself (unreachable, a rejection after our 200, a body that ends early) into in-band events, close the
upstream request when the client leaves (that is what frees the engine's slot), and proxy every other route
unchanged: the request target exactly as the client sent it, end-to-end headers only. What differs between
servers -- which requests stream, when a stream is complete, the error shapes -- is a ``Dialect`` and an
``ErrorResponse`` the adapter supplies (``dialect.py``); several upstreams fail over in ``failover.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.transports.asgi import Receive, Scope, Send
from eloquent_plugins.transports.dialect import (Chooser, Dialect, ErrorResponse, dump_json, json_object,
                                                 read_limited)
from eloquent_plugins.transports.failover import UpstreamSet, failover_relay, split_urls

if TYPE_CHECKING:
    from eloquent_plugins.transports.config import StreamConfig

__all__ = ["DEFAULT_UPSTREAM_TIMEOUT", "HOP_BY_HOP", "KEEPALIVE", "DisconnectAwareStream", "UpstreamRelay", "create_gateway_app",
           "end_to_end_headers", "gateway_relay", "request_target", "upstream_base_url"]

KEEPALIVE = b":\n\n"
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"})
"""Never forwarded upstream: RFC 9110's hop-by-hop fields, plus what httpx sets itself (host, length, encoding)."""
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""RFC 9110 9.2.2: methods a proxy may retry after a connection failure; POST and PATCH are not."""


@dataclass(slots=True)
class WriteWatch:
    """httpcore's ``trace`` events of one send: whether a byte of the request can have gone out."""

    traced: bool = False
    writing: bool = False

    async def trace(self, name: str, info: Mapping[str, Any]) -> None:
        self.traced = True
        if name.endswith(".send_request_headers.started"):
            self.writing = True

    @property
    def nothing_sent(self) -> bool:
        """True only when the transport reported its steps (httpcore) and none wrote the request; a transport
        that reports nothing may have sent it all."""
        return self.traced and not self.writing


class DisconnectAwareStream(StreamingResponse):
    """A StreamingResponse that always watches ``receive`` for ``http.disconnect``.

    Starlette only does so for ASGI spec < 2.4 and otherwise relies on ``send`` raising, which uvicorn's does not
    after a disconnect; a silent upstream (queueing, or between keep-alives) would then never notice that the
    client left. Cancelling the body iterator closes the upstream request.
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


def request_target(scope: Scope) -> str:
    """The request target as the client sent it (``raw_path`` and query, percent-escapes untouched).

    A proxy must not change it: decoding and re-encoding the path turns ``a%2Fb`` into ``a/b``, and an empty query
    must not grow a ``?``. Where ``raw_path`` is missing or disagrees with ``path`` (a mounted app), ``path`` is
    escaped instead."""
    path: str = scope["path"]
    raw: bytes | None = scope.get("raw_path")
    target = raw.decode("latin-1") if raw else ""
    if not target or unquote(target) != path:
        target = quote(path, safe="/:@!$&'()*+,;=~")
    query: bytes = scope.get("query_string", b"")
    return f"{target}?{query.decode('latin-1')}" if query else target


def end_to_end_headers(headers: Mapping[str, str] | Any) -> list[tuple[str, str]]:
    """The request headers worth forwarding: without the hop-by-hop ones, nor those ``Connection`` names."""
    items = list(headers.items())
    named = {token.strip().lower() for k, v in items if k.lower() == "connection" for token in v.split(",")}
    return [(k, v) for k, v in items if k.lower() not in HOP_BY_HOP and k.lower() not in named]


def upstream_base_url(url: str, error: type[ConfigError], what: str) -> str:
    """``url`` as a base URL without its trailing slash, or ``error`` for anything but http(s)://host."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise error(f"{what} upstream must be an http:// or https:// URL, got {url!r}")
    return str(parsed).rstrip("/")


@dataclass(slots=True)
class UpstreamRelay:
    """The upstream side of a gateway: one pooled httpx client, the stream relay and the plain proxy."""

    base_url: str
    label: str
    """Names the upstream in error messages ("TGI", "OpenAI")."""
    error_response: ErrorResponse
    max_request_bytes: int
    timeout: httpx.Timeout
    stream_idle_timeout: float | None = None
    transport: httpx.AsyncBaseTransport | None = None
    stream_headers: Mapping[str, str] = field(default_factory=dict)
    upstreams: UpstreamSet | None = None
    """All the upstreams (``base_url`` is the first): with more than one, streams fail over (``failover``)."""
    migrate: bool = True
    """A stream whose upstream dies continues on the next one; and vLLM upstreams are asked for token ids, so
    that another replica or upstream continues the answer exactly (``core.continuation``)."""
    _client: httpx.AsyncClient | None = field(default=None, repr=False)
    _base: httpx.URL | None = field(default=None, repr=False)

    @property
    def client(self) -> httpx.AsyncClient:
        # Created on first use, not at startup: hosts that run the app with ``lifespan="off"`` still work.
        if self._client is None or self._client.is_closed:
            # Idle pooled connections are dropped well before common server keep-alive timeouts (uvicorn 5 s):
            # reusing one the server is closing at that moment fails the request with a ReadError.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=limits, transport=self.transport,
                                             follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # -- request helpers

    async def read_body(self, request: Request) -> bytes | Response:
        """The whole request body, or the 413 answer once it passes ``max_request_bytes``."""
        limit = self.max_request_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return self.error_response(f"request body is larger than {limit} bytes", "validation", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    def upstream_url(self, scope: Scope) -> httpx.URL:
        """The base URL with the client's request target appended as raw bytes (never re-parsed as a URL, so
        ``//other-host/x`` stays a path on the upstream)."""
        if self._base is None:
            self._base = httpx.URL(self.base_url)
        return self._base.copy_with(raw_path=self._base.raw_path.rstrip(b"/") + request_target(scope).encode())

    def forward_headers(self, request: Request) -> list[tuple[str, str]]:
        """What a stream request carries upstream: the client's end-to-end headers, no compression."""
        return [*end_to_end_headers(request.headers), ("accept-encoding", "identity")]

    def target_of(self, request: Request) -> str:
        return request_target(request.scope)

    def build(self, base: str, target: str, headers: list[tuple[str, str]], body: bytes, *,
              stream: bool) -> httpx.Request:
        """A request to the upstream ``base`` for ``target`` (a path as sent, never re-parsed)."""
        url = httpx.URL(base)
        url = url.copy_with(raw_path=url.raw_path.rstrip(b"/") + target.encode())
        timeout = self.timeout
        if stream and self.stream_idle_timeout is not None:
            timeout = httpx.Timeout(connect=timeout.connect, read=self.stream_idle_timeout, write=timeout.write,
                                    pool=timeout.pool)
        return self.client.build_request("POST", url, headers=headers, content=body, timeout=timeout)

    def upstream_request(self, request: Request, body: bytes, *, accept_encoding: str | None,
                         stream: bool = False) -> httpx.Request:
        headers = end_to_end_headers(request.headers)
        headers.append(("accept-encoding", accept_encoding or "identity"))
        timeout = self.timeout
        if stream and self.stream_idle_timeout is not None:
            timeout = httpx.Timeout(connect=timeout.connect, read=self.stream_idle_timeout, write=timeout.write,
                                    pool=timeout.pool)
        return self.client.build_request(request.method, self.upstream_url(request.scope), headers=headers,
                                         content=body, timeout=timeout)

    async def send_fresh_on_stale(self, upstream: httpx.Request) -> httpx.Response:
        """Send; if the connection failed before any response byte, send once more on a new connection -- but only
        when the upstream cannot have started the request: an idempotent method, or a failure before any byte of
        the request was written (httpcore's trace says when writing began). A POST the upstream may have read is
        never sent twice (a second generation): the caller turns the error into a 502 / in-band error. Stale
        pooled connections the server closed while idle are dropped by httpcore before writing, and a short
        ``keepalive_expiry`` keeps them rare."""
        writing = WriteWatch()
        upstream.extensions = {**upstream.extensions, "trace": writing.trace}
        try:
            return await self.client.send(upstream, stream=True)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            if upstream.method not in IDEMPOTENT and not writing.nothing_sent:
                raise
            return await self.client.send(upstream, stream=True)

    # -- the two kinds of answer

    async def stream_route(self, request: Request, choose: Chooser) -> Response:
        """A route that may stream: relay it if ``choose`` says so, else (or for a non-JSON body, which the
        upstream should answer with its own status and body) proxy it unchanged."""
        body = await self.read_body(request)
        if isinstance(body, Response):
            return body
        obj = json_object(body)
        dialect = choose(obj) if obj is not None else None
        if dialect is None:
            return await self.proxy(request, body)
        if (obj is not None and self.migrate and self.upstreams is not None and "return_token_ids" not in obj
                and getattr(dialect, "codec", None) == "openai"
                and await self.upstreams.is_vllm(self.client, self.upstreams.order()[0])):
            # vLLM then sends the prompt's and each chunk's token ids, which a continuation needs to be exact.
            body = dump_json({**obj, "return_token_ids": True})
        return self.stream(request, body, dialect)

    def stream(self, request: Request, body: bytes, dialect: Dialect) -> Response:
        """``200 text/event-stream`` now; the upstream's events follow as they come."""
        if self.upstreams is not None and len(self.upstreams.urls) > 1:
            return DisconnectAwareStream(failover_relay(self, self.upstreams, request, body, dialect),
                                         headers=dict(self.stream_headers))
        upstream = self.upstream_request(request, body, accept_encoding=None, stream=True)
        return DisconnectAwareStream(self.relay(upstream, dialect), headers=dict(self.stream_headers))

    async def relay(self, upstream: httpx.Request, dialect: Dialect) -> AsyncIterator[bytes]:
        """Upstream SSE in, one SSE message per upstream event out, the payload bytes unchanged."""
        space = True
        try:
            response = await self.send_fresh_on_stale(upstream)
        except httpx.HTTPError as exc:
            for payload in dialect.error(f"{self.label} upstream {self.base_url} unreachable: {exc!r}",
                                         "generation", 502):
                yield format_event(payload)
            return
        try:
            if response.status_code != 200:
                for payload in dialect.rejected(response.status_code, await read_limited(response)):
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
                            # Some servers (TGI before 2.1, axum 0.6) write ``data:`` without the space: keep it.
                            space = not (message.raw.startswith(b"data:") and message.raw[5:6] != b" ")
                            first = False
                        payload = message.data.encode()
                        if REPLACEMENT in payload and not utf8(message.raw):  # the parser replaced bad bytes
                            for error in dialect.error(f"{self.label} upstream sent invalid UTF-8 in an event",
                                                       "incomplete_generation", 502):
                                yield format_event(error, space=space)
                            return
                        dialect.observe(payload)
                        event = message.event if message.event != "message" else None
                        yield format_event(payload, event=event, space=space)
                    if parser.comments_seen > comments and not any(m.comments for m in messages):
                        yield KEEPALIVE  # the upstream's own keep-alive, passed on
                    comments = parser.comments_seen
            except httpx.HTTPError as exc:
                for payload in dialect.error(f"{self.label} upstream stream broke: {exc!r}",
                                             "incomplete_generation", 502):
                    yield format_event(payload, space=space)
                return
            for payload in dialect.unfinished():
                yield format_event(payload, space=space)
        finally:
            # Shielded: this runs when the client went away and the relay is being cancelled; the close must
            # still happen, since closing is what tells the upstream to drop the request.
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def proxy(self, request: Request, body: bytes | None = None) -> Response:
        """Any other route: status, headers and body as the upstream sent them (streamed, not buffered)."""
        if body is None:
            read = await self.read_body(request)
            if isinstance(read, Response):
                return read
            body = read
        upstream = self.upstream_request(request, body, accept_encoding=request.headers.get("accept-encoding"))
        try:
            response = await self.send_fresh_on_stale(upstream)
        except httpx.HTTPError as exc:
            return self.error_response(f"{self.label} upstream {self.base_url} unreachable: {exc!r}",
                                       "generation", 502)

        async def body_iter() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()

        out = DisconnectAwareStream(body_iter(), status_code=response.status_code)
        # Raw pairs, so repeated headers (set-cookie, ...) survive; content-length stays, the bytes are the
        # upstream's own.
        drop = HOP_BY_HOP - {"content-length"}
        out.raw_headers = [(k.lower(), v) for k, v in response.headers.raw if k.lower().decode("latin-1") not in drop]
        return out


REPLACEMENT = "\ufffd".encode()
"""U+FFFD: what the SSE parser puts for bytes that are not UTF-8 (or the upstream's own, which is fine)."""


def utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


DEFAULT_UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)
"""Connecting may take 10 s, reading has no limit: a non-streaming request may queue and generate for minutes."""


def gateway_relay(upstream_url: str, label: str, error: type[ConfigError], error_response: ErrorResponse,
                  config: StreamConfig, *, timeout: httpx.Timeout | None, stream_idle_timeout: float | None,
                  transport: httpx.AsyncBaseTransport | None, stream_headers: Mapping[str, str],
                  check_url: Callable[[str], None] | None = None) -> UpstreamRelay:
    """A gateway's relay for ``upstream_url``: one ``http(s)://host:port``, or several comma-separated (a
    failover list, ``failover.py``), each checked by ``check_url`` too; ``error`` for what cannot be used."""
    urls = [upstream_base_url(url, error, label) for url in split_urls(upstream_url)]
    if not urls:
        raise error(f"no upstream URL in {upstream_url!r}")
    for url in urls if check_url is not None else ():
        check_url(url)
    if stream_idle_timeout is not None and stream_idle_timeout <= 0:
        raise error(f"stream_idle_timeout must be > 0 seconds or None, got {stream_idle_timeout}")
    return UpstreamRelay(urls[0], label, error_response, config.max_request_bytes, timeout or DEFAULT_UPSTREAM_TIMEOUT,
                         stream_idle_timeout, transport, stream_headers, UpstreamSet(tuple(urls)), config.migrate)


def create_gateway_app(relay: UpstreamRelay, streams: Sequence[tuple[str, Chooser]]) -> Starlette:
    """POST on each ``streams`` path may stream (its chooser decides); every other request is proxied."""

    def stream(choose: Chooser) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await relay.stream_route(request, choose)

        return endpoint

    async def proxy(request: Request) -> Response:
        return await relay.proxy(request)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await relay.aclose()  # the connection pool

    routes = [Route(path, stream(choose), methods=["POST"]) for path, choose in streams]
    routes.append(Route("/{path:path}", proxy, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]))
    return Starlette(routes=routes, lifespan=lifespan)
