"""WebTransport on the HTTP/3 front end: browser sessions carrying Eloquent requests (docs/BROWSER.md).

A browser opens a session (extended CONNECT, ``:protocol webtransport``) on the front end's UDP port, at
``FrontEndOptions.webtransport_path``. Each request is one bidirectional WebTransport stream: a JSON head line
(``{"method", "path", "headers"}``) and the body, exactly what the HTTP route takes. It becomes an ordinary
``Request`` of the connection (same ASGI app, so the SSE middleware's ids and resume apply, same guards, same
``EloquentResponseStream``); only the wire differs:

- the response head is a JSON status line ``{"status", "headers", "stream_id"}`` on the stream, and the body
  (control records of the datagram path: trailer, fallback; or an error body) follows it as raw stream bytes;
- the Eloquent packets (their stream id field is the WebTransport stream's id) travel in the SESSION's
  datagrams, and the browser's acks come back the same way, routed by the packet's stream id.

A session that ends (the CONNECT stream closed or reset) takes its requests with it: the browser continues each
one over SSE with ``Last-Event-ID``.

A head line that has not ended is held in the server's ledger of incomplete requests (``transports/body_budget.py``:
per connection, per address, in all) and keeps to the same pace as a body, within ``body_timeout`` of the stream's
start; past either, the stream gets its refusal as a status line (``429``/``413``/``503``/``408``).

Browsers apply no CORS to WebTransport, so the session's ``Origin`` is checked here against the same policy as
CORS (``FrontEndOptions.cors_origins``, ``--cors-origin``; same-origin pages always): another origin gets 403.
The ``Origin`` the app sees on each request is the CONNECT's, whatever the request's JSON head says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aioquic.h3.events import HeadersReceived, WebTransportStreamDataReceived

from eloquent_plugins.core.errors import DecodeError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import H3_NO_ERROR, H3_REQUEST_CANCELLED
from eloquent_plugins.core.wire import peek_stream_id
from eloquent_plugins.transports.body_budget import BodyClock, HeldBody
from eloquent_plugins.transports.cors import OriginPolicy
from eloquent_plugins.transports.http3.guards import Rejection
from eloquent_plugins.transports.http3.state import ServerState

log = logging.getLogger("eloquent_plugins.transports.http3")

MAX_HEAD_BYTES = 64 << 10
"""Longest JSON head line a request stream may send (the JS client's limit for the status line too)."""
CLOSED_PRUNE = 64
"""Past this many ended request streams remembered, those aioquic has discarded are forgotten (``forget``)."""


class SessionRequest(Protocol):
    """What the sessions do with a request their stream carries: feed it the body, tell it the session ended."""

    def on_body(self, data: bytes, ended: bool) -> None: ...

    def disconnect(self) -> None: ...


class RawStreams(Protocol):
    """Where a WebTransport stream's raw bytes go (aioquic's ``QuicConnection``: no HTTP/3 framing on them)."""

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None: ...


class SessionHost(Protocol):
    """What the WebTransport sessions need of their connection (``Http3Connection``): the shared state, the
    loop, its limits, the wire, and the requests it runs for the sessions' streams."""

    state: ServerState
    limits: Limits

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def quic(self) -> RawStreams: ...
    @property
    def requests(self) -> Mapping[int, SessionRequest]: ...

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> bool: ...
    def transmit(self) -> None: ...
    def reset(self, stream_id: int, code: int) -> None: ...
    def stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None: ...
    def drop_stream(self, stream_id: int) -> None: ...
    def stream_alive(self, stream_id: int) -> bool: ...  # frames for it may still come (aioquic keeps it)
    def hold_body(self) -> HeldBody: ...
    def open_request(self, stream_id: int, method: bytes | None, path: bytes | None,
                     headers: list[tuple[bytes, bytes]], *, ended: bool, transport: str = "h3",
                     refusal: Rejection | None = None) -> SessionRequest | None: ...


@dataclass(slots=True)
class Session:
    session_id: int
    authority: bytes | None
    origin: bytes | None
    streams: set[int] = field(default_factory=set)


@dataclass(slots=True)
class PendingHead:
    """A request stream whose JSON head line is not complete yet: its bytes, what they hold in the ledger, their
    pace, and the one timer that checks it (moved lazily, as a body's)."""

    session_id: int
    held: HeldBody
    clock: BodyClock
    limit: float | None
    """``body_timeout`` after the stream's first bytes: the whole head is due by then, however it trickles."""
    buffer: bytearray = field(default_factory=bytearray)
    timer: asyncio.TimerHandle | None = None

    def deadline(self) -> float | None:
        pace = self.clock.deadline()
        return self.limit if pace is None else pace if self.limit is None else min(pace, self.limit)

    def forget(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.held.release()


def is_session_request(event: HeadersReceived) -> bool:
    """An extended CONNECT for WebTransport."""
    pseudo = {k: v for k, v in event.headers if k.startswith(b":")}
    return pseudo.get(b":method") == b"CONNECT" and pseudo.get(b":protocol") == b"webtransport"


def parse_head(line: bytes) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
    """The request head line: method, path and headers (lower-cased names), or DecodeError."""
    try:
        head = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise DecodeError("the WebTransport request head is not JSON") from None
    if not isinstance(head, dict):
        raise DecodeError("the WebTransport request head must be a JSON object")
    method, path, headers = head.get("method", "POST"), head.get("path"), head.get("headers", {})
    if not isinstance(method, str) or not method.isalpha() or not isinstance(path, str) or not path.startswith("/"):
        raise DecodeError("the WebTransport request head needs a method and a path starting with /")
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in headers.items()):
        raise DecodeError("the WebTransport request headers must be an object of strings")
    try:
        pairs = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
                 if not k.startswith(":")]
    except UnicodeEncodeError:
        raise DecodeError("WebTransport request headers must be latin-1") from None
    return method.upper().encode(), path.encode("utf-8"), pairs


def status_line(headers: list[tuple[bytes, bytes]], stream_id: int) -> bytes:
    """The response head for the browser: ``{"status", "headers", "stream_id"}`` and a newline."""
    status, out = 200, {}
    for key, value in headers:
        if key == b":status":
            status = int(value)
        elif not key.startswith(b":"):
            name, text = key.decode("latin-1"), value.decode("latin-1")
            out[name] = f"{out[name]}, {text}" if name in out else text
    return json.dumps({"status": status, "headers": out, "stream_id": stream_id},
                      separators=(",", ":")).encode() + b"\n"


class WebTransportSessions:
    """The WebTransport sessions of one connection and the request streams they carry."""

    def __init__(self, conn: SessionHost, path: str, policy: OriginPolicy | None = None) -> None:
        self.conn = conn
        self.path = path.encode()
        self.policy = policy or OriginPolicy()
        self.sessions: dict[int, Session] = {}
        self.stream_session: dict[int, int] = {}
        """Request stream id -> its session id (for the datagram prefix, the wire, and routing acks)."""
        self.pending: dict[int, PendingHead] = {}
        self.closed: set[int] = set()
        """Request streams that ended here while bytes for them may still arrive (they are dropped). Not "every id
        below the highest seen": under loss a stream's first bytes can come after a later stream's."""

    # ---- sessions ----------------------------------------------------------------------------------------
    def open_session(self, event: HeadersReceived) -> None:
        conn = self.conn
        pseudo = {k: v for k, v in event.headers if k.startswith(b":")}
        origin = next((v for k, v in event.headers if k == b"origin"), None)
        path = (pseudo.get(b":path") or b"").partition(b"?")[0]
        if path != self.path:
            status = b"404"
        elif not self.policy.allows(origin, pseudo.get(b":authority")):
            status = b"403"  # a page on an origin the CORS policy excludes (browsers leave this check to us)
        elif len(self.sessions) >= conn.limits.max_streams:
            status = b"429"
        else:
            status = b"200"
        headers = [(b":status", status)]
        if status == b"200":
            self.sessions[event.stream_id] = Session(event.stream_id, pseudo.get(b":authority"), origin)
            headers.append((b"sec-webtransport-http3-draft", b"draft02"))
        if conn.send_headers(event.stream_id, headers, end_stream=status != b"200"):
            conn.transmit()
        log.debug("WebTransport session %d on %r from %r: %s", event.stream_id, path, origin, status.decode())

    def is_session(self, stream_id: int) -> bool:
        return stream_id in self.sessions

    def session_data(self, stream_id: int, ended: bool) -> bool:
        """Data on a CONNECT stream (capsules: ignored); its end closes the session. False: not a session."""
        if stream_id not in self.sessions:
            return False
        if ended:
            self.close_session(stream_id)
        return True

    def stream_gone(self, stream_id: int) -> None:
        """A stream was reset or stopped by the peer: a session ends, a pending head is forgotten."""
        if stream_id in self.sessions:
            self.close_session(stream_id)
        pending = self.pending.pop(stream_id, None)
        if pending is not None:
            pending.forget()

    def close_session(self, session_id: int) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        conn = self.conn
        for stream_id in sorted(session.streams):
            self.stream_gone(stream_id)
            request = conn.requests.get(stream_id)
            if request is not None:
                request.disconnect()
            conn.drop_stream(stream_id)
            conn.reset(stream_id, H3_REQUEST_CANCELLED)
            self.stream_session.pop(stream_id, None)
        with contextlib.suppress(Exception):  # our side of the CONNECT stream may be closed already
            conn.quic.send_stream_data(session_id, b"", end_stream=True)
        conn.transmit()

    # ---- request streams ---------------------------------------------------------------------------------
    def stream_data(self, event: WebTransportStreamDataReceived) -> None:
        conn = self.conn
        stream_id = event.stream_id
        if stream_id in conn.requests:
            conn.requests[stream_id].on_body(event.data, event.stream_ended)
            return
        pending = self.pending.get(stream_id)
        if pending is None and (stream_id in self.stream_session or stream_id in self.closed):
            return  # a finished or refused request: late bytes are dropped
        session = self.sessions.get(event.session_id)
        if session is None or stream_id % 4 != 0:  # unknown session, or a unidirectional stream: not ours
            conn.stop_reading(stream_id, H3_REQUEST_CANCELLED)
            return
        if pending is None:
            now, config = conn.loop.time(), conn.state.config
            pending = self.pending[stream_id] = PendingHead(
                event.session_id, conn.hold_body(), BodyClock.from_config(config, now),
                now + config.body_timeout if config.body_timeout > 0 else None)
            self.stream_session[stream_id] = event.session_id
            session.streams.add(stream_id)
            self._arm(stream_id, pending)
        newline = event.data.find(b"\n")
        if newline < 0 and not event.stream_ended:  # the head goes on: held, at its pace, until its newline
            pending.clock.arrived(len(event.data), conn.loop.time())
            refusal = pending.held.hold(len(event.data))
            if refusal is not None:
                self._refuse(stream_id, Rejection.of(refusal))
                return
        pending.buffer += event.data
        newline = pending.buffer.find(b"\n")
        if newline < 0:
            if len(pending.buffer) > MAX_HEAD_BYTES:
                self._refuse(stream_id, Rejection(431, "WebTransport request head too long", "invalid_request"))
            elif event.stream_ended:
                self._refuse(stream_id, Rejection(400, "WebTransport request without a head line",
                                                  "invalid_request"))
            return
        self.stream_gone(stream_id)  # the head is complete: no longer pending
        line, rest = bytes(pending.buffer[:newline]), bytes(pending.buffer[newline + 1:])
        try:
            method, path, headers = parse_head(line)
        except DecodeError as exc:
            self._refuse(stream_id, Rejection(400, str(exc), "invalid_request"))
            return
        if session.authority and not any(k == b"host" for k, _ in headers):
            headers.insert(0, (b"host", session.authority))
        headers = [(k, v) for k, v in headers if k != b"origin"]  # the CONNECT's Origin only (checked)
        if session.origin:
            headers.append((b"origin", session.origin))
        request = conn.open_request(stream_id, method, path, headers, ended=False, transport="webtransport")
        if request is not None:
            request.on_body(rest, event.stream_ended)

    def _refuse(self, stream_id: int, refusal: Rejection) -> None:
        self.stream_gone(stream_id)
        self.conn.open_request(stream_id, None, None, [], ended=True, transport="webtransport", refusal=refusal)
        self.conn.stop_reading(stream_id)  # the refusal is the whole answer: no more of this stream is read

    def _arm(self, stream_id: int, pending: PendingHead) -> None:
        deadline = pending.deadline()
        if deadline is not None:
            pending.timer = self.conn.loop.call_at(deadline, self._head_timeout, stream_id)

    def _head_timeout(self, stream_id: int) -> None:
        pending = self.pending.get(stream_id)
        if pending is None:
            return
        pending.timer = None
        now = self.conn.loop.time()
        deadline = pending.deadline()
        if deadline is not None and now < deadline:  # bytes moved the pace's deadline on since the timer was set
            self._arm(stream_id, pending)
            return
        if pending.limit is not None and now >= pending.limit:
            self.conn.state.held.count("stalled")
            refusal = Rejection(408, "WebTransport request head not received in time", 408,
                                error_type="request_timeout")
        else:
            pace = pending.clock.refusal(now)
            self.conn.state.held.count(pace.reason)
            refusal = Rejection(408, f"WebTransport request head too slow: under {pending.clock.min_rate:g} bytes/s",
                                408, error_type="request_timeout")
        self._refuse(stream_id, refusal)

    # ---- the wire ----------------------------------------------------------------------------------------
    def carries(self, stream_id: int) -> bool:
        """A WebTransport request stream (its bytes are raw, its datagrams go on its session)."""
        return stream_id in self.stream_session

    def datagram_target(self, stream_id: int) -> int:
        """The stream id whose quarter prefixes the HTTP/3 datagram: the session's for WebTransport."""
        return self.stream_session.get(stream_id, stream_id)

    def route_datagram(self, session_id: int, data: bytes) -> int | None:
        """The request stream a session datagram is for (the packet's stream id), None when it names no
        stream of this session. Raises DecodeError for a datagram that is no Eloquent packet."""
        stream_id = peek_stream_id(data)
        return stream_id if self.stream_session.get(stream_id) == session_id else None

    def write_head(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.conn.quic.send_stream_data(stream_id, status_line(headers, stream_id), end_stream=False)

    def write(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.conn.quic.send_stream_data(stream_id, data, end_stream=end_stream)

    def forget(self, stream_id: int) -> None:
        """A request stream is over on both sides."""
        session_id = self.stream_session.pop(stream_id, None)
        if session_id is not None and (session := self.sessions.get(session_id)) is not None:
            session.streams.discard(stream_id)
        if session_id is not None:
            self.closed.add(stream_id)
            if len(self.closed) > CLOSED_PRUNE:
                self.closed = {s for s in self.closed if self.conn.stream_alive(s)}

    def close(self) -> None:
        for pending in self.pending.values():
            pending.forget()
        self.pending.clear()
