"""Clients that make a server hold incomplete requests (issue 28), run as their own process so that their work does
not slow the test's own (legitimate) client: ``python -m tests.support.hostile_bodies MODE --port P ...``.

Modes, each from ``--address`` (a loopback address of its own, so the server's per-address ceiling is this
client's alone):

* ``h3``: one QUIC connection, ``--count`` request bodies, each ``--size`` bytes declared (every other one without a
  ``content-length``) and sent up to ``--short`` bytes short, one after the other (the next once the server has
  acknowledged the last);
* ``tcp``: the same over ``--count`` HTTP/1.1 connections;
* ``wt``: ``--connections`` QUIC connections with a WebTransport session each, ``--count`` request streams in all,
  each sending ``--size`` bytes of a head line that never ends (the connections side by side).

One after the other (the next once the server has all of the last) until the server refuses one, then the rest
at once; every ``--trickle`` seconds one more byte on each request whose bytes are out and that has no answer
(what kept them alive before: a byte every 29 s against a 30 s ``body_timeout``), until each has its answer or
``--wait`` seconds passed. Prints one JSON line when everything is sent (``{"phase": "sent"}``) and one with the
outcomes (``{"phase": "done", "outcomes": [{"status", "code", "type"} or {"reset": true} or {}]}``: ``{}`` is a
request that got no answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import QuicEvent, StopSendingReceived, StreamReset

from eloquent_plugins.h3glue.common import ALPN, stream_send_backlog
from tests.support.wt_client import _Protocol as WTProtocol
from tests.support.wt_client import configuration as wt_configuration
from tests.support.wt_client import open_session

PATH = "/v1/chat/completions"
POLL = 0.005
WINDOW = 32
"""Requests whose bytes are not all out, at most, once the server refused one (``run``)."""
STARTED = time.monotonic()


@dataclass
class Outcome:
    status: int | None = None
    body: bytes = b""
    ended: bool = False
    reset: bool = False
    stopped: bool = False

    @property
    def answered(self) -> bool:
        return self.ended or self.reset

    def report(self) -> dict[str, Any]:
        if self.status is None or not self.ended:
            return {"reset": True} if self.reset else {}
        try:
            error = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            return {"status": self.status, "code": None, "type": None}
        return {"status": self.status, "code": error.get("code"), "type": error.get("type")}


async def until(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL)
    return True


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def body_bytes(size: int) -> bytes:
    """The start of a JSON body (never valid: it never ends)."""
    return b'{"model": "eloquent-builtin", "padding": "' + b"a" * max(0, size - 42)


# -- HTTP/3 --------------------------------------------------------------------------------------------------------


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.outcomes: dict[int, Outcome] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamReset) and event.stream_id in self.outcomes:
            self.outcomes[event.stream_id].reset = True
        elif isinstance(event, StopSendingReceived) and event.stream_id in self.outcomes:
            self.outcomes[event.stream_id].stopped = True
        for h3_event in self.h3.handle_event(event):
            outcome = self.outcomes.get(getattr(h3_event, "stream_id", -1))
            if outcome is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                outcome.status = int(dict(h3_event.headers)[b":status"])
                outcome.ended = outcome.ended or h3_event.stream_ended
            elif isinstance(h3_event, DataReceived):
                outcome.body += h3_event.data
                outcome.ended = outcome.ended or h3_event.stream_ended


async def quic_connect(factory: Callable[[QuicConnection], QuicConnectionProtocol], config: QuicConfiguration,
                       address: str, port: int) -> Any:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_datagram_endpoint(lambda: factory(QuicConnection(configuration=config)),
                                                      local_addr=(address, 0))
    protocol.connect(("127.0.0.1", port))
    await asyncio.wait_for(protocol.wait_connected(), 15)
    return protocol


async def attack_h3(args: argparse.Namespace) -> list[Outcome]:
    config = QuicConfiguration(alpn_protocols=ALPN, is_client=True, server_name="localhost",
                               verify_mode=ssl.CERT_NONE)
    client: H3Client = await quic_connect(lambda quic: H3Client(quic), config, args.address, args.port)
    quic = client._quic
    payload = body_bytes(args.size - args.short)
    order: list[int] = []

    def start(i: int) -> Callable[[], bool]:
        stream_id = quic.get_next_available_stream_id()
        outcome = client.outcomes[stream_id] = Outcome()
        order.append(stream_id)
        headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", f"127.0.0.1:{args.port}".encode()),
                   (b":path", PATH.encode()), (b"content-type", b"application/json")]
        if i % 2 == 0:
            headers.append((b"content-length", str(args.size).encode()))
        client.h3.send_headers(stream_id, headers)
        client.h3.send_data(stream_id, payload, end_stream=False)
        client.transmit()
        return lambda: outcome.answered or outcome.stopped or not stream_send_backlog(quic, stream_id)

    def trickle() -> None:
        for stream_id in order:
            outcome = client.outcomes[stream_id]
            if not (outcome.answered or outcome.stopped or stream_send_backlog(quic, stream_id)):
                client.h3.send_data(stream_id, b"a", end_stream=False)
        client.transmit()

    await run(args, start, trickle, lambda: [client.outcomes[s] for s in order])
    client.close()
    return [client.outcomes[s] for s in order]


# -- HTTP/1.1 ------------------------------------------------------------------------------------------------------


@dataclass
class TcpRequest:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    outcome: Outcome = field(default_factory=Outcome)
    task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            length = next(int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length"))
            self.outcome.body = await self.reader.readexactly(length)
            self.outcome.status, self.outcome.ended = status, True
        except (ConnectionError, asyncio.IncompleteReadError, StopIteration):
            self.outcome.reset = True


async def attack_tcp(args: argparse.Namespace) -> list[Outcome]:
    requests: list[TcpRequest] = []
    payload = body_bytes(args.size - args.short)

    async def start(i: int) -> Callable[[], bool]:
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port, local_addr=(args.address, 0))
        request = TcpRequest(reader, writer)
        request.task = asyncio.create_task(request.read())
        requests.append(request)
        length = f"Content-Length: {args.size}\r\n" if i % 2 == 0 else "Transfer-Encoding: chunked\r\n"
        writer.write(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{length}\r\n"
                     .encode())
        writer.write(payload if i % 2 == 0 else b"%x\r\n" % len(payload) + payload + b"\r\n")
        transport = writer.transport
        return lambda: request.outcome.answered or not transport.get_write_buffer_size()

    def trickle() -> None:
        for i, request in enumerate(requests):
            if not (request.outcome.answered or request.writer.is_closing()
                    or request.writer.transport.get_write_buffer_size()):
                request.writer.write(b"a" if i % 2 == 0 else b"1\r\na\r\n")

    await run(args, start, trickle, lambda: [r.outcome for r in requests])
    for request in requests:
        request.writer.close()
        if request.task is not None:
            request.task.cancel()
    return [r.outcome for r in requests]


# -- WebTransport --------------------------------------------------------------------------------------------------


async def read_status(protocol: WTProtocol, stream_id: int, outcome: Outcome) -> None:
    queue = protocol.streams[stream_id]
    buffer = b""
    while True:
        data, ended = await queue.get()
        buffer += data
        if ended:
            break
    line, _, rest = buffer.partition(b"\n")
    try:
        outcome.status = int(json.loads(line)["status"])
    except (ValueError, KeyError):
        outcome.reset = True
        return
    outcome.body, outcome.ended = rest, True


async def attack_wt(args: argparse.Namespace) -> list[Outcome]:
    per_connection = -(-args.count // args.connections)
    sessions = []
    for _ in range(args.connections):
        protocol: WTProtocol = await quic_connect(lambda quic: WTProtocol(quic), wt_configuration(), args.address,
                                                  args.port)
        session = await open_session(protocol, f"127.0.0.1:{args.port}", origin=None)
        if session.status != 200:
            raise SystemExit(f"session refused: {session.status}")
        sessions.append(session)
    streams: list[tuple[WTProtocol, int, Outcome]] = []
    tasks: list[asyncio.Task[None]] = []
    head = b'{"method": "POST", "path": "/v1/chat/completions", "headers": {"x-pad": "' + b"a" * (args.size - 80)

    async def start(i: int) -> Callable[[], bool]:
        session = sessions[i // per_connection]
        protocol = session.protocol
        stream_id = await session.send_raw(head, end=False)
        outcome = Outcome()
        streams.append((protocol, stream_id, outcome))
        tasks.append(asyncio.create_task(read_status(protocol, stream_id, outcome)))
        return lambda: outcome.answered or not stream_send_backlog(protocol._quic, stream_id)

    def trickle() -> None:
        for protocol, stream_id, outcome in streams:
            if not outcome.answered and not stream_send_backlog(protocol._quic, stream_id):
                try:
                    protocol._quic.send_stream_data(stream_id, b"a", end_stream=False)
                except Exception:  # noqa: BLE001 - the server stopped the stream: nothing more to send on it
                    continue
        for session in sessions:
            session.protocol.transmit()

    await run(args, start, trickle, lambda: [o for _, _, o in streams], lanes=args.connections)
    for task in tasks:
        task.cancel()
    for session in sessions:
        session.protocol.close()
    return [o for _, _, o in streams]


# -- the common end ------------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, start: Callable[[int], Any], trickle: Callable[[], None],
              outcomes: Callable[[], list[Outcome]], lanes: int = 1) -> None:
    """Start the requests one after the other in each of ``lanes`` (request ``i`` in lane ``i * lanes // count``:
    a connection each), the next once the server has all of the last, until the server refuses one: then the rest
    with up to ``WINDOW`` of them on their way at once (what fills the server is the requests it holds, not a flood
    of its UDP socket, which ``tests/transports/http3/test_quic_flood.py`` covers). A byte every ``--trickle``
    seconds meanwhile on each request whose bytes are all out and that has no answer; once everything is out, the
    same until each has its answer."""
    ticker = asyncio.create_task(trickling(args.trickle, trickle))
    pending: list[Callable[[], bool]] = []
    flying: list[Callable[[], bool]] = []

    def room() -> bool:
        flying[:] = [done for done in flying if not done()]
        return len(flying) < WINDOW

    async def lane(indices: range) -> None:
        for i in indices:
            sent = start(i)
            if asyncio.iscoroutine(sent):
                sent = await sent
            pending.append(sent)
            if not any(o.answered or o.stopped for o in outcomes()):
                await until(sent, 60)
            else:
                flying.append(sent)
                await until(room, 60)

    size = -(-args.count // lanes)
    await asyncio.gather(*(lane(range(k * size, min(args.count, (k + 1) * size))) for k in range(lanes)))
    await until(lambda: all(done() for done in pending), 120)
    emit({"phase": "sent", "seconds": round(time.monotonic() - STARTED, 1),
          "answered": sum(o.answered for o in outcomes())})
    await until(lambda: all(o.answered for o in outcomes()), args.wait)
    ticker.cancel()


async def trickling(every: float, trickle: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(every)
        trickle()


MODES: dict[str, Callable[[argparse.Namespace], Awaitable[list[Outcome]]]] = {
    "h3": attack_h3, "tcp": attack_tcp, "wt": attack_wt}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.hostile_bodies")
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.2")
    parser.add_argument("--count", type=int, default=120)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--short", type=int, default=64)
    parser.add_argument("--trickle", type=float, default=2.0)
    parser.add_argument("--wait", type=float, default=60.0)
    args = parser.parse_args(argv)
    outcomes = asyncio.run(MODES[args.mode](args))
    emit({"phase": "done", "seconds": round(time.monotonic() - STARTED, 1),
          "outcomes": [o.report() for o in outcomes]})


if __name__ == "__main__":
    main()
