"""A small WebTransport client on aioquic, speaking the browser's side of docs/BROWSER.md: a session (extended
CONNECT), one bidirectional stream per request (JSON head line + body), the JSON status line and control records
back, Eloquent packets in the session's datagrams, acks sent back as datagrams. For aioquic-level server tests."""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.events import DatagramReceived, DataReceived, HeadersReceived, WebTransportStreamDataReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamDataReceived

from eloquent_plugins.core.assembler import EloquentAssembler
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.core.wire import peek_stream_id
from eloquent_plugins.h3glue.common import ALPN, DatagramH3Connection


@dataclass
class WTResponse:
    status: int
    headers: dict[str, str]
    stream_id: int | None
    events: list[StreamEvent] = field(default_factory=list)
    body: bytes = b""
    """The bytes after the status line (an error body, or the control records)."""
    datagrams: int = 0
    fallback_events: int = 0

    @property
    def texts(self) -> list[str]:
        out = []
        for event in self.events:
            if event.kind is EventKind.DATA and event.payload != b"[DONE]":
                choice = json.loads(event.payload)["choices"][0]
                out.append(choice.get("delta", {}).get("content") or "")
        return out


class _Protocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = DatagramH3Connection(self._quic, webtransport=True)
        self.heads: dict[int, asyncio.Future[list[tuple[bytes, bytes]]]] = {}
        self.streams: dict[int, asyncio.Queue[tuple[bytes, bool]]] = {}
        self.datagrams: dict[int, asyncio.Queue[bytes]] = {}
        self.raw: set[int] = set()
        self.drop = 0.0
        self.rng = random.Random(7)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived) and event.stream_id in self.raw:
            # aioquic's client does not mark its own bidirectional WebTransport streams: read them raw
            self.streams[event.stream_id].put_nowait((event.data, event.end_stream))
            return
        for h3_event in self.h3.handle_event(event):
            if isinstance(h3_event, HeadersReceived):
                future = self.heads.get(h3_event.stream_id)
                if future is not None and not future.done():
                    future.set_result(h3_event.headers)
            elif isinstance(h3_event, WebTransportStreamDataReceived | DataReceived):
                queue = self.streams.get(h3_event.stream_id)
                if queue is not None:
                    queue.put_nowait((h3_event.data, h3_event.stream_ended))
            elif isinstance(h3_event, DatagramReceived):
                if self.drop and self.rng.random() < self.drop:
                    continue
                stream_id = peek_stream_id(h3_event.data)
                self.datagrams.setdefault(stream_id, asyncio.Queue()).put_nowait(h3_event.data)


class WTSession:
    def __init__(self, protocol: _Protocol, session_id: int, status: int) -> None:
        self.protocol = protocol
        self.session_id = session_id
        self.status = status

    async def send_raw(self, head: bytes, body: bytes = b"", *, end: bool = True) -> int:
        proto = self.protocol
        stream_id = proto.h3.create_webtransport_stream(self.session_id, is_unidirectional=False)
        proto.streams[stream_id] = asyncio.Queue()
        proto.raw.add(stream_id)
        proto._quic.send_stream_data(stream_id, head + body, end_stream=end)
        proto.transmit()
        return stream_id

    async def request(self, path: str, body: Any, *, headers: dict[str, str] | None = None,
                      timeout: float = 30.0, stop_after: int | None = None) -> WTResponse:
        """POST ``body`` on a new stream and read the whole response (``stop_after``: return once that many
        events rendered, leaving the rest)."""
        head = {"method": "POST", "path": path, "headers": {
            "content-type": "application/json", "eloquent-transport": "datagram", "accept": "text/event-stream",
            **(headers or {})}}
        stream_id = await self.send_raw(json.dumps(head).encode() + b"\n", json.dumps(body).encode())
        return await asyncio.wait_for(self.read(stream_id, stop_after), timeout)

    async def read(self, stream_id: int, stop_after: int | None = None) -> WTResponse:
        proto = self.protocol
        queue = proto.streams[stream_id]
        buffer, ended = b"", False
        while b"\n" not in buffer:
            data, ended = await queue.get()
            buffer += data
            if ended and b"\n" not in buffer:
                raise ConnectionError("stream ended before the status line")
        line, _, rest = buffer.partition(b"\n")
        head = json.loads(line)
        response = WTResponse(head["status"], head["headers"], head.get("stream_id"))
        if response.status != 200 or head["headers"].get("eloquent-transport") != "datagram":
            while not ended:
                data, ended = await queue.get()
                rest += data
            response.body = rest
            return response
        assembler = EloquentAssembler(response.stream_id)
        datagrams = proto.datagrams.setdefault(response.stream_id, asyncio.Queue())
        response.events += assembler.on_control(rest)
        response.body = rest
        while not ended:
            stream_get = asyncio.ensure_future(queue.get())
            dgram_get = asyncio.ensure_future(datagrams.get())
            done, _ = await asyncio.wait({stream_get, dgram_get}, return_when=asyncio.FIRST_COMPLETED)
            for task in (stream_get, dgram_get):
                if task not in done:
                    task.cancel()
            if dgram_get in done:
                response.datagrams += 1
                now = time.monotonic()
                response.events += assembler.on_datagram(dgram_get.result(), now)
                for ack in assembler.acks(now):
                    proto.h3.send_datagram(self.session_id, ack)
                proto.transmit()
            if stream_get in done:
                data, ended = stream_get.result()
                response.body += data
                response.events += assembler.on_control(data)
            if stop_after is not None and len(response.events) >= stop_after:
                return response
        assembler.on_stream_end()
        response.fallback_events = assembler.fallback_events
        return response

    def close(self) -> None:
        """End the session (FIN on the CONNECT stream)."""
        self.protocol._quic.send_stream_data(self.session_id, b"", end_stream=True)
        self.protocol.transmit()


def configuration() -> QuicConfiguration:
    config = QuicConfiguration(alpn_protocols=ALPN, is_client=True, max_datagram_frame_size=65536,
                               max_datagram_size=QUIC_MAX_DATAGRAM_SIZE, server_name="localhost")
    config.verify_mode = ssl.CERT_NONE
    return config


SAME_ORIGIN = "same-origin"


async def open_session(protocol: _Protocol, authority: str, path: str = "/eloquent/wt", *,
                       origin: str | None = SAME_ORIGIN) -> WTSession:
    """``origin``: the page's Origin header (default: a page of ``authority`` itself; None: no Origin header)."""
    origin = f"https://{authority}" if origin == SAME_ORIGIN else origin
    extra = [] if origin is None else [(b"origin", origin.encode())]
    session_id = protocol._quic.get_next_available_stream_id()
    protocol.heads[session_id] = asyncio.get_running_loop().create_future()
    protocol.streams[session_id] = asyncio.Queue()
    protocol.h3.send_headers(session_id, [
        (b":method", b"CONNECT"), (b":protocol", b"webtransport"), (b":scheme", b"https"),
        (b":authority", authority.encode()), (b":path", path.encode()), *extra])
    protocol.transmit()
    headers = dict(await asyncio.wait_for(protocol.heads[session_id], 10))
    return WTSession(protocol, session_id, int(headers[b":status"]))


def wt_connect(host: str, port: int):  # type: ignore[no-untyped-def]
    """``async with wt_connect(host, port) as protocol``, then ``await open_session(protocol, authority)``."""
    return connect(host, port, configuration=configuration(), create_protocol=_Protocol)
