"""A hostile server for the client's tests (issue 28), in its own process so the client's memory is measured
alone: ``python -m tests.support.hostile_server TCP_PORT UDP_PORT OTHER_PORT CERT KEY`` prints ``ready`` and then
serves until killed.

TCP (HTTP/1.1), by path:
- ``/endless-error``: ``500`` JSON whose chunked body never ends (64 MiB, then it stops, so an unbounded client
  shows as a failure, not a hang);
- ``/alt-svc``: a short complete SSE stream with ``Alt-Svc: h3=":OTHER_PORT"; ma=<400 digits>``;
- ``/oversized-line``: ``200 text/event-stream`` with one 5 MiB ``data:`` line.

UDP (HTTP/3, aioquic), by path:
- ``/endless-error``: the same endless ``500`` on the request stream;
- ``/endless-fallback``: a ``200`` datagram response whose reliable stream carries fallback records forever, all
  for indices past a gap (so none can ever be rendered).
"""

from __future__ import annotations

import asyncio
import sys

from aioquic.asyncio import serve
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    QuicEvent,
    StopSendingReceived,
    StreamReset,
)

from eloquent_plugins.core.control import encode_fallback
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE

TOTAL = 64 << 20
"""Bytes an endless body sends before it gives up."""
CHUNK = b"x" * (64 << 10)
SSE = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
       b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            await reader.readexactly(int(headers.get("content-length", "0")))
            if path == "/endless-error":
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                sent = 0
                while sent < TOTAL:
                    writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                    await writer.drain()
                    sent += len(CHUNK)
                writer.write(b"0\r\n\r\n")
            elif path == "/oversized-line":
                body = b"data: " + b"y" * (5 << 20) + b"\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
            else:  # /alt-svc and anything else: a complete stream, advertising HTTP/3 on another port
                ma = "9" * 400
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n"
                             b'alt-svc: h3=":%d"; ma=%s\r\n\r\n%s' % (len(SSE), other, ma.encode(), SSE))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


class H3Hostile(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.gone: set[int] = set()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, (StreamReset, StopSendingReceived)):
            self.gone.add(event.stream_id)
        if isinstance(event, ConnectionTerminated):
            self.gone.add(-1)
        for h3_event in self.h3.handle_event(event):
            if isinstance(h3_event, HeadersReceived):
                path = dict(h3_event.headers).get(b":path", b"")
                asyncio.ensure_future(self.answer(h3_event.stream_id, path))

    async def answer(self, stream_id: int, path: bytes) -> None:
        if path.startswith(b"/endless-fallback"):
            self.h3.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"text/event-stream"),
                                             (b"eloquent-transport", b"datagram")])
            records = (encode_fallback([StreamEvent(1000 + i, b"z" * (32 << 10))]) for i in range(1 << 30))
        else:
            self.h3.send_headers(stream_id, [(b":status", b"500"), (b"content-type", b"application/json")])
            records = (CHUNK for _ in range(1 << 30))
        sent = 0
        for record in records:
            if sent >= TOTAL or stream_id in self.gone or -1 in self.gone:
                break
            self.h3.send_data(stream_id, record, end_stream=False)
            self.transmit()
            sent += len(record)
            await asyncio.sleep(0.002)
        if stream_id not in self.gone and -1 not in self.gone:
            self.h3.send_data(stream_id, b"", end_stream=True)
            self.transmit()


async def main(tcp_port: int, udp_port: int, other: int, cert: str, key: str) -> None:
    server = await asyncio.start_server(lambda r, w: tcp(r, w, other), "127.0.0.1", tcp_port)
    config = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN, max_datagram_frame_size=QUIC_MAX_DATAGRAM_SIZE)
    config.load_cert_chain(cert, key)
    await serve("127.0.0.1", udp_port, configuration=config, create_protocol=H3Hostile)
    print("ready", flush=True)
    async with server:
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]))
