"""One HTTP/3 request's response on the client: fed by the connection's protocol callbacks (headers, body,
datagrams, resets), read by the application as events or bytes.

Everything is decoded in the callbacks, so an event's render time is when its packet was processed and acks
never wait for the application to read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from eloquent_plugins.core.assembler import EloquentAssembler
from eloquent_plugins.core.errors import EloquentError, ProtocolError
from eloquent_plugins.core.errors import IncompleteStream as CoreIncompleteStream
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import DATAGRAM, REQUEST_ID_HEADER, TRANSPORT_HEADER
from eloquent_plugins.core.sse_reader import SSEParser

from eloquent_client.bounds import client_error
from eloquent_client.errors import ClientError, IncompleteStream, StreamBroken
from eloquent_client.events import ClientEvent



class StreamOwner(Protocol):
    """What a stream asks of the connection that carries it (``http3._ClientProtocol``): close it when the server
    broke the protocol, send an ack, and forget the stream when the application is done with it."""

    def fail(self, error: ProtocolError) -> None: ...
    def send_datagram(self, stream_id: int, data: bytes) -> None: ...
    def forget(self, stream_id: int, *, cancel: bool) -> None: ...


class Phase(Enum):
    """Where a request stream is in its life. It only moves forward: AWAITING_HEADERS -> RECEIVING ->
    (COMPLETE ->) ENDED, or to FAILED from any phase before ENDED."""

    AWAITING_HEADERS = "awaiting headers"
    RECEIVING = "receiving"
    """The response head is in; the body (or the Eloquent events) is arriving."""
    COMPLETE = "complete"
    """Eloquent only: every event rendered and the digest verified, but the server has not ended the request
    stream yet, so late datagrams are still acknowledged (the server then stops probing at once)."""
    ENDED = "ended"
    """The server ended the stream; nothing more is taken."""
    FAILED = "failed"
    """An error went to the reader (reset, closed connection, bad response); nothing more is taken."""


_OPEN = (Phase.AWAITING_HEADERS, Phase.RECEIVING)
_OVER = (Phase.ENDED, Phase.FAILED)


class BodyKind(Enum):
    """How a response body is read, decided by the response head."""

    ELOQUENT = "eloquent"
    """Control records on the stream, events as datagrams."""
    SSE = "sse"
    RAW = "raw"
    """Anything else (an error page, a non-streaming answer): bytes for ``read()``."""


@dataclass(slots=True)
class StreamStats:
    datagrams: int = 0
    acks_sent: int = 0
    fallback_events: int = 0


class H3Stream:
    """One request's response as it arrives. Fed by the protocol; read with ``events()`` or ``read()``."""

    def __init__(self, protocol: StreamOwner, stream_id: int, *, eloquent: bool, limits: Limits) -> None:
        self._protocol = protocol
        self.stream_id = stream_id
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.stats = StreamStats()
        self.phase = Phase.AWAITING_HEADERS
        self.body_kind: BodyKind | None = None
        """Known once the headers are in."""
        self._headers_ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._items: asyncio.Queue[ClientEvent | bytes | BaseException | None] = asyncio.Queue()
        self._assembler = EloquentAssembler(stream_id, limits) if eloquent else None
        self._sse: SSEParser | None = None
        self._early: list[tuple[bytes, float]] = []
        self._sse_index = 0
        self.finished_at: float | None = None
        """When the reader's events ended (Eloquent: complete; otherwise the end of the body)."""
        self.final: StreamEvent | None = None

    # ---- fed by the protocol -----------------------------------------------------------------------------
    def on_headers(self, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        if self.phase is not Phase.AWAITING_HEADERS:
            return  # trailers (unused by this protocol), or the stream already failed
        fields: dict[str, str] = {}
        for key, value in headers:
            if key == b":status":
                self.status = int(value)
            elif not key.startswith(b":"):
                fields[key.decode("latin-1")] = value.decode("latin-1")
        self.headers = fields
        content_type = fields.get("content-type", "").split(";")[0].strip().lower()
        if fields.get(TRANSPORT_HEADER.decode()) == DATAGRAM.decode() and self._assembler is not None:
            self.body_kind = BodyKind.ELOQUENT
        elif content_type == "text/event-stream" and self.status == 200:
            self.body_kind, self._sse = BodyKind.SSE, SSEParser()
        else:
            self.body_kind = BodyKind.RAW
        self.phase = Phase.RECEIVING
        if not self._headers_ready.done():
            self._headers_ready.set_result(None)
        for data, at in self._early:  # datagrams that overtook the headers
            self.on_datagram(data, at)
        self._early.clear()
        if ended:
            self.on_data(b"", True)

    def on_data(self, data: bytes, ended: bool) -> None:
        if self.phase in _OVER:
            return
        now = time.monotonic()
        try:
            if self.body_kind is BodyKind.ELOQUENT:
                assert self._assembler is not None
                self._emit(self._assembler.on_control(data) if data else [], now)
                if ended:
                    self._assembler.on_stream_end()
            elif self.body_kind is BodyKind.SSE:
                assert self._sse is not None
                for message in self._sse.feed(data):
                    self._items.put_nowait(ClientEvent(self._sse_index, message.data, now, event=message.event,
                                                       id=message.id))
                    self._sse_index += 1
            elif data:
                self._items.put_nowait(data)
        except CoreIncompleteStream as exc:
            self._fail(IncompleteStream.from_core(exc))
            return
        except EloquentError as exc:
            self._fail(exc)
            return
        if ended:
            if self.phase is not Phase.COMPLETE:
                self.finished_at = now
                self._items.put_nowait(None)
            self.phase = Phase.ENDED

    def on_datagram(self, data: bytes, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._assembler is None or self.phase in _OVER:
            return
        if self.phase is Phase.AWAITING_HEADERS:
            if len(self._early) < 256:
                self._early.append((data, now))
            return
        if self.body_kind is not BodyKind.ELOQUENT:
            return
        self.stats.datagrams += 1
        try:
            events = self._assembler.on_datagram(data, now)
        except ProtocolError as exc:
            self._protocol.fail(exc)
            return
        except CoreIncompleteStream as exc:  # the datagram completed a stream whose digest does not match
            self._fail(IncompleteStream.from_core(exc))
            return
        self._emit(events, now)
        for ack in self._assembler.acks(now):
            self.stats.acks_sent += 1
            self._protocol.send_datagram(self.stream_id, ack)

    def _emit(self, events: list[StreamEvent], now: float) -> None:
        assert self._assembler is not None
        self.stats.fallback_events = self._assembler.fallback_events
        for event in events:
            if event.kind is EventKind.END:
                continue
            kind = "data" if event.kind is EventKind.DATA else "error"
            self._items.put_nowait(ClientEvent(event.index, event.payload.decode("utf-8", errors="replace"),
                                               now, kind=kind))
        if self._assembler.complete and self.phase is Phase.RECEIVING:
            self.final = self._assembler.final
            self.finished_at = now
            self.phase = Phase.COMPLETE
            self._items.put_nowait(None)

    def _fail(self, error: BaseException) -> None:
        if isinstance(error, EloquentError):  # a core error (the SSE parser's LimitExceeded): a ClientError
            error = client_error(error)
        if not self._headers_ready.done():
            self._headers_ready.set_exception(error)
            self._headers_ready.exception()  # mark retrieved
        if self.phase not in _OVER:
            self.phase = Phase.FAILED
            self._items.put_nowait(error)

    def on_abort(self, error: ClientError) -> None:
        """The stream or the connection went away: an error for the reader unless the events were complete."""
        if self.phase is Phase.COMPLETE:
            self.phase = Phase.ENDED
        else:
            self._fail(error)

    def on_reset(self, code: int) -> None:
        self.on_abort(StreamBroken(f"the server reset stream {self.stream_id} (code 0x{code:x})"))

    # ---- read by the application -------------------------------------------------------------------------
    async def wait_headers(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._headers_ready), timeout)
        except TimeoutError:
            raise StreamBroken(f"no response headers on stream {self.stream_id} within {timeout} s") from None

    @property
    def eloquent(self) -> bool:
        return self.body_kind is BodyKind.ELOQUENT

    @property
    def done(self) -> bool:
        """Nothing more is taken from the server (it ended the stream, or the stream failed)."""
        return self.phase in _OVER

    @property
    def request_id(self) -> str | None:
        return self.headers.get(REQUEST_ID_HEADER.decode())

    async def events(self) -> AsyncIterator[ClientEvent]:
        """Events as they become renderable; ends after the last one (Eloquent: the digest was verified)."""
        while True:
            item = await self._items.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, bytes):
                continue
            yield item

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body of a non-SSE response; with ``limit``, at most that many bytes (a longer body is cut
        there and not read on: the caller cancels the stream)."""
        parts: list[bytes] = []
        size = 0
        while True:
            item = await self._items.get()
            if item is None:
                return b"".join(parts)
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, bytes):
                parts.append(item)
                size += len(item)
                if limit is not None and size >= limit:
                    return b"".join(parts)[:limit]

    def cancel(self) -> None:
        """Abandon the request (the server sees a disconnect) unless it already completed."""
        self._protocol.forget(self.stream_id, cancel=self.phase in _OPEN)


__all__ = ["BodyKind", "H3Stream", "Phase", "StreamStats"]
