"""One try at a streaming response over one path: the response head (the server's real status and headers),
then the events, each with its index in the whole stream -- so that tries over different paths (HTTP/3
datagrams, the HTTP/3 stream, SSE over TCP) join into one stream, each event once.

The index of an event is its id's (``<token>:<index>``, given by ``EloquentMiddleware``) when it has one, else the
try's ``offset`` plus its position: a datagram stream resumed after event k is replayed from k + 1, renumbered from
0 by the front end.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import httpx2

from eloquent_plugins.core.errors import LimitExceeded
from eloquent_plugins.core.protocol import BadEventId, parse_event_id
from eloquent_plugins.core.sse_reader import SSEParser

from eloquent_client.bounds import MAX_ERROR_BODY, client_error, read_capped
from eloquent_client.errors import (
    ClientError,
    ConnectError,
    HTTPStatusError,
    ResumeRefused,
    StreamBroken,
    decode_body,
)
from eloquent_client.events import ClientEvent
from eloquent_client.h3stream import BodyKind, H3Stream
from eloquent_client.http3 import Http3ClientConnection


CONNECT_ERRORS = (httpx.ConnectError, httpx2.ConnectError)
TRANSPORT_ERRORS = (httpx.TransportError, httpx2.TransportError)
"""What the SSE path's HTTP client raises, of either httpx module (the httpx transports give the client theirs)."""


def event_index(event_id: str | None, fallback: int) -> int:
    if event_id:
        try:
            point = parse_event_id(event_id)
        except BadEventId:
            return fallback
        if point.after >= 0:
            return point.after
    return fallback


def status_error(status: int, raw: bytes, headers: Mapping[str, str], what: str,
                 resuming: bool) -> HTTPStatusError:
    body = decode_body(raw)
    error: HTTPStatusError
    if resuming:
        error = ResumeRefused(status, body, f"resume of {what} refused with HTTP {status}: {body}", headers)
    else:
        error = HTTPStatusError(status, body, f"HTTP {status} from {what}: {str(body)[:500]}", headers)
    error.content = raw
    return error


class Attempt(ABC):
    """A response head and its events; ``delivery`` is ``datagram``, ``h3-stream`` or ``sse``."""

    delivery: str
    status: int
    headers: dict[str, str]
    offset: int = 0

    @abstractmethod
    def events(self) -> AsyncIterator[tuple[int, ClientEvent]]:
        """``(index, event)`` from ``offset`` on."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop reading and release the request."""


class H3Attempt(Attempt):
    def __init__(self, h3: H3Stream, offset: int) -> None:
        self.h3 = h3
        self.offset = offset
        self.status = h3.status or 0
        self.headers = dict(h3.headers)
        self.delivery = "datagram" if h3.eloquent else "h3-stream"

    async def events(self) -> AsyncIterator[tuple[int, ClientEvent]]:
        async for event in self.h3.events():
            yield event_index(event.id, self.offset + event.index), event

    async def aclose(self) -> None:
        self.h3.cancel()


async def open_h3(conn: Http3ClientConnection, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                  *, eloquent: bool, timeout: float, offset: int = 0,
                  resuming: bool = False) -> H3Attempt | None:
    """Send the request and wait for its head. None: a resume the server answered 204 (the stream is over)."""
    h3 = await conn.request(method, path, headers=headers, body=body, eloquent=eloquent)
    try:
        await h3.wait_headers(timeout)
        if h3.status != 200 or h3.body_kind is BodyKind.RAW:
            import asyncio

            try:
                raw = await asyncio.wait_for(h3.read(MAX_ERROR_BODY), timeout)
            except TimeoutError:
                raw = b""
            if resuming and h3.status == 204:
                h3.cancel()
                return None
            raise status_error(h3.status or 0, raw, h3.headers, f"{method} {path}", resuming)
    except BaseException:
        h3.cancel()
        raise
    return H3Attempt(h3, offset)


class SseAttempt(Attempt):
    delivery = "sse"

    def __init__(self, response: httpx.Response | httpx2.Response, offset: int) -> None:
        self.response = response
        self.offset = offset
        self.status = response.status_code
        self.headers = dict(response.headers)

    async def events(self) -> AsyncIterator[tuple[int, ClientEvent]]:
        parser = SSEParser()
        position = 0
        try:
            async for chunk in self.response.aiter_bytes():
                now = time.monotonic()
                for message in parser.feed(chunk):
                    index = event_index(message.id, self.offset + position)
                    position += 1
                    yield index, ClientEvent(index, message.data, now, event=message.event, id=message.id)
        except TRANSPORT_ERRORS as exc:
            raise StreamBroken(f"the SSE connection broke: {type(exc).__name__}: {exc}") from exc
        except LimitExceeded as exc:  # the parser's ceiling (an SSE message over 4 MiB): a ClientError
            raise client_error(exc) from exc

    async def aclose(self) -> None:
        await self.response.aclose()


async def open_sse(http: Any, method: str, url: str, headers: Mapping[str, str], body: bytes, *, offset: int = 0,
                   resuming: bool = False) -> SseAttempt | None:
    """``http``: an ``httpx.AsyncClient`` or an ``httpx2.AsyncClient``."""
    request = http.build_request(method, url, content=body, headers={"accept": "text/event-stream",
                                                                     "cache-control": "no-store", **headers})
    try:
        response = await http.send(request, stream=True)
    except CONNECT_ERRORS as exc:
        raise ConnectError(f"cannot connect to {request.url.host}:{request.url.port}: {exc}") from exc
    except TRANSPORT_ERRORS as exc:
        raise StreamBroken(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    try:
        if resuming and response.status_code == 204:
            await response.aclose()
            return None
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if response.status_code != 200 or content_type != "text/event-stream":
            raw = await read_capped(response)  # an endless error body is cut at MAX_ERROR_BODY
            raise status_error(response.status_code, raw, response.headers, f"{method} {url}", resuming)
    except TRANSPORT_ERRORS as exc:
        await response.aclose()
        raise StreamBroken(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        await response.aclose()
        raise
    return SseAttempt(response, offset)


def sse_bytes(event: ClientEvent) -> bytes:
    """One event as the plain SSE path writes it (``id:`` when it has one, ``event:`` when not a message)."""
    lines: list[str] = []
    if event.id is not None:
        lines.append(f"id: {event.id}")
    if event.event and event.event != "message":
        lines.append(f"event: {event.event}")
    lines.extend(f"data: {line}" for line in event.data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


__all__ = ["CONNECT_ERRORS", "TRANSPORT_ERRORS", "Attempt", "ClientError", "H3Attempt", "SseAttempt", "event_index", "open_h3", "open_sse", "sse_bytes"]
