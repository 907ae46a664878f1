"""The HTTP/3 front end: hosts any ASGI app over aioquic, and delivers the SSE responses of requests that ask
for it (``eloquent-transport: datagram``) as Eloquent packets in HTTP/3 datagrams (RFC 9297, quarter stream
id prefix) tied to the request, driven by one ``EloquentResponseStream`` (the core sender) per request.

Everything else gets an ordinary HTTP/3 response. Datagrams leave only when the congestion controller has
room (``DatagramQueue`` parks at most one run per stream, superseded runs replaced), so aioquic's unbounded
DATAGRAM queue never holds a stale backlog. A client that sends garbage datagrams, acks for events never sent,
or floods acks has its connection closed with the Eloquent error code; other connections go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Self

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.buffer import size_uint_var
from aioquic.h3.events import DatagramReceived, DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    ProtocolNegotiated,
    QuicEvent,
    StopSendingReceived,
    StreamReset,
)

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError, LimitExceeded, ProtocolError
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.hooks.specs import StreamInfo
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.http3.certs import resolve_certificate
from eloquent_plugins.transports.http3.datagram_queue import DatagramQueue
from eloquent_plugins.h3glue import (
    ALPN,
    CONNECTION_SPECIFIC,
    DATAGRAM,
    H3_INTERNAL_ERROR,
    H3_NO_ERROR,
    H3_REQUEST_CANCELLED,
    REQUEST_ID_HEADER,
    TRANSPORT_HEADER,
    DatagramH3Connection,
    close_code,
    disable_pacing,
)
from eloquent_plugins.transports.http3.lifespan import Lifespan
from eloquent_plugins.core.scheme import Scheme, scheme_for, sender_config_for
from eloquent_plugins.core.response_stream import EloquentResponseStream

log = logging.getLogger("eloquent_plugins.transports.http3")

QUIC_MAX_DATAGRAM_SIZE = 1350
"""UDP payload size the front end uses (aioquic's default is 1200; loopback and most paths carry 1350)."""
_PACKET_OVERHEAD = 64
"""QUIC short header, AEAD tag and DATAGRAM frame header, rounded up: what an Eloquent packet must leave."""
_STREAM_HIGH_WATER = 256 << 10
"""Bytes buffered on a plain response stream before ``send`` waits for the client to read."""
_UNROUTABLE_BURST = 256
_UNROUTABLE_RATE = 64.0
"""Datagrams for no live Eloquent stream (late acks are normal) a client may send: a token bucket."""


@dataclass(frozen=True, slots=True)
class FrontEndOptions:
    """Transport details beyond ``StreamConfig`` (defaults suit loopback demos and real paths alike)."""

    idle_timeout: float = 60.0
    """QUIC idle timeout; must exceed any outage a stream should survive."""
    fallback_after: float = 1.0
    """Seconds after the trailer before still-unacked events go on the reliable stream."""
    record_timings: bool = False
    """Keep each SSE event's generation time per request (benchmarks read them back in-process)."""
    timings_kept: int = 1024
    congestion_control: str = "reno"
    pacing: bool = False
    """aioquic's pacer (see ``h3.NoPacer`` for why it is off by default for token streams)."""


class _TokenBucket:
    __slots__ = ("_at", "_tokens", "capacity", "rate")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity, self.rate, self._tokens, self._at = capacity, rate, capacity, now

    def take(self, now: float) -> bool:
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(slots=True)
class _ServerState:
    app: Any
    config: StreamConfig
    options: FrontEndOptions
    plugin_manager: Any
    connections: set[Http3Connection] = field(default_factory=set)
    timings: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    closed_with_error: int = 0

    def record(self, request_id: str, times: list[float]) -> None:
        if not self.options.record_timings:
            return
        self.timings[request_id] = times
        while len(self.timings) > self.options.timings_kept:
            self.timings.popitem(last=False)


def _json_response(status: int, message: str, code: str | int, *,
                   type_: str = "invalid_request_error") -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


class _Request:
    """One request stream: the ASGI bridge (``receive``/``send``) and, in Eloquent mode, its stream."""

    def __init__(self, conn: Http3Connection, stream_id: int, scope: dict[str, Any], scheme: Scheme) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.scope = scope
        self.scheme = scheme
        self.request_id = os.urandom(8).hex()
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.body_bytes = 0
        self.body_done = False
        self.disconnected = False
        self.started = False
        self.finished = False
        self.eloquent: EloquentResponseStream | None = None
        self.sse: SSEParser | None = None
        self.generated: list[float] = []
        self.hooks: StreamHooks | None = None
        self.task: asyncio.Task[None] | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self._next_index = 0
        self.tail = b"\n\n"
        """The app's last bytes forwarded on a plain SSE response: a keep-alive may only go between messages."""
        self.keepalive: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_at = 0.0
        """When the last body chunk arrived (loop time): a body that stalls ``body_timeout`` gets a 408."""

    # ---- ASGI --------------------------------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        if self.disconnected and self.messages.empty():
            return {"type": "http.disconnect"}
        return await self.messages.get()

    def disconnect(self) -> None:
        if self.keepalive is not None:
            self.keepalive.cancel()
            self.keepalive = None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        if not self.disconnected:
            self.disconnected = True
            self.messages.put_nowait({"type": "http.disconnect"})
            self.drained.set()

    def on_body(self, data: bytes, ended: bool) -> None:
        if self.body_done:
            return
        self.body_bytes += len(data)
        limit = self.conn.state.config.max_request_bytes
        if self.body_bytes > limit:
            self.body_done = True
            self.conn.reject(self, 413, f"request body exceeds {limit} bytes", "request_too_large")
            return
        self.body_done = ended
        if ended and self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        elif data:
            self.body_at = self.conn._loop.time()
        self.messages.put_nowait({"type": "http.request", "body": data, "more_body": not ended})

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected or self.finished:
            return  # like uvicorn: sends after a disconnect are dropped, receive() reports it
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.conn.start_response(self, int(message["status"]), list(message.get("headers", [])))
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            await self.conn.send_body(self, bytes(message.get("body", b"")), bool(message.get("more_body")))

    async def run(self) -> None:
        state = self.conn.state
        try:
            await state.app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("ASGI app failed on stream %d", self.stream_id)
            if self.hooks is not None:
                self.hooks.error(exc)
            self.conn.app_failed(self, exc)
        else:
            if self.started and not self.finished and not self.disconnected:
                self.conn.app_failed(self, RuntimeError("the app returned without finishing its response"))
            elif not self.started and not self.disconnected:
                self.conn.reject(self, 500, "the app returned no response", "internal_error")
        finally:
            self.conn.request_done(self)

    def next_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index


class Http3Connection(QuicConnectionProtocol):
    """One client connection. Network events, app sends and timers all end in ``_pump``."""

    def __init__(self, *args: Any, state: _ServerState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = state
        self._h3: DatagramH3Connection | None = None
        self._requests: dict[int, _Request] = {}
        self._eloquent: dict[int, tuple[_Request, EloquentResponseStream]] = {}
        self._queue = DatagramQueue()
        self._unroutable = _TokenBucket(_UNROUTABLE_BURST, _UNROUTABLE_RATE, self._loop.time())
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._deadline_at: float | None = None
        self._pump_handle: asyncio.Handle | None = None
        self._terminated = False
        self.error_code: int | None = None
        limits = state.config.limits
        budget = min(limits.max_datagram_size, QUIC_MAX_DATAGRAM_SIZE - _PACKET_OVERHEAD)
        self._limits = replace(limits, max_datagram_size=budget)
        if not state.options.pacing:
            disable_pacing(self._quic)
        state.connections.add(self)

    # ---- network -----------------------------------------------------------------------------------------
    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self._quic.receive_datagram(data, addr, now=self._loop.time())  # type: ignore[arg-type]
        self._process_events()
        self._pump()

    def _handle_timer(self) -> None:
        super()._handle_timer()
        self._pump()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ProtocolNegotiated):
            if event.alpn_protocol in ALPN:
                self._h3 = DatagramH3Connection(self._quic)
        elif isinstance(event, ConnectionTerminated):
            self._terminated = True
            self.state.connections.discard(self)
            for request in list(self._requests.values()):
                request.disconnect()
            self._eloquent.clear()
            for handle in (self._deadline_handle, self._pump_handle):
                if handle is not None:
                    handle.cancel()
        elif isinstance(event, StreamReset | StopSendingReceived):
            request = self._requests.get(event.stream_id)
            if request is not None:
                request.disconnect()
            self._drop_eloquent(event.stream_id)
        if self._h3 is not None and not self._terminated:
            for h3_event in self._h3.handle_event(event):
                if self.error_code is None:
                    self._h3_event(h3_event)

    def _h3_event(self, event: H3Event) -> None:
        if isinstance(event, HeadersReceived):
            if event.stream_id in self._requests:
                return  # trailers from the client: nothing to do with them
            self._new_request(event)
        elif isinstance(event, DataReceived):
            request = self._requests.get(event.stream_id)
            if request is not None:
                request.on_body(event.data, event.stream_ended)
        elif isinstance(event, DatagramReceived):
            self._route_datagram(event.stream_id, event.data)

    def _route_datagram(self, stream_id: int, data: bytes) -> None:
        now = self._loop.time()
        entry = self._eloquent.get(stream_id)
        if entry is None:
            # Late acks after a stream finished, or datagrams ahead of their request, are normal; drop them,
            # but a client that keeps sending datagrams nobody asked for is cut off.
            if not self._unroutable.take(now):
                self.fail(LimitExceeded("too many datagrams for no live Eloquent stream"))
            return
        try:
            entry[1].receive_datagram(data, now)
        except ProtocolError as exc:
            self.fail(exc)

    def fail(self, error: ProtocolError) -> None:
        """Close the whole connection with the error's code (the peer broke the protocol)."""
        if self._terminated or self.error_code is not None:
            return
        self.error_code = close_code(error)
        self.state.closed_with_error += 1
        log.info("closing connection: %s (code 0x%x)", error, self.error_code)
        self._quic.close(error_code=self.error_code, reason_phrase=str(error)[:200])
        self.transmit()
        for request in list(self._requests.values()):
            request.disconnect()
        self._eloquent.clear()

    # ---- requests ----------------------------------------------------------------------------------------
    def _new_request(self, event: HeadersReceived) -> None:
        pseudo: dict[bytes, bytes] = {}
        headers: list[tuple[bytes, bytes]] = []
        for key, value in event.headers:
            if key.startswith(b":"):
                pseudo[key] = value
            else:
                headers.append((key, value))
        method, path = pseudo.get(b":method"), pseudo.get(b":path")
        if b":authority" in pseudo and not any(k == b"host" for k, _ in headers):
            headers.insert(0, (b"host", pseudo[b":authority"]))
        try:
            scheme = scheme_for(headers)
        except ValueError as exc:
            scheme, bad_scheme = Scheme.STREAM, str(exc)
        else:
            bad_scheme = None
        raw_path, _, query = (path or b"/").partition(b"?")
        server_addr = self._transport.get_extra_info("sockname") if self._transport else None
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "3",
            "method": (method or b"GET").decode("latin-1"), "scheme": "https",
            "path": raw_path.decode("utf-8", errors="replace"), "raw_path": raw_path, "query_string": query,
            "root_path": "", "headers": headers,
            "client": self._quic._network_paths[0].addr[:2] if self._quic._network_paths else None,
            "server": tuple(server_addr[:2]) if server_addr else None, "extensions": {},
        }
        request = _Request(self, event.stream_id, scope, scheme)
        self._requests[event.stream_id] = request
        limits = self.state.config.limits
        declared = dict(headers).get(b"content-length")
        if method is None or path is None:
            self.reject(request, 400, "missing :method or :path", "invalid_request")
        elif bad_scheme is not None:
            self.reject(request, 400, bad_scheme, "invalid_eloquent_scheme")
        elif sum(1 for r in self._requests.values() if r.task is not None) >= limits.max_streams:
            self.reject(request, 503, f"more than {limits.max_streams} concurrent requests on one connection",
                        "too_many_streams")
        elif declared is not None and (not declared.isdigit()
                                       or int(declared) > self.state.config.max_request_bytes):
            self.reject(request, 413, f"request body exceeds {self.state.config.max_request_bytes} bytes",
                        "request_too_large")
        else:
            request.hooks = StreamHooks(self.state.plugin_manager, StreamInfo(
                request.request_id, route=scope["path"], transport="h3", codec="raw"))
            if event.stream_ended:
                request.on_body(b"", True)
            else:
                self._arm_body_timer(request, self._loop.time())
            request.task = self._loop.create_task(request.run())

    def _arm_body_timer(self, request: _Request, now: float) -> None:
        """Slowloris on the request side: a body with no new bytes for ``body_timeout`` seconds is refused.
        One timer per request, moved on lazily (a chunk only records its arrival time)."""
        timeout = self.state.config.body_timeout
        if timeout > 0:
            request.body_at = now
            request.body_timer = self._loop.call_at(now + timeout, self._check_body, request)

    def _check_body(self, request: _Request) -> None:
        request.body_timer = None
        if request.body_done or request.disconnected or request.finished or self._terminated:
            return
        timeout = self.state.config.body_timeout
        due = request.body_at + timeout
        if self._loop.time() < due:
            request.body_timer = self._loop.call_at(due, self._check_body, request)
            return
        log.info("stream %d: no request body data for %.1f s: %s", request.stream_id, timeout,
                 "cut" if request.started else "408")
        request.body_done = True
        self._stop_reading(request.stream_id, H3_REQUEST_CANCELLED if request.started else H3_NO_ERROR)
        self.reject(request, 408, f"request body not received: no data for {timeout:g} s", 408,
                    type_="request_timeout")

    def _stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None:
        """Ask the client to stop sending the request (RFC 9114 4.1: H3_NO_ERROR when the response is
        complete without the rest of it)."""
        with contextlib.suppress(Exception):  # the client may have closed its side already
            self._quic.stop_stream(stream_id, code)

    def reject(self, request: _Request, status: int, message: str, code: str | int, *,
               type_: str = "invalid_request_error") -> None:
        """An error response before the app answered (or instead of it)."""
        if request.started or self._h3 is None or self._terminated:
            self._reset(request.stream_id, H3_REQUEST_CANCELLED)
        else:
            request.started = True
            headers, body = _json_response(status, message, code, type_=type_)
            if self._send_headers(request.stream_id, [(b":status", str(status).encode()), *headers]):
                self._send_data(request.stream_id, body, True)
            self.transmit()
        request.finished = True
        request.disconnect()
        if request.task is None:
            self._requests.pop(request.stream_id, None)

    def _send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self._h3 is not None
        try:
            self._h3.send_headers(stream_id, headers)
        except Exception:  # noqa: BLE001 - the client stopped the stream first
            request = self._requests.get(stream_id)
            if request is not None:
                request.disconnect()
            return False
        return True

    def _send_data(self, stream_id: int, data: bytes, end_stream: bool) -> bool:
        """Write on a request stream; False (and the request counts as gone) if the client closed it."""
        assert self._h3 is not None
        try:
            self._h3.send_data(stream_id, data, end_stream=end_stream)
        except Exception:  # noqa: BLE001 - aioquic raises several types for a stream the peer stopped
            request = self._requests.get(stream_id)
            if request is not None:
                request.disconnect()
            return False
        return True

    def _reset(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(Exception):  # the stream may already be closed on our side
            self._quic.reset_stream(stream_id, code)
        self.transmit()

    def start_response(self, request: _Request, status: int, raw_headers: list[Any]) -> None:
        assert self._h3 is not None
        headers = [(bytes(k).lower(), bytes(v)) for k, v in raw_headers]
        content_type = next((v for k, v in headers if k == b"content-type"), b"")
        is_sse = content_type.split(b";")[0].strip().lower() == b"text/event-stream"
        out = [(k, v) for k, v in headers if k not in CONNECTION_SPECIFIC and not k.startswith(b":")]
        out.append((REQUEST_ID_HEADER, request.request_id.encode()))
        datagrams = (request.scheme is not Scheme.STREAM and status == 200 and is_sse
                     and self._h3.peer_accepts_datagrams)
        now = self._loop.time()
        if datagrams:
            config = sender_config_for(request.scheme, self.state.config)
            config = replace(config, limits=self._limits)
            stream = EloquentResponseStream(
                request.stream_id, config, now=now, fallback_after=self.state.options.fallback_after,
                ack_timeout=self.state.config.send_timeout or 30.0,
                supersede=request.scheme is Scheme.ELOQUENT)
            request.eloquent = stream
            self._eloquent[request.stream_id] = (request, stream)
            out = [(k, v) for k, v in out if k not in (b"content-length", b"content-type")]
            out += [(TRANSPORT_HEADER, DATAGRAM), (b"content-type", b"application/x-ndjson"),
                    (b"eloquent-content-type", content_type)]
            if request.hooks is not None:
                request.hooks.stream.transport = "eloquent"
        elif is_sse:
            request.sse = SSEParser(max_message_bytes=self.state.config.limits.max_event_bytes + 4096)
            self._arm_keepalive(request)
        if request.hooks is not None:
            request.hooks.start()
        self._send_headers(request.stream_id, [(b":status", str(status).encode()), *out])
        self.transmit()

    async def send_body(self, request: _Request, body: bytes, more: bool) -> None:
        assert self._h3 is not None
        now = self._loop.time()
        stream = request.eloquent
        if stream is not None:
            try:
                self._feed_eloquent(request, stream, body, now)
            except (LimitExceeded, ValueError) as exc:
                self._finish_eloquent(request, stream.fail(str(exc), now))
                if request.hooks is not None:
                    request.hooks.end("error")
                raise
            if not more:
                self._finish_eloquent(request, stream.finish(now))
                if request.hooks is not None:
                    request.hooks.end("complete")
            self._pump()  # at once: a token waiting for the next loop iteration is a token rendered late
            return
        if request.sse is not None:
            messages = request.sse.feed(body)
            request.generated.extend(now for _ in messages)
            if request.hooks is not None and request.hooks.active:
                body = b"".join(self._hooked_sse(request, m) for m in messages)
        self._send_data(request.stream_id, body, not more)
        self.transmit()
        if body:
            request.tail = (request.tail + body)[-4:]
        if request.keepalive is not None:
            self._arm_keepalive(request)
        if not more:
            request.finished = True
            if not request.body_done:  # answered before the whole request arrived: the rest is not wanted
                request.body_done = True
                self._stop_reading(request.stream_id)
            self.state.record(request.request_id, request.generated)
            if request.hooks is not None:
                request.hooks.end("complete")
            request.disconnect()  # the response is complete: receive() now reports the end
            return
        await self._wait_drained(request)

    def _arm_keepalive(self, request: _Request) -> None:
        """Plain SSE on the reliable stream: the core keep-alive policy, a comment after ``keepalive`` seconds
        without bytes (proxies and clients with read timeouts see the stream alive). Datagram streams have the
        sender's own KEEPALIVE packets."""
        if request.keepalive is not None:
            request.keepalive.cancel()
            request.keepalive = None
        policy = self.state.config.keepalive_policy
        if policy.enabled and not request.finished and not request.disconnected and not self._terminated:
            request.keepalive = self._loop.call_later(policy.interval, self._send_keepalive, request)

    def _send_keepalive(self, request: _Request) -> None:
        request.keepalive = None
        if request.finished or request.disconnected or self._terminated or self.error_code is not None:
            return
        # Only between two messages (the app's bytes so far end with a blank line); the frame itself, a comment
        # line or a bare newline, leaves the stream between messages.
        between = request.tail.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))
        if between and self._send_data(request.stream_id, self.state.config.keepalive_policy.sse_frame, False):
            self.transmit()
        self._arm_keepalive(request)

    def _hooked_sse(self, request: _Request, message: Any) -> bytes:
        assert request.hooks is not None
        event = request.hooks.event(StreamEvent(request.next_index(), message.data.encode()))
        return format_event(event.payload, event=None if message.event == "message" else message.event,
                            id=message.id)

    def _feed_eloquent(self, request: _Request, stream: EloquentResponseStream, body: bytes, now: float) -> None:
        hooks = request.hooks
        if hooks is None or not hooks.active:
            stream.feed_body(body, now)
            return
        for message in stream._parser.feed(body):
            event = hooks.event(StreamEvent(stream.sender.next_index, message.data.encode()))
            stream._push(event.payload, now, EventKind.DATA)

    def _finish_eloquent(self, request: _Request, trailer: bytes) -> None:
        assert self._h3 is not None
        request.finished = True
        self.state.record(request.request_id, request.eloquent.generated if request.eloquent else [])
        self._send_data(request.stream_id, trailer, False)
        self.transmit()
        request.disconnect()  # the response is complete: receive() now reports the end

    async def _wait_drained(self, request: _Request) -> None:
        """Backpressure on a plain response: wait while the client leaves too much unread."""
        timeout = self.state.config.send_timeout
        while not request.disconnected and self._backlog(request.stream_id) > _STREAM_HIGH_WATER:
            request.drained.clear()
            try:
                await asyncio.wait_for(request.drained.wait(), timeout or None)
            except TimeoutError:
                log.info("stream %d: client read nothing for %.1f s; cutting it", request.stream_id, timeout)
                self._reset(request.stream_id, H3_REQUEST_CANCELLED)
                request.disconnect()

    def _backlog(self, stream_id: int) -> int:
        stream = self._quic._streams.get(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return sender._buffer_stop - sender._buffer_start

    def app_failed(self, request: _Request, error: BaseException) -> None:
        if self._terminated or request.disconnected and request.eloquent is None:
            return
        if not request.started:
            self.reject(request, 500, "internal server error", "internal_error")
            return
        stream = request.eloquent
        if stream is not None:
            if not stream.ended:
                self._finish_eloquent(request, stream.fail(f"{type(error).__name__}: {error}", self._loop.time()))
                self._pump_soon()
            return
        if request.sse is not None and self._h3 is not None and not request.finished:
            # Same in-band shape vLLM uses for errors after the 200.
            payload = json.dumps({"error": {"message": "internal server error", "type": "InternalServerError",
                                            "param": None, "code": 500}})
            self._send_data(request.stream_id, format_event(payload), True)
            request.finished = True
            self.transmit()
        else:
            self._reset(request.stream_id, H3_INTERNAL_ERROR)
        request.finished = True

    def request_done(self, request: _Request) -> None:
        """The app task ended; an Eloquent stream lives on until acked or fallen back."""
        request.task = None
        if request.eloquent is None or request.stream_id not in self._eloquent:
            self._requests.pop(request.stream_id, None)

    def _drop_eloquent(self, stream_id: int) -> None:
        entry = self._eloquent.pop(stream_id, None)
        self._queue.discard(stream_id)
        if entry is not None and entry[0].task is None:
            self._requests.pop(stream_id, None)

    # ---- datagram scheduling -----------------------------------------------------------------------------
    def _pump_soon(self) -> None:
        if self._pump_handle is None and not self._terminated:
            self._pump_handle = self._loop.call_soon(self._pump)

    def _room(self) -> int:
        """Bytes the congestion controller would let out now, minus what aioquic already holds."""
        loss = self._quic._loss
        queued = sum(len(d) + 8 for d in self._quic._datagrams_pending)
        return loss.congestion_window - loss.bytes_in_flight - queued

    def _pump(self) -> None:
        self._pump_handle = None
        if self._terminated or self._h3 is None or self.error_code is not None:
            self.transmit()
            return
        now = self._loop.time()
        room = self._room()
        if room <= 0 and not self._quic._datagrams_pending and any(
                (d := s.next_deadline()) is not None and d <= now for _, s in self._eloquent.values()):
            # A stream's probe is due but the window is full: after an outage aioquic only learns that its
            # packets are lost when its own (exponentially backed-off) probe is answered, seconds later.
            # RFC 9002 section 7 lets a probe exceed the window; ours goes out now, in one packet.
            self._quic._probe_pending = True
            room = self._limits.max_datagram_size
        for stream_id, (request, stream) in list(self._eloquent.items()):
            if stream.fallback_due(now):
                self._send_data(stream_id, stream.fallback_record(), True)
                self._drop_eloquent(stream_id)
                continue
            if stream.stalled(now):
                log.info("stream %d: no ack progress for %.1f s; cancelling it", stream_id, stream.ack_timeout)
                self._reset(stream_id, H3_REQUEST_CANCELLED)
                request.disconnect()
                self._drop_eloquent(stream_id)
                continue
            if room > 0:
                self._queue.put(stream_id, stream.datagrams_to_send(now), supersede=stream.supersede)
            if stream.finished:
                self._send_data(stream_id, b"", True)
                self._drop_eloquent(stream_id)
        if room > 0 and self._queue:
            self._send_datagrams(self._queue.take(room))
        self.transmit()
        self._schedule_deadline()

    def _send_datagrams(self, batch: list[tuple[int, bytes]]) -> None:
        assert self._h3 is not None
        limit = self._quic._remote_max_datagram_frame_size or 0
        previous: bytes | None = None
        for stream_id, datagram in batch:
            if len(datagram) + size_uint_var(stream_id // 4) > limit:
                continue  # cannot happen with our budget; never let one jam aioquic's queue
            if datagram is previous or datagram == previous:
                self.transmit()  # a duplicate copy rides its own QUIC packet, or duplicating is pointless
            self._h3.send_datagram(stream_id, datagram)
            previous = datagram

    def _schedule_deadline(self) -> None:
        deadlines = [d for _, s in self._eloquent.values() if (d := s.next_deadline()) is not None]
        deadline = min(deadlines) if deadlines else None
        if deadline == self._deadline_at:
            return
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        self._deadline_at = deadline
        if deadline is not None:
            self._deadline_handle = self._loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_handle = None
        self._deadline_at = None
        self._pump()

    def transmit(self) -> None:
        super().transmit()
        for request in self._requests.values():
            if not request.drained.is_set() and self._backlog(request.stream_id) <= _STREAM_HIGH_WATER:
                request.drained.set()

    async def shutdown(self) -> None:
        for request in self._requests.values():
            if request.body_timer is not None:
                request.body_timer.cancel()
                request.body_timer = None
        tasks = [r.task for r in self._requests.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for handle in (self._deadline_handle, self._pump_handle):
            if handle is not None:
                handle.cancel()


class Http3Server:
    """Handle returned by ``start_http3_server``: ``.port``, ``.host``, ``close()``, timings for benchmarks."""

    def __init__(self, server: QuicServer, state: _ServerState, host: str, port: int,
                 lifespan: Lifespan | None = None) -> None:
        self._server = server
        self._state = state
        self._lifespan = lifespan
        self.host = host
        self.port = port

    def generation_times(self, request_id: str) -> list[float] | None:
        """When each SSE event of a finished request left the app (``time.monotonic`` clock); needs
        ``record_timings``. ``request_id`` is the ``eloquent-request-id`` response header."""
        return self._state.timings.get(request_id)

    @property
    def connections(self) -> int:
        return len(self._state.connections)

    @property
    def connections_closed_with_error(self) -> int:
        return self._state.closed_with_error

    async def close(self) -> None:
        connections = list(self._state.connections)
        self._server.close()
        for conn in connections:
            await conn.shutdown()
        self._state.connections.clear()
        if self._lifespan is not None:
            await self._lifespan.shutdown()
            self._lifespan = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def quic_server_configuration(config: StreamConfig, options: FrontEndOptions) -> QuicConfiguration:
    pair = resolve_certificate(config.certfile, config.keyfile)
    quic = QuicConfiguration(alpn_protocols=ALPN, is_client=False, max_datagram_frame_size=65536,
                             max_datagram_size=QUIC_MAX_DATAGRAM_SIZE, idle_timeout=options.idle_timeout,
                             congestion_control_algorithm=options.congestion_control)
    try:
        quic.load_cert_chain(pair.certfile, pair.keyfile)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load TLS certificate {pair.certfile} / key {pair.keyfile}: {exc}") from None
    return quic


async def start_http3_server(app: Callable[..., Any], *, host: str, port: int, config: StreamConfig,
                             plugin_manager: Any = None, options: FrontEndOptions | None = None,
                             lifespan: bool = False) -> Http3Server:
    """Serve ``app`` over HTTP/3 on UDP ``host:port`` (0: any free port; read ``.port``).

    ``lifespan=True`` runs the app's ASGI lifespan (startup now, shutdown on ``close()``): set it when no other
    server (uvicorn) runs the same app.
    """
    options = options or FrontEndOptions()
    if options.idle_timeout <= 0 or options.fallback_after <= 0:
        raise ConfigError("idle_timeout and fallback_after must be > 0")
    state = _ServerState(app, config, options, plugin_manager)
    quic = quic_server_configuration(config, options)
    manager = None
    if lifespan:
        manager = Lifespan(app)
        await manager.startup()
    server = await serve(host, port, configuration=quic,
                         create_protocol=partial(Http3Connection, state=state))
    bound = server._transport.get_extra_info("sockname") if server._transport else (host, port)
    return Http3Server(server, state, host, int(bound[1]), manager)
