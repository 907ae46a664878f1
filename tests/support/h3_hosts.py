"""Small real hosts for the HTTP/3 front end's children: a ``RequestHost`` for ``transports.http3.request.Request``
and a ``SessionHost`` for ``transports.http3.webtransport.WebTransportSessions``. Each records what its child
put on the wire, so a request or a WebTransport session is tested without a QUIC connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.core.codecs import BUILTIN_CODECS
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.protocol import H3_NO_ERROR
from eloquent_plugins.core.scheme import Scheme
from eloquent_plugins.core.sender_config import SenderConfig
from eloquent_plugins.transports.body_budget import HeldBody
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.guards import Rejection, connection_limits
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.request import Request
from eloquent_plugins.transports.http3.state import ServerState


def server_state(app: Any = None, config: StreamConfig | None = None,
                 options: FrontEndOptions | None = None) -> ServerState:
    options = options or FrontEndOptions()
    return ServerState(app, config or StreamConfig(), options, None,
                       CodecRouter({codec.name: codec for codec in BUILTIN_CODECS}))


@dataclass
class Wire:
    """What went out, in order: ("headers", stream, fields, end) / ("data", stream, bytes, end) / ("reset", ...)."""

    sent: list[tuple[Any, ...]] = field(default_factory=list)

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [entry for entry in self.sent if entry[0] == kind]

    def body(self, stream_id: int) -> bytes:
        return b"".join(e[2] for e in self.sent if e[0] in ("data", "raw") and e[1] == stream_id)

    def status(self, stream_id: int) -> int:
        fields = next(e[2] for e in self.sent if e[0] == "headers" and e[1] == stream_id)
        return int(dict(fields)[b":status"])


class RecordingRequestHost:
    """A ``RequestHost``: the connection's side of one or more requests, with the wire recorded."""

    def __init__(self, state: ServerState, *, datagrams: bool = False, rtt: float | None = None) -> None:
        self.state = state
        self.limits = connection_limits(state.config.limits)
        self.rtt = rtt
        """The connection's measured RTT (None: no sample yet), as ``Http3Connection`` reads aioquic's."""
        self.terminated = False
        self.error_code: int | None = None
        self.wire = Wire()
        self.datagrams = datagrams
        self.tracked: list[Request] = []
        self.pumped: list[int] = []
        self.done: list[Request] = []
        self.forgotten: list[Request] = []
        self.transmits = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @property
    def negotiated(self) -> bool:
        return True

    @property
    def peer_accepts_datagrams(self) -> bool:
        return self.datagrams

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> bool:
        self.wire.sent.append(("headers", stream_id, headers, end_stream))
        return True

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> bool:
        self.wire.sent.append(("data", stream_id, data, end_stream))
        return True

    def reset(self, stream_id: int, code: int) -> None:
        self.wire.sent.append(("reset", stream_id, code))

    def stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None:
        self.wire.sent.append(("stop", stream_id, code))

    def backlog(self, stream_id: int) -> int:
        return 0

    def sender_config(self, scheme: Scheme, codec: str, body_head: bytearray | None) -> SenderConfig:
        return self.state.sender_config(scheme, self.limits, codec, body_head, self.rtt)

    def transmit(self) -> None:
        self.transmits += 1

    def track_eloquent(self, request: Request) -> None:
        self.tracked.append(request)

    def pump_stream(self, stream_id: int) -> None:
        self.pumped.append(stream_id)

    def pump_soon(self) -> None:
        self.pumped.append(-1)

    def request_done(self, request: Request) -> None:
        request.task = None
        self.done.append(request)

    def forget(self, request: Request) -> None:
        self.forgotten.append(request)


class RecordedRequest:
    """A ``SessionRequest``: what a WebTransport stream fed the request it opened."""

    def __init__(self, head: tuple[Any, ...], refusal: Rejection | None) -> None:
        self.head = head
        self.refusal = refusal
        self.body: list[tuple[bytes, bool]] = []
        self.disconnected = False

    def on_body(self, data: bytes, ended: bool) -> None:
        self.body.append((data, ended))

    def disconnect(self) -> None:
        self.disconnected = True


class RawRecorder:
    """Stands in for aioquic's ``QuicConnection.send_stream_data`` (the ``RawStreams`` a session writes to)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        self.wire.sent.append(("raw", stream_id, data, end_stream))


class RecordingSessionHost:
    """A ``SessionHost``: opens a ``RecordedRequest`` for each stream head a session completes."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.limits = connection_limits(state.config.limits)
        self.wire = Wire()
        self._raw = RawRecorder(self.wire)
        self.opened: dict[int, RecordedRequest] = {}
        self.dropped: list[int] = []
        self.refusals: list[tuple[int, Rejection]] = []
        self.discarded: set[int] = set()
        """Streams a test says aioquic has forgotten (``stream_alive``)."""
        self.on_open: Callable[[RecordedRequest], None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @property
    def quic(self) -> RawRecorder:
        return self._raw

    @property
    def requests(self) -> dict[int, RecordedRequest]:
        return self.opened

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> bool:
        self.wire.sent.append(("headers", stream_id, headers, end_stream))
        return True

    def transmit(self) -> None:
        pass

    def reset(self, stream_id: int, code: int) -> None:
        self.wire.sent.append(("reset", stream_id, code))

    def stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None:
        self.wire.sent.append(("stop", stream_id, code))

    def drop_stream(self, stream_id: int) -> None:
        self.dropped.append(stream_id)

    def hold_body(self) -> HeldBody:
        return self.state.held.open(self, "127.0.0.1")

    def stream_alive(self, stream_id: int) -> bool:
        return stream_id not in self.discarded

    def open_request(self, stream_id: int, method: bytes | None, path: bytes | None,
                     headers: list[tuple[bytes, bytes]], *, ended: bool, transport: str = "h3",
                     refusal: Rejection | None = None) -> RecordedRequest | None:
        if refusal is not None:
            self.refusals.append((stream_id, refusal))
            return None
        request = self.opened[stream_id] = RecordedRequest((method, path, headers, ended, transport), refusal)
        return request


def head_line(method: str = "POST", path: str = "/v1/chat/completions", **headers: str) -> bytes:
    return json.dumps({"method": method, "path": path, "headers": headers}).encode() + b"\n"
