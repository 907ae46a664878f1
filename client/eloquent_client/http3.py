"""HTTP/3 client connection (aioquic) for the Eloquent front end: requests over one QUIC connection, each
response an ``H3Stream`` (``h3stream``) that the protocol's callbacks feed as packets are processed.

A connection may watch its path (``stream_idle_timeout``): while a resumable stream is open it sends a QUIC PING
whenever the server has been quiet a while, and when nothing at all arrives for ``stream_idle_timeout`` seconds
the path is taken for dead long before QUIC's own idle timeout: its resumable streams end with ``StreamBroken``
(their reader resumes them elsewhere) and, once none is left, the connection is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import socket
import ssl
from typing import Any

from aioquic.h3.events import DatagramReceived, DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamReset

from eloquent_plugins.core.errors import ProtocolError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import H3_REQUEST_CANCELLED, QUIC_MAX_DATAGRAM_SIZE, STREAM_HEADER
from eloquent_plugins.h3glue.common import ALPN, DatagramH3Connection, H3Protocol, close_code, disable_pacing

from eloquent_client.errors import (
    ConnectError,
    IncompleteStream,
    StreamBroken,
    TLSVerificationError,
)
from eloquent_client.h3stream import BodyKind, H3Stream, Phase, StreamStats

_CRYPTO_ERROR = range(0x100, 0x200)
"""QUIC CRYPTO_ERROR codes (0x100 + TLS alert): a handshake that ends with one failed in TLS."""
_PINGS = itertools.count(1)


class _ClientProtocol(H3Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = DatagramH3Connection(self.quic)
        self.streams: dict[int, H3Stream] = {}
        self.terminated: ConnectionTerminated | None = None
        self.last_received = self.loop.time()
        """When the last UDP datagram from the server arrived (the path watchdog's clock)."""
        self.received = 0
        """UDP datagrams from the server: none at all after a failed handshake means a blocked path."""
        self._receiving = False
        """Inside ``datagram_received``: its ``after_input`` transmits, so nothing needs to schedule a transmit."""

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self.last_received = self.loop.time()
        self.received += 1
        self._receiving = True
        try:
            super().datagram_received(data, addr)
        finally:
            self._receiving = False

    def close_reason(self) -> ConnectionTerminated | None:
        """Why the connection closed or is closing (aioquic keeps a locally started close private until its
        draining period ends, which can outlast a short connect timeout)."""
        return self.terminated or getattr(self.quic, "_close_event", None)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
            error = StreamBroken(f"connection closed (code 0x{event.error_code:x}: {event.reason_phrase})")
            for open_stream in list(self.streams.values()):
                open_stream.on_abort(error)
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
        if stream.done:
            self.streams.pop(stream.stream_id, None)

    def send_datagram(self, stream_id: int, data: bytes) -> None:
        """An Eloquent ack: it leaves with the transmit that ends the input being processed (no callback of its
        own). QUIC's ACK is left to aioquic's timer, 1 ms later: carrying it in the same packet (``acknowledge_now``)
        halves the client's packets and saves 35 us of its CPU per token, but raised the datagram path's lossless
        floor in ``bench e2e`` (docs/results/e2e-vs-sim.md, 2026-12-01 evening)."""
        self.h3.send_datagram(stream_id, data)
        if not self._receiving:
            self.transmit_soon()

    def fail(self, error: ProtocolError) -> None:
        """The server broke the protocol: close the connection with the error's code."""
        self.quic.close(error_code=close_code(error), reason_phrase=str(error)[:200])
        self.transmit()

    def forget(self, stream_id: int, *, cancel: bool) -> None:
        """The application is done with a stream. A complete Eloquent stream stays registered until the server
        ends it, so its late datagrams are still acknowledged (the server then stops probing at once)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not cancel and stream.phase is Phase.COMPLETE:
            return
        del self.streams[stream_id]
        if cancel and self.terminated is None:
            with contextlib.suppress(Exception):
                self.quic.reset_stream(stream_id, H3_REQUEST_CANCELLED)
                self.quic.stop_stream(stream_id, H3_REQUEST_CANCELLED)
            self.transmit()


def _connect_error(host: str, port: int, verify: bool | str, close: ConnectionTerminated | None,
                   exc: BaseException, answered: bool) -> ConnectError:
    """The typed error of a failed handshake: TLS verification (with the reason and the fix) or no connection."""
    if close is not None and close.error_code in _CRYPTO_ERROR and verify is not False:
        return TLSVerificationError(host, port, close.reason_phrase or f"TLS alert {close.error_code - 0x100}")
    if close is not None:
        detail = f"closed by the handshake (code 0x{close.error_code:x}: {close.reason_phrase})"
    elif isinstance(exc, TimeoutError) and not answered:
        detail = "no answer (UDP blocked, or nothing listens on that port)"
    elif isinstance(exc, TimeoutError):
        detail = "the handshake did not complete in time (the server answered: a lossy path)"
    else:
        detail = str(exc) or type(exc).__name__
    error = ConnectError(f"cannot connect over HTTP/3 to {host}:{port}: {detail}")
    error.answered = answered
    return error


async def _handshake(protocol: _ClientProtocol, transport: asyncio.DatagramTransport, addr: Any, host: str, port: int,
                     verify: bool | str, timeout: float) -> None:
    """Connect and wait for the handshake; raises ``TLSVerificationError`` or ``ConnectError`` when it fails."""
    try:
        protocol.connect(addr)
        await asyncio.wait_for(protocol.wait_connected(), timeout)
    except BaseException as exc:
        # Whatever failed (timeout, refusal, cancellation), nothing of this connection may run afterwards:
        # aioquic's timer would fire into the closed transport ("Exception in callback ... _handle_timer").
        close = protocol.close_reason()
        protocol.stop_driving()
        transport.close()
        if isinstance(exc, ConnectionError | TimeoutError | OSError):
            raise _connect_error(host, port, verify, close, exc, protocol.received > 0) from None
        raise


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
        self.stream_idle_timeout: float | None = None
        self.abort_unanswered = False
        """The watchdog also ends requests still waiting for their head on a dead path (the caller falls back)."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._dropped = False

    @classmethod
    async def connect(cls, host: str, port: int, *, verify: bool | str = True, idle_timeout: float = 60.0,
                      timeout: float = 10.0, limits: Limits | None = None, pacing: bool = False,
                      stream_idle_timeout: float | None = None) -> Http3ClientConnection:
        """Raises ``TLSVerificationError`` or ``ConnectError`` (both ``ClientError``) when no connection is made;
        ``idle_timeout`` is QUIC's, ``stream_idle_timeout`` arms the path watchdog (module docstring)."""
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except OSError as exc:
            raise ConnectError(f"cannot resolve {host}: {exc}") from None
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
        await _handshake(protocol, transport, addr, host, port, verify, timeout)
        authority = host if port == 443 else f"{host}:{port}"
        conn = cls(protocol, transport, authority, limits or Limits())
        if stream_idle_timeout is not None:
            conn.stream_idle_timeout = stream_idle_timeout
            conn._arm_watchdog()
        return conn

    @classmethod
    async def over(cls, transport: asyncio.DatagramTransport, addr: tuple[str, int], *, host: str = "localhost",
                   verify: bool | str = True, timeout: float = 10.0, limits: Limits | None = None,
                   pacing: bool = False) -> Http3ClientConnection:
        """A connection over a datagram transport the caller made (an in-memory link: ``bench datapath``): the
        transport gets the protocol with ``set_protocol`` and hands it what arrives; ``addr`` is the server's."""
        quic = QuicConnection(configuration=client_configuration(host, verify, 60.0))
        if not pacing:
            disable_pacing(quic)
        protocol = _ClientProtocol(quic)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        await _handshake(protocol, transport, addr, host, addr[1], verify, timeout)
        return cls(protocol, transport, host, limits or Limits())

    # ---- the path watchdog -------------------------------------------------------------------------------
    def _arm_watchdog(self) -> None:
        assert self.stream_idle_timeout is not None
        self._watchdog = self._protocol.loop.call_later(self.stream_idle_timeout / 4, self._watch)

    def _watch(self) -> None:
        self._watchdog = None
        protocol = self._protocol
        if protocol.terminated is not None or self._dropped:
            return
        assert self.stream_idle_timeout is not None
        # Streams still waiting for their head lose nothing either when the caller has another path (``auto``).
        resumable = [s for s in protocol.streams.values()
                     if (s.phase is Phase.AWAITING_HEADERS and self.abort_unanswered)
                     or (s.phase is Phase.RECEIVING and STREAM_HEADER in s.headers)]
        quiet = protocol.loop.time() - protocol.last_received
        if resumable and quiet >= self.stream_idle_timeout:
            error = StreamBroken(f"nothing from the server for {quiet:.1f} s (stream_idle_timeout "
                                 f"{self.stream_idle_timeout:g} s): the path is gone")
            for stream in resumable:
                protocol.streams.pop(stream.stream_id, None)
                stream.on_abort(error)
            if not protocol.streams:
                self._drop()
                return
        elif protocol.streams and quiet >= self.stream_idle_timeout / 4:
            protocol.quic.send_ping(next(_PINGS))  # an ack comes back while the path lives, even if the app is idle
            protocol.transmit()
        self._arm_watchdog()

    def _drop(self) -> None:
        """Give the connection up without a handshake (the path is dead): nothing of it runs afterwards."""
        self._dropped = True
        self._protocol.stop_driving()
        self._transport.close()

    @property
    def closed(self) -> bool:
        return self._protocol.terminated is not None or self._dropped

    @property
    def close_event(self) -> ConnectionTerminated | None:
        return self._protocol.terminated

    async def request(self, method: str, path: str, *, headers: list[tuple[str, str]] | None = None,
                      body: bytes = b"", eloquent: bool = False, content_length: bool = True) -> H3Stream:
        """Send the request; returns the stream at once (await ``wait_headers`` for the status)."""
        protocol = self._protocol
        if protocol.terminated is not None or self._dropped:
            raise StreamBroken("the HTTP/3 connection is closed")
        stream_id = protocol.quic.get_next_available_stream_id()
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
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        protocol = self._protocol
        if self._dropped:
            return
        if protocol.terminated is None:
            protocol.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(protocol.wait_closed(), 1.0)
        protocol.stop_driving()  # a close the server never answered leaves aioquic's timer armed
        self._transport.close()

    async def wait_closed(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._protocol.wait_closed(), timeout)


__all__ = ["BodyKind", "H3Stream", "Http3ClientConnection", "IncompleteStream", "Phase", "StreamStats",
           "client_configuration"]
