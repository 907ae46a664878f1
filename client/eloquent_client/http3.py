"""HTTP/3 client (aioquic) for the Eloquent front end: requests over one QUIC connection, SSE bodies parsed as
they arrive, Eloquent datagrams decoded and acknowledged on the spot.

All decoding happens in the protocol's callbacks, so an event's render time is when its packet was processed
and acks never wait for the application to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.events import DatagramReceived, DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamReset

from eloquent_plugins.core.errors import EloquentError, ProtocolError
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.h3glue import (
    ALPN,
    DATAGRAM,
    H3_REQUEST_CANCELLED,
    REQUEST_ID_HEADER,
    TRANSPORT_HEADER,
    DatagramH3Connection,
    close_code,
    disable_pacing,
)
from eloquent_plugins.core.sse_reader import SSEParser

from eloquent_plugins.core.assembler import EloquentAssembler
from eloquent_client.events import ClientError, ClientEvent, CoreIncompleteStream, IncompleteStream

QUIC_MAX_DATAGRAM_SIZE = 1350


@dataclass(slots=True)
class StreamStats:
    datagrams: int = 0
    acks_sent: int = 0
    fallback_events: int = 0


class H3Stream:
    """One request's response as it arrives. Fed by the protocol; read with ``events()`` or ``read()``."""

    def __init__(self, protocol: _ClientProtocol, stream_id: int, *, eloquent: bool, limits: Limits) -> None:
        self._protocol = protocol
        self.stream_id = stream_id
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.stats = StreamStats()
        self._headers_ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._items: asyncio.Queue[ClientEvent | bytes | BaseException | None] = asyncio.Queue()
        self._assembler = EloquentAssembler(stream_id, limits) if eloquent else None
        self._mode: str | None = None  # "eloquent", "sse" or "raw" once headers are in
        self._sse: SSEParser | None = None
        self._early: list[tuple[bytes, float]] = []
        self._sse_index = 0
        self.ended = False
        self.finished_at: float | None = None
        self.final: StreamEvent | None = None

    # ---- fed by the protocol -----------------------------------------------------------------------------
    def on_headers(self, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        if self.status is not None:
            return  # trailers: unused by this protocol
        fields: dict[str, str] = {}
        for key, value in headers:
            if key == b":status":
                self.status = int(value)
            elif not key.startswith(b":"):
                fields[key.decode("latin-1")] = value.decode("latin-1")
        self.headers = fields
        content_type = fields.get("content-type", "").split(";")[0].strip().lower()
        if fields.get(TRANSPORT_HEADER.decode()) == DATAGRAM.decode() and self._assembler is not None:
            self._mode = "eloquent"
        elif content_type == "text/event-stream" and self.status == 200:
            self._mode, self._sse = "sse", SSEParser()
        else:
            self._mode = "raw"
        if not self._headers_ready.done():
            self._headers_ready.set_result(None)
        for data, at in self._early:  # datagrams that overtook the headers
            self.on_datagram(data, at)
        self._early.clear()
        if ended:
            self.on_data(b"", True)

    def on_data(self, data: bytes, ended: bool) -> None:
        if self.ended:
            return
        now = time.monotonic()
        try:
            if self._mode == "eloquent":
                assert self._assembler is not None
                self._emit(self._assembler.on_control(data) if data else [], now)
                if ended:
                    self._assembler.on_stream_end()
            elif self._mode == "sse":
                assert self._sse is not None
                for message in self._sse.feed(data):
                    self._items.put_nowait(ClientEvent(self._sse_index, message.data, now, event=message.event,
                                                       id=message.id))
                    self._sse_index += 1
            elif data:
                self._items.put_nowait(data)
        except EloquentError as exc:
            self._fail(exc)
            return
        if ended:
            self.ended = True
            self.finished_at = now
            self._items.put_nowait(None)

    def on_datagram(self, data: bytes, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._assembler is None or self.ended:
            return
        if self._mode is None:
            if len(self._early) < 256:
                self._early.append((data, now))
            return
        if self._mode != "eloquent":
            return
        self.stats.datagrams += 1
        try:
            events = self._assembler.on_datagram(data, now)
        except ProtocolError as exc:
            self._protocol.fail(exc)
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
        if self._assembler.complete and self.final is None:
            self.final = self._assembler.final
            self.finished_at = now
            self._items.put_nowait(None)

    def _fail(self, error: BaseException) -> None:
        if isinstance(error, CoreIncompleteStream) and not isinstance(error, IncompleteStream):
            error = IncompleteStream(str(error))
        if not self._headers_ready.done():
            self._headers_ready.set_exception(error)
            self._headers_ready.exception()  # mark retrieved
        if not self.ended:
            self.ended = True
            self._items.put_nowait(error)

    def on_reset(self, code: int) -> None:
        if self.final is None:
            self._fail(ClientError(f"the server reset stream {self.stream_id} (code 0x{code:x})"))
        self.ended = True

    # ---- read by the application -------------------------------------------------------------------------
    async def wait_headers(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._headers_ready), timeout)
        except TimeoutError:
            raise ClientError(f"no response headers on stream {self.stream_id} within {timeout} s") from None

    @property
    def eloquent(self) -> bool:
        return self._mode == "eloquent"

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

    async def read(self) -> bytes:
        """The whole body of a non-SSE response."""
        parts: list[bytes] = []
        while True:
            item = await self._items.get()
            if item is None:
                return b"".join(parts)
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, bytes):
                parts.append(item)

    def cancel(self) -> None:
        """Abandon the request (the server sees a disconnect) unless it already completed."""
        self._protocol.forget(self.stream_id, cancel=self.final is None and not self.ended)


class _ClientProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = DatagramH3Connection(self._quic)
        self.streams: dict[int, H3Stream] = {}
        self.terminated: ConnectionTerminated | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
            error = ClientError(f"connection closed (code 0x{event.error_code:x}: {event.reason_phrase})")
            for stream in list(self.streams.values()):
                if stream.final is None:
                    stream._fail(error)
            self.streams.clear()
        elif isinstance(event, StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream.on_reset(event.error_code)
        for h3_event in self.h3.handle_event(event):
            self._h3_event(h3_event)

    def _h3_event(self, event: H3Event) -> None:
        if isinstance(event, DatagramReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_datagram(event.data)
            return
        stream = self.streams.get(getattr(event, "stream_id", -1))
        if stream is None:
            return
        if isinstance(event, HeadersReceived):
            stream.on_headers(event.headers, event.stream_ended)
        elif isinstance(event, DataReceived):
            stream.on_data(event.data, event.stream_ended)
        if stream.ended:
            self.streams.pop(stream.stream_id, None)

    def send_datagram(self, stream_id: int, data: bytes) -> None:
        self.h3.send_datagram(stream_id, data)
        self._transmit_soon()

    def fail(self, error: ProtocolError) -> None:
        """The server broke the protocol: close the connection with the error's code."""
        self._quic.close(error_code=close_code(error), reason_phrase=str(error)[:200])
        self.transmit()

    def forget(self, stream_id: int, *, cancel: bool) -> None:
        """The application is done with a stream. A complete Eloquent stream stays registered until the server
        ends it, so its late datagrams are still acknowledged (the server then stops probing at once)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not cancel and not stream.ended and stream.eloquent:
            return
        del self.streams[stream_id]
        if cancel and self.terminated is None:
            with contextlib.suppress(Exception):
                self._quic.reset_stream(stream_id, H3_REQUEST_CANCELLED)
                self._quic.stop_stream(stream_id, H3_REQUEST_CANCELLED)
            self.transmit()


def client_configuration(host: str, verify: bool | str, idle_timeout: float) -> QuicConfiguration:
    config = QuicConfiguration(alpn_protocols=ALPN, is_client=True, max_datagram_frame_size=65536,
                               max_datagram_size=QUIC_MAX_DATAGRAM_SIZE, idle_timeout=idle_timeout,
                               server_name=host)
    if verify is False:
        config.verify_mode = ssl.CERT_NONE
    elif isinstance(verify, str):
        config.load_verify_locations(cafile=verify)
    return config


class Http3ClientConnection:
    """One QUIC connection; ``request`` opens a stream per request, any number concurrently."""

    def __init__(self, protocol: _ClientProtocol, transport: asyncio.DatagramTransport, authority: str,
                 limits: Limits) -> None:
        self._protocol = protocol
        self._transport = transport
        self.authority = authority
        self.limits = limits

    @classmethod
    async def connect(cls, host: str, port: int, *, verify: bool | str = True, idle_timeout: float = 60.0,
                      timeout: float = 10.0, limits: Limits | None = None,
                      pacing: bool = False) -> Http3ClientConnection:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        try:
            local = str(ipaddress.ip_address(addr[0])) if ipaddress.ip_address(addr[0]).is_loopback else ""
        except ValueError:
            local = ""
        quic = QuicConnection(configuration=client_configuration(host, verify, idle_timeout))
        if not pacing:
            disable_pacing(quic)
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: _ClientProtocol(quic), local_addr=(local or ("::" if family == socket.AF_INET6 else "0.0.0.0"), 0),
            family=family)
        assert isinstance(protocol, _ClientProtocol)
        try:
            protocol.connect(addr)
            await asyncio.wait_for(protocol.wait_connected(), timeout)
        except (ConnectionError, TimeoutError) as exc:
            transport.close()
            raise ClientError(f"cannot connect over HTTP/3 to {host}:{port}: {str(exc) or type(exc).__name__}") from None
        authority = host if port == 443 else f"{host}:{port}"
        return cls(protocol, transport, authority, limits or Limits())

    @property
    def closed(self) -> bool:
        return self._protocol.terminated is not None

    @property
    def close_event(self) -> ConnectionTerminated | None:
        return self._protocol.terminated

    async def request(self, method: str, path: str, *, headers: list[tuple[str, str]] | None = None,
                      body: bytes = b"", eloquent: bool = False, content_length: bool = True) -> H3Stream:
        """Send the request; returns the stream at once (await ``wait_headers`` for the status)."""
        protocol = self._protocol
        if protocol.terminated is not None:
            raise ClientError("the HTTP/3 connection is closed")
        stream_id = protocol._quic.get_next_available_stream_id()
        stream = H3Stream(protocol, stream_id, eloquent=eloquent, limits=self.limits)
        protocol.streams[stream_id] = stream
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", self.authority.encode()),
                  (b":path", path.encode())]
        extra = [(k.lower().encode(), v.encode()) for k, v in (headers or [])]
        if body and content_length and not any(k == b"content-length" for k, _ in extra):
            extra.append((b"content-length", str(len(body)).encode()))
        protocol.h3.send_headers(stream_id, fields + extra, end_stream=not body)
        if body:
            protocol.h3.send_data(stream_id, body, end_stream=True)
        protocol.transmit()
        return stream

    def send_raw_datagrams(self, stream_id: int, datagrams: list[bytes]) -> None:
        """Send arbitrary HTTP/3 datagrams in one go (tests use it to play a misbehaving client)."""
        for data in datagrams:
            self._protocol.h3.send_datagram(stream_id, data)
        self._protocol.transmit()

    async def close(self) -> None:
        protocol = self._protocol
        if protocol.terminated is None:
            protocol.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(protocol.wait_closed(), 1.0)
        self._transport.close()

    async def wait_closed(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._protocol.wait_closed(), timeout)


__all__ = ["H3Stream", "Http3ClientConnection", "IncompleteStream", "client_configuration"]
