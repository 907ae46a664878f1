"""Many real QUIC connections from one address, kept open by PINGs and carrying no stream (issue 28's probe):
``python -m tests.support.quic_swarm --port P --count 3000`` prints one JSON line with what happened to them.

Each connection is aioquic's own client (its own UDP socket bound to ``--bind``, ALPN h3, a full TLS handshake):
a real connection, not a replayed packet. It opens no stream and sends no HTTP/3 SETTINGS, and while it is open
it PINGs every ``--ping`` seconds, which refreshes a QUIC idle timer (RFC 9000 section 10.1). Run in its own
process so its handshakes do not share an event loop with the client whose pace a test measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import ssl
import time
from collections import Counter
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent
from aioquic.quic.packet import QuicErrorCode

CONNECT_TIMEOUT = 10.0


class Member(QuicConnectionProtocol):
    """One idle connection of the swarm; remembers how it ended."""

    ended: ConnectionTerminated | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated) and self.ended is None:
            self.ended = event


def outcome(member: Member) -> str:
    """``0x107 <reason>`` as the server closed it, ``idle timeout`` for a silent end, ``open`` while it lives."""
    end = member.ended
    if end is None:
        return "open"
    if end.reason_phrase == "Idle timeout" and end.error_code == QuicErrorCode.INTERNAL_ERROR:
        return "idle timeout (silent)"
    return f"0x{end.error_code:x} {end.reason_phrase}"


async def open_one(host: str, port: int, bind: str, configuration: QuicConfiguration) -> Member:
    loop = asyncio.get_running_loop()
    _, member = await loop.create_datagram_endpoint(
        lambda: Member(QuicConnection(configuration=configuration)), local_addr=(bind, 0))
    assert isinstance(member, Member)
    member.connect((host, port), transmit=True)
    with contextlib.suppress(ConnectionError, TimeoutError):
        await asyncio.wait_for(member.wait_connected(), CONNECT_TIMEOUT)
    return member


async def swarm(host: str, port: int, *, bind: str, count: int, concurrency: int, ping: float,
                hold: float) -> dict[str, Any]:
    """Open ``count`` connections, ``concurrency`` handshakes at a time, PING the open ones every ``ping`` s, and
    keep going ``hold`` s after the last one opened; then say how each ended."""
    configuration = QuicConfiguration(alpn_protocols=["h3"], is_client=True, verify_mode=ssl.CERT_NONE,
                                      idle_timeout=600.0)
    members: list[Member] = []
    connected = 0
    gate = asyncio.Semaphore(concurrency)
    stop = asyncio.Event()

    async def one() -> None:
        nonlocal connected
        async with gate:
            member = await open_one(host, port, bind, configuration)
        members.append(member)
        if member.ended is None:
            connected += 1

    async def pinger() -> None:
        uid = 0
        while not stop.is_set():
            for member in list(members):
                if member.ended is None:
                    uid += 1
                    member._quic.send_ping(uid)
                    member.transmit()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ping)

    started = time.monotonic()
    pings = asyncio.create_task(pinger())
    await asyncio.gather(*(one() for _ in range(count)))
    opened = time.monotonic()
    await asyncio.sleep(hold)
    stop.set()
    await pings
    outcomes = Counter(outcome(m) for m in members)
    result = {"attempted": count, "connected": connected, "open_seconds": round(opened - started, 1),
              "held_seconds": hold, "open_at_end": outcomes.get("open", 0), "outcomes": dict(outcomes)}
    for member in members:
        member._quic.close()
        member.transmit()
        if member._transport is not None:
            member._transport.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.2", help="the one source address of every connection")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ping", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority by so much: the "
                        "attacker's CPU is its own in real life, not the server's")
    args = parser.parse_args()
    os.nice(args.nice)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.count + 256)), hard))
    print(json.dumps(asyncio.run(swarm(args.host, args.port, bind=args.bind, count=args.count,
                                       concurrency=args.concurrency, ping=args.ping, hold=args.hold))), flush=True)


if __name__ == "__main__":
    main()
