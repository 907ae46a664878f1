"""``EloquentClient``: one API for three ways of taking the same streaming request.

* ``eloquent``: HTTP/3 with ``eloquent-transport: datagram`` -- events come as Eloquent datagrams, acked at
  once, rendered as soon as any packet holding them arrives (``scheme="duplicate"`` asks the front end for
  the packet-duplication baseline instead).
* ``h3-stream``: plain SSE on the HTTP/3 reliable request stream (the retransmission baseline).
* ``sse``: plain SSE over HTTP/1.1 with httpx, resumed automatically by ``stream_sse``.

    async with EloquentClient("https://127.0.0.1:8000", verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            async for event in s.events():
                print(event.text or "", end="")
"""

from __future__ import annotations

import asyncio
import dataclasses
import json as jsonlib
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.h3glue import DATAGRAM, SCHEME_HEADER, TRANSPORT_HEADER

from eloquent_client.events import ClientError, ClientEvent, StreamFailed
from eloquent_client.http3 import H3Stream, Http3ClientConnection
from eloquent_client.pacing import Pacer, Pacing

Transport = Literal["eloquent", "h3-stream", "sse"]
TRANSPORTS = ("eloquent", "h3-stream", "sse")


@dataclasses.dataclass(slots=True)
class Response:
    """A non-streaming response."""

    status: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class ResponseStream:
    """A streaming response; ``events()`` yields each event once as it becomes renderable."""

    def __init__(self, transport: str, status: int, headers: Mapping[str, str],
                 source: AsyncIterator[ClientEvent], pacing: Pacing | None, h3: H3Stream | None = None) -> None:
        self.transport = transport
        self.status = status
        self.headers = dict(headers)
        self.rendered: list[ClientEvent] = []
        self._source = source
        self._pacer = Pacer(pacing) if pacing is not None else None
        self._h3 = h3
        self._consumed = False

    @property
    def request_id(self) -> str | None:
        return self.headers.get("eloquent-request-id")

    @property
    def delivery(self) -> str:
        """How the events actually came: ``eloquent`` (datagrams), ``h3-stream`` or ``sse``."""
        if self._h3 is not None:
            return "eloquent" if self._h3.eloquent else "h3-stream"
        return self.transport

    @property
    def h3(self) -> H3Stream | None:
        return self._h3

    async def events(self) -> AsyncIterator[ClientEvent]:
        if self._consumed:
            raise ClientError("the events of a response can be read only once")
        self._consumed = True
        async for event in self._source:
            if self._pacer is not None:
                at = self._pacer.release_at(event.rendered_at)
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                event = dataclasses.replace(event, rendered_at=max(at, event.rendered_at))
            self.rendered.append(event)
            yield event

    async def text_deltas(self) -> AsyncIterator[str]:
        """The text of OpenAI/TGI chunks as it renders; an in-band error raises ``StreamFailed``."""
        async for event in self.events():
            if event.kind == "error" or event.error is not None:
                raise StreamFailed(f"the server reported an error: {event.data}", event.error)
            text = event.text
            if text:
                yield text

    async def text(self) -> str:
        return "".join([t async for t in self.text_deltas()])


class EloquentClient:
    def __init__(self, base_url: str, *, transport: Transport = "eloquent", scheme: str | None = None,
                 verify: bool | str = True, pacing: Pacing | None = None, h3_port: int | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float = 30.0,
                 limits: Limits | None = None, http_client: Any = None) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if scheme is not None and scheme not in ("eloquent", "duplicate", "stream"):
            raise ConfigError(f"scheme must be eloquent, duplicate or stream, got {scheme!r}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.transport: Transport = transport
        self.scheme = scheme
        self.verify = verify
        self.pacing = pacing
        self.timeout = timeout
        self.limits = limits or Limits()
        self.headers = dict(headers or {})
        self._host = parts.hostname
        self._port = h3_port or parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._h3: Http3ClientConnection | None = None
        self._h3_lock = asyncio.Lock()
        self._http = http_client
        self._own_http = http_client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def connection(self) -> Http3ClientConnection:
        """The HTTP/3 connection, opened on first use and reopened if it closed."""
        async with self._h3_lock:
            if self._h3 is None or self._h3.closed:
                self._h3 = await Http3ClientConnection.connect(self._host, self._port, verify=self.verify,
                                                               timeout=self.timeout, limits=self.limits)
            return self._h3

    def _body(self, json: Any, content: bytes | None, headers: Mapping[str, str] | None) -> tuple[bytes, dict[str, str]]:
        merged = {**self.headers, **(headers or {})}
        if json is not None:
            merged.setdefault("content-type", "application/json")
            return jsonlib.dumps(json).encode(), merged
        return content or b"", merged

    def _h3_headers(self, merged: dict[str, str]) -> list[tuple[str, str]]:
        out = [(k, v) for k, v in merged.items()]
        if self.transport == "eloquent":
            out.append((TRANSPORT_HEADER.decode(), DATAGRAM.decode()))
            out.append((SCHEME_HEADER.decode(), self.scheme or "eloquent"))
        out.append(("accept", "text/event-stream"))
        return out

    @asynccontextmanager
    async def stream(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[ResponseStream]:
        body, merged = self._body(json, content, headers)
        if self.transport == "sse":
            async with self._sse_stream(method, path, body, merged) as response:
                yield response
            return
        conn = await self.connection()
        h3 = await conn.request(method, self._prefix + path, headers=self._h3_headers(merged), body=body,
                                eloquent=self.transport == "eloquent")
        try:
            await h3.wait_headers(self.timeout)
            if h3.status != 200 or h3._mode == "raw":
                detail = (await h3.read()).decode("utf-8", errors="replace")[:500]
                raise ClientError(f"HTTP {h3.status} from {method} {path}: {detail}")
            yield ResponseStream(self.transport, h3.status, h3.headers, h3.events(), self.pacing, h3)
        finally:
            h3.cancel()

    @asynccontextmanager
    async def _sse_stream(self, method: str, path: str, body: bytes,
                          headers: dict[str, str]) -> AsyncIterator[ResponseStream]:
        from eloquent_client.sse import stream_sse  # plain SSE with resume, shipped beside this module

        client = await self._http_client()
        url = self.base_url + path
        payload = jsonlib.loads(body) if body and headers.get("content-type") == "application/json" else None

        async def source() -> AsyncIterator[ClientEvent]:
            index = 0
            messages = stream_sse(client, method, url, json=payload, headers=headers)
            try:
                async for message in messages:
                    yield ClientEvent(index, message.data, time.monotonic(), event=message.event, id=message.id)
                    index += 1
            finally:
                aclose = getattr(messages, "aclose", None)
                if aclose is not None:
                    await aclose()

        yield ResponseStream("sse", 200, {}, source(), self.pacing)

    async def _http_client(self) -> Any:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(verify=self.verify, timeout=httpx.Timeout(self.timeout, read=None))
        return self._http

    async def request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> Response:
        """A non-streaming request over the client's transport (HTTP/3, or HTTP/1.1 for ``sse``)."""
        body, merged = self._body(json, content, headers)
        if self.transport == "sse":
            client = await self._http_client()
            r = await client.request(method, self.base_url + path, content=body, headers=merged)
            return Response(r.status_code, dict(r.headers), r.content)
        conn = await self.connection()
        h3 = await conn.request(method, self._prefix + path, headers=list(merged.items()), body=body)
        try:
            await h3.wait_headers(self.timeout)
            try:
                content_bytes = await asyncio.wait_for(h3.read(), self.timeout)
            except TimeoutError:
                raise ClientError(f"{method} {path}: no complete response within {self.timeout} s") from None
        finally:
            h3.cancel()
        return Response(h3.status or 0, h3.headers, content_bytes)

    async def aclose(self) -> None:
        if self._h3 is not None:
            await self._h3.close()
            self._h3 = None
        if self._http is not None and self._own_http:
            await self._http.aclose()
            self._http = None
