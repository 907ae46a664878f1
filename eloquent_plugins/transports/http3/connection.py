"""One client connection of the HTTP/3 front end: QUIC and HTTP/3 events in, dispatched to requests, and the
wire out. Network events and timers end in ``pump``, an app's send in ``pump_stream``: both run the connection's
``pump.DatagramPump`` (the datagram scheduler's plan and its timer). Its lifecycle is ``lifecycle.ConnectionState``.

A client that breaks the protocol (garbage datagrams, acks for events never sent, ack floods, datagrams for no
live stream beyond a token bucket) has this connection closed with the error's code; other connections go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aioquic.h3.events import DatagramReceived, DataReceived, H3Event, HeadersReceived
from aioquic.h3.events import WebTransportStreamDataReceived as WebTransportData
from aioquic.quic.events import ConnectionTerminated, ProtocolNegotiated, QuicEvent, StopSendingReceived, StreamReset

from eloquent_plugins.core.errors import LimitExceeded, ProtocolError
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.hooks.specs import StreamInfo
from eloquent_plugins.core.protocol import H3_NO_ERROR
from eloquent_plugins.core.scheme import Scheme, UnknownScheme, scheme_for
from eloquent_plugins.core.sender_config import SenderConfig
from eloquent_plugins.h3glue.common import (
    ALPN,
    DatagramH3Connection,
    H3Protocol,
    close_code,
    disable_pacing,
    peer_address,
    peer_closed,
    smoothed_rtt,
    stream_alive,
    stream_send_backlog,
)
from eloquent_plugins.transports.asgi import HOOKS_EXTENSION, PACING_EXTENSION
from eloquent_plugins.transports.body_budget import HeldBody
from eloquent_plugins.transports.http3.guards import (
    STREAM_HIGH_WATER,
    Rejection,
    admit,
    connection_limits,
    unroutable_bucket,
)
from eloquent_plugins.transports.http3.lifecycle import ConnectionState, advance
from eloquent_plugins.transports.http3.request import Request
from eloquent_plugins.transports.http3.scope import http_scope
from eloquent_plugins.transports.http3.pump import DatagramPump
from eloquent_plugins.transports.http3.scheduler import DatagramScheduler
from eloquent_plugins.transports.http3.state import ServerState
from eloquent_plugins.transports.http3.webtransport import WebTransportSessions, is_session_request
from eloquent_plugins.transports.metrics import TRANSPORT_EXTENSION, h3_transport

log = logging.getLogger("eloquent_plugins.transports.http3")


class Http3Connection(H3Protocol):
    def __init__(self, *args: Any, state: ServerState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = state
        self.h3: DatagramH3Connection | None = None
        self.requests: dict[int, Request] = {}
        self.limits = connection_limits(state.config.limits)
        self.scheduler = DatagramScheduler(self.limits.max_datagram_size)
        self._unroutable = unroutable_bucket(self.loop.time())
        self.datagram_pump = DatagramPump(self, self.scheduler)
        self.lifecycle = ConnectionState.CONNECTING
        """Where the connection is in its life (``lifecycle.ConnectionState``; moves only by ``_enter``)."""
        self.error_code: int | None = None
        """The code this end closed the connection with (``FAILED``)."""
        self.next_request_stream = 0
        """The lowest client request stream id not seen yet (what a GOAWAY names)."""
        path = state.options.webtransport_path
        self.webtransport = WebTransportSessions(self, path, state.options.origin_policy()) if path else None
        """Browser sessions (docs/BROWSER.md); None when ``webtransport_path`` is off."""
        if not state.options.pacing:
            disable_pacing(self.quic)
        state.connections.add(self)

    def _enter(self, state: ConnectionState) -> None:
        self.lifecycle = advance(self.lifecycle, state)

    @property
    def terminated(self) -> bool:
        return self.lifecycle is ConnectionState.TERMINATED

    @property
    def negotiated(self) -> bool:
        """HTTP/3 was negotiated (ALPN h3): requests can be answered."""
        return self.h3 is not None

    @property
    def peer_accepts_datagrams(self) -> bool:
        return self.h3 is not None and self.h3.peer_accepts_datagrams

    @property
    def carries_streams(self) -> bool:
        """A request or a WebTransport session is live: the listener never closes this connection to admit
        another, and its idle clock does not run (``h3glue.connection_caps``)."""
        return bool(self.requests) or (self.webtransport is not None and bool(self.webtransport.sessions))

    # ---- network -----------------------------------------------------------------------------------------
    def after_input(self) -> None:
        if not self.terminated and peer_closed(self.quic):
            self._gone()  # the client closed the connection: its readers are gone now, not 3 x PTO later
        self.acknowledge_now()  # QUIC's ACK of the input (a client's ack datagram) goes now, not in a token's packet
        self.pump()

    def after_timer(self) -> None:
        self.pump()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ProtocolNegotiated):
            if event.alpn_protocol in ALPN and self.lifecycle is ConnectionState.CONNECTING:
                self.h3 = DatagramH3Connection(self.quic, webtransport=self.webtransport is not None)
                self._enter(ConnectionState.OPEN)
                drain = self.state.drain
                if drain is not None and drain.draining:
                    self.goaway()
        elif isinstance(event, ConnectionTerminated):
            self.state.connections.discard(self)
            if not self.terminated:
                self._gone()
        elif isinstance(event, StreamReset | StopSendingReceived):
            request = self.requests.get(event.stream_id)
            if request is not None:
                request.disconnect()
            self._drop_eloquent(event.stream_id)
            if self.webtransport is not None:
                self.webtransport.stream_gone(event.stream_id)
        if self.h3 is not None and not self.terminated:
            for h3_event in self.h3.handle_event(event):
                if self.lifecycle is not ConnectionState.FAILED:
                    self._h3_event(h3_event)

    def _gone(self) -> None:
        """The peer is gone (its CONNECTION_CLOSE arrived, or QUIC ended the connection): every request hears
        ``http.disconnect`` now, so the engine stops generating for readers that left."""
        self._enter(ConnectionState.TERMINATED)
        for request in list(self.requests.values()):
            request.disconnect()
        self.scheduler.clear()
        self.datagram_pump.cancel()

    def _h3_event(self, event: H3Event) -> None:
        wt = self.webtransport
        if isinstance(event, HeadersReceived):
            if event.stream_id in self.requests or wt is not None and wt.is_session(event.stream_id):
                return  # trailers from the client: nothing to do with them
            if wt is not None and is_session_request(event):
                wt.open_session(event)
            else:
                self._new_request(event)
        elif isinstance(event, DataReceived):
            if wt is not None and wt.session_data(event.stream_id, event.stream_ended):
                return
            request = self.requests.get(event.stream_id)
            if request is not None:
                request.on_body(event.data, event.stream_ended)
        elif isinstance(event, WebTransportData):
            if wt is not None:
                wt.stream_data(event)
        elif isinstance(event, DatagramReceived):
            self._route_datagram(event.stream_id, event.data)

    def _route_datagram(self, stream_id: int, data: bytes) -> None:
        now = self.loop.time()
        wt = self.webtransport
        if wt is not None and wt.is_session(stream_id):
            try:  # a session's datagram: the Eloquent packet names its request stream
                routed = wt.route_datagram(stream_id, data)
            except ProtocolError as exc:
                self.fail(exc)
                return
            stream_id = -1 if routed is None else routed
        stream = self.scheduler.get(stream_id)
        if stream is None:
            # Late acks after a stream finished, or datagrams ahead of their request, are normal; drop them,
            # but a client that keeps sending datagrams nobody asked for is cut off.
            if not self._unroutable.take(now):
                self.fail(LimitExceeded("too many datagrams for no live Eloquent stream"))
            return
        try:
            stream.receive_datagram(data, now)
        except ProtocolError as exc:
            self.fail(exc)

    def fail(self, error: ProtocolError) -> None:
        """Close the whole connection with the error's code (the peer broke the protocol)."""
        if self.lifecycle in (ConnectionState.FAILED, ConnectionState.TERMINATED):
            return
        self._enter(ConnectionState.FAILED)
        self.error_code = close_code(error)
        self.state.closed_with_error += 1
        log.info("closing connection: %s (code 0x%x)", error, self.error_code)
        self.quic.close(error_code=self.error_code, reason_phrase=str(error)[:200])
        self.transmit()
        for request in list(self.requests.values()):
            request.disconnect()
        self.scheduler.clear()

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
        self.next_request_stream = max(self.next_request_stream, event.stream_id + 4)
        if b":authority" in pseudo and not any(k == b"host" for k, _ in headers):
            headers.insert(0, (b"host", pseudo[b":authority"]))
        self.open_request(event.stream_id, method, path, headers, ended=event.stream_ended)

    def open_request(self, stream_id: int, method: bytes | None, path: bytes | None,
                     headers: list[tuple[bytes, bytes]], *, ended: bool, transport: str = "h3",
                     refusal: Rejection | None = None) -> Request | None:
        """A new request on ``stream_id`` (an HTTP/3 request or a WebTransport stream), its app started; None
        when it was refused (``refusal``, or by admission)."""
        try:
            scheme, bad_scheme = scheme_for(headers), None
        except UnknownScheme as exc:
            scheme, bad_scheme = Scheme.STREAM, str(exc)
        scope = http_scope(method, path, headers, client=peer_address(self.quic), server=self.sockname())
        scope["extensions"][TRANSPORT_EXTENSION] = h3_transport(  # the metrics' and logs' transport label
            transport, datagrams=scheme is not Scheme.STREAM and self.peer_accepts_datagrams)
        # A request without :path gets the default (OpenAI) error shape, not the one of the route "/".
        codec = self.state.codecs.for_path(scope["path"] if path is not None else "")
        request = Request(self, stream_id, scope, scheme, codec)
        self.requests[stream_id] = request
        declared = dict(headers).get(b"content-length")
        refusal = refusal or admit(self.state.config, method=method, path=path, bad_scheme=bad_scheme,
                                   running=sum(1 for r in self.requests.values() if r.task is not None),
                                   content_length=declared)
        if refusal is not None:
            request.reject(refusal)
            return None
        if not ended:  # its body comes after the head: held in the ledger until it is in
            request.body.hold(self.hold_body(), int(declared) if declared else 0)
        request.hooks = StreamHooks(self.state.plugin_manager, StreamInfo(
            request.request_id, route=scope["path"], transport=transport, codec="raw"))
        scope["extensions"][HOOKS_EXTENSION] = {  # an EloquentMiddleware in the app claims the hooks (request.py)
            "transport": "eloquent" if scheme is not Scheme.STREAM and self.peer_accepts_datagrams else transport,
            "claimed": False}
        if self.state.config.send_tick and scheme is not Scheme.STREAM and self.peer_accepts_datagrams:
            scope["extensions"][PACING_EXTENSION] = self.state.config.send_tick  # its senders pace (request.py)
        if ended:
            request.on_body(b"", True)
        else:
            request.arm_body_timer()
        request.task = self.loop.create_task(request.run())
        return request

    def hold_body(self) -> HeldBody:
        """A place in the server's ledger of incomplete bodies and heads, for this connection and its address."""
        address = peer_address(self.quic)
        return self.state.held.open(self, str(address[0]) if address else None)

    def sender_config(self, scheme: Scheme, codec: str, body_head: bytearray | None) -> SenderConfig:
        """A new Eloquent response's sender settings, its RTT estimate starting from this connection's."""
        return self.state.sender_config(scheme, self.limits, codec, body_head, smoothed_rtt(self.quic))

    def request_done(self, request: Request) -> None:
        """The app task ended; an Eloquent stream lives on until acked or fallen back."""
        request.task = None
        if request.eloquent is None or request.stream_id not in self.scheduler:
            self._remove(request.stream_id)

    def forget(self, request: Request) -> None:
        self._remove(request.stream_id)

    def _remove(self, stream_id: int) -> None:
        self.requests.pop(stream_id, None)
        if self.webtransport is not None:
            self.webtransport.forget(stream_id)
        if self.lifecycle is ConnectionState.CLOSING and not self.requests:
            self.close_drained()

    def track_eloquent(self, request: Request) -> None:
        assert request.eloquent is not None
        self.scheduler.add(request.eloquent)

    def _drop_eloquent(self, stream_id: int) -> None:
        if self.scheduler.drop(stream_id):
            self.forget_if_idle(stream_id)

    drop_stream = _drop_eloquent  # a WebTransport session ended: its requests' datagrams stop

    def stream_alive(self, stream_id: int) -> bool:
        return stream_alive(self.quic, stream_id)

    def forget_if_idle(self, stream_id: int) -> None:
        """A stream left the scheduler: its request goes too unless its app is still running."""
        request = self.requests.get(stream_id)
        if request is not None and request.eloquent is not None and request.task is None:
            self._remove(stream_id)

    # ---- the wire ----------------------------------------------------------------------------------------
    def stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None:
        """Ask the client to stop sending the request (RFC 9114 4.1: H3_NO_ERROR when the response is
        complete without the rest of it)."""
        with contextlib.suppress(Exception):  # the client may have closed its side already
            self.quic.stop_stream(stream_id, code)

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> bool:
        assert self.h3 is not None
        try:
            if self.webtransport is not None and self.webtransport.carries(stream_id):
                self.webtransport.write_head(stream_id, headers)
            else:
                self.h3.send_headers(stream_id, headers, end_stream=end_stream)
        except Exception:  # noqa: BLE001 - the client stopped the stream first
            self._lost(stream_id)
            return False
        return True

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> bool:
        """Write on a request stream; False (and the request counts as gone) if the client closed it."""
        assert self.h3 is not None
        try:
            if self.webtransport is not None and self.webtransport.carries(stream_id):
                self.webtransport.write(stream_id, data, end_stream)
            else:
                self.h3.send_data(stream_id, data, end_stream=end_stream)
        except Exception:  # noqa: BLE001 - aioquic raises several types for a stream the peer stopped
            self._lost(stream_id)
            return False
        return True

    def _lost(self, stream_id: int) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.disconnect()

    def reset(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(Exception):  # the stream may already be closed on our side
            self.quic.reset_stream(stream_id, code)
        self.transmit()

    def backlog(self, stream_id: int) -> int:
        return stream_send_backlog(self.quic, stream_id)

    def transmit(self) -> None:
        super().transmit()
        for request in self.requests.values():
            if not request.drained.is_set() and self.backlog(request.stream_id) <= STREAM_HIGH_WATER:
                request.drained.set()

    # ---- datagram scheduling (``pump.DatagramPump``) ------------------------------------------------------
    def pump(self) -> None:
        self.datagram_pump.run()

    def pump_soon(self) -> None:
        self.datagram_pump.soon()

    def pump_stream(self, stream_id: int) -> None:
        """The app pushed events on ``stream_id``: their datagrams leave now (``DatagramPump.stream``)."""
        self.datagram_pump.stream(stream_id)

    def goaway(self) -> None:
        """The server drains: tell the client to open new requests elsewhere (requests that still come get the
        middleware's 503; those under way go on)."""
        if self.h3 is not None and self.lifecycle is ConnectionState.OPEN:
            if self.h3.send_goaway(self.next_request_stream):
                self._enter(ConnectionState.GOING_AWAY)
            self.transmit()

    def close_drained(self, *, force: bool = False) -> None:
        """The drain is over: close, so that a client goes elsewhere. A connection still delivering a stream's
        last datagrams (acks, trailer) closes when that is done, unless ``force`` (streams were handed over at the
        deadline: their clients resume elsewhere now)."""
        if self.lifecycle in (ConnectionState.OPEN, ConnectionState.GOING_AWAY):
            self._enter(ConnectionState.CLOSING)
        if self.requests and not force:
            return
        if not self.terminated:
            self.quic.close(error_code=H3_NO_ERROR, reason_phrase="server drained")
            self.transmit()

    async def shutdown(self) -> None:
        if self.webtransport is not None:
            self.webtransport.close()
        for request in self.requests.values():
            request.cancel_body_timer()
            request.body.release()
        tasks = [r.task for r in self.requests.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.datagram_pump.cancel()
