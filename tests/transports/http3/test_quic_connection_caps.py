"""Open QUIC connections a peer can make the listener hold (issue 28): caps in total and per source address, idle
ones closed first (H3_EXCESSIVE_LOAD), a newcomer refused (CONNECTION_REFUSED) when none is idle, never a
connection carrying a stream closed for a newcomer, and no connection kept past the idle timeout without a stream
however often its peer PINGs. Real aioquic clients against ``GuardedQuicServer`` in memory (its wire is a list);
``test_quic_swarm.py`` runs the issue's 3,000 connections against ``eloquent serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import pytest
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated
from aioquic.quic.packet import QuicErrorCode

from eloquent_plugins.cli import flags
from eloquent_plugins.cli.commands import serve
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.protocol import H3_EXCESSIVE_LOAD, H3_NO_ERROR
from eloquent_plugins.h3glue.listener import GuardedQuicServer
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.cli.main import build_parser
from tests.support.quic_wire import SERVER, Wire, handshake, listener, quic_client

ATTACKER = "192.0.2.7"


def deliver(wire: Wire, client: QuicConnection, addr: Any) -> ConnectionTerminated | None:
    """Hand the client what the server sent it; how it ended, if it did."""
    for data in wire.take(addr):
        client.receive_datagram(data, SERVER, now=time.monotonic())
    ended = None
    while (event := client.next_event()) is not None:
        if isinstance(event, ConnectionTerminated):
            ended = event
    return ended


def closed_with(wire: Wire, client: QuicConnection, addr: Any) -> int | None:
    """The code of the CONNECTION_CLOSE the client got from the server (None: still open). aioquic reports it as
    an event only after the draining period, so its pending close is read."""
    deliver(wire, client, addr)
    close = client._close_event
    return None if close is None else close.error_code


def ping(server: GuardedQuicServer, client: QuicConnection, addr: Any) -> None:
    client.send_ping(1)
    for data, _ in client.datagrams_to_send(now=time.monotonic()):
        server.datagram_received(data, addr)


def open_stream(server: GuardedQuicServer, client: QuicConnection, addr: Any) -> None:
    """A request stream the client opened and has not finished."""
    client.send_stream_data(client.get_next_available_stream_id(), b"GET / but never the end")
    for data, _ in client.datagrams_to_send(now=time.monotonic()):
        server.datagram_received(data, addr)


def connect(server: GuardedQuicServer, wire: Wire, host: str, port: int) -> tuple[QuicConnection, tuple[str, int]]:
    client, addr = quic_client(), (host, port)
    assert handshake(server, wire, client, addr)
    deliver(wire, client, addr)
    return client, addr


async def test_a_newcomer_past_the_per_address_cap_is_refused_until_one_is_idle_then_the_oldest_idle_goes() -> None:
    server, wire = listener(max_connections_per_address=3)
    held = [connect(server, wire, ATTACKER, 5000 + i) for i in range(3)]
    assert server.caps.held_by(ATTACKER) == 3

    # All three idle for less than the grace (their first request may be on the way): the newcomer is refused.
    late = quic_client()
    assert not handshake(server, wire, late, (ATTACKER, 5100))
    assert server.stats.refused == 1 and server.caps.held_by(ATTACKER) == 3
    assert closed_with(wire, late, (ATTACKER, 5100)) == QuicErrorCode.CONNECTION_REFUSED
    assert "too many connections from this address (at most 3)" in late._close_event.reason_phrase  # type: ignore
    # Another address is not affected by this one's cap.
    connect(server, wire, "198.51.100.1", 6000)

    await asyncio.sleep(server.caps.grace + 0.1)
    ping(server, *held[2])  # PINGs are no request: an idle connection stays idle
    connect(server, wire, ATTACKER, 5200)
    assert server.stats.evicted == 1 and server.caps.held_by(ATTACKER) == 3
    assert closed_with(wire, *held[0]) == H3_EXCESSIVE_LOAD  # the one idle longest: the first
    assert "connection cap" in held[0][0]._close_event.reason_phrase  # type: ignore[union-attr]
    assert all(closed_with(wire, *h) is None for h in held[1:])
    server.close()


async def test_a_connection_carrying_a_stream_is_never_closed_for_a_newcomer() -> None:
    server, wire = listener(max_connections_per_address=2)
    busy, quiet = connect(server, wire, ATTACKER, 5000), connect(server, wire, ATTACKER, 5001)
    open_stream(server, *busy)
    await asyncio.sleep(server.caps.grace + 0.1)
    third = connect(server, wire, ATTACKER, 5002)  # takes the idle one's place, not the busy one's
    assert closed_with(wire, *quiet) == H3_EXCESSIVE_LOAD
    open_stream(server, *third)
    await asyncio.sleep(server.caps.grace + 0.1)
    late = quic_client()  # both held connections carry a stream: the newcomer is refused
    assert not handshake(server, wire, late, (ATTACKER, 5003))
    assert closed_with(wire, late, (ATTACKER, 5003)) == QuicErrorCode.CONNECTION_REFUSED
    assert closed_with(wire, *busy) is None and closed_with(wire, *third) is None
    assert server.stats.evicted == 1 and server.stats.refused == 1 and server.caps.held_by(ATTACKER) == 2
    server.close()


async def test_the_total_cap_closes_the_connection_idle_longest_of_any_address() -> None:
    server, wire = listener(max_connections=3)
    working, oldest, newer = (connect(server, wire, f"198.51.100.{i}", 7000 + i) for i in range(3))
    open_stream(server, *working)
    await asyncio.sleep(server.caps.grace + 0.1)
    ping(server, *oldest)  # a PING is no request: it does not make the connection less idle
    connect(server, wire, "198.51.100.9", 7009)
    assert closed_with(wire, *oldest) == H3_EXCESSIVE_LOAD
    assert closed_with(wire, *newer) is None and closed_with(wire, *working) is None
    assert server.caps.count == 3 and server.stats.evicted == 1
    server.close()


async def test_pings_do_not_keep_a_connection_that_carries_no_stream() -> None:
    server, wire = listener(streamless_timeout=0.6)
    pinging, working = connect(server, wire, ATTACKER, 8000), connect(server, wire, ATTACKER, 8001)
    open_stream(server, *working)
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:  # both PING every 0.1 s, which restarts aioquic's idle timer each time
        ping(server, *pinging)
        ping(server, *working)
        await asyncio.sleep(0.1)
    pinging_client = pinging[0]
    assert closed_with(wire, *pinging) == H3_NO_ERROR
    assert pinging_client._close_event.reason_phrase == "no request for 0.6 s"  # type: ignore[union-attr]
    assert closed_with(wire, *working) is None  # a stream: its clock does not run
    assert server.stats.idle_closed == 1 and server.caps.count == 1
    server.close()


def test_options_and_flags() -> None:
    with pytest.raises(ConfigError):
        FrontEndOptions(max_connections=0).check()
    with pytest.raises(ConfigError):
        GuardedQuicServer(configuration=None, max_connections_per_address=0)
    options = FrontEndOptions.from_env({"ELOQUENT_QUIC_MAX_CONNECTIONS": "300",
                                        "ELOQUENT_QUIC_MAX_CONNECTIONS_PER_ADDRESS": "20"})
    assert (options.max_connections, options.max_connections_per_address) == (300, 20)
    parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    default = flags.parse(parser, [], {})
    assert default.quic_max_connections == FrontEndOptions().max_connections == serve.QUIC_MAX_CONNECTIONS
    assert default.quic_max_connections_per_address == FrontEndOptions().max_connections_per_address
    env = {"ELOQUENT_QUIC_MAX_CONNECTIONS": "300", "ELOQUENT_QUIC_MAX_CONNECTIONS_PER_ADDRESS": "20"}
    from_env = flags.parse(parser, [], env)
    assert (from_env.quic_max_connections, from_env.quic_max_connections_per_address) == (300, 20)
    cli = flags.parse(parser, ["--quic-max-connections", "400", "--quic-max-connections-per-address", "30"], env)
    assert (cli.quic_max_connections, cli.quic_max_connections_per_address) == (400, 30)
    with pytest.raises(SystemExit):
        flags.parse(parser, ["--quic-max-connections", "0"], {})


async def test_the_counters_are_prometheus_metrics() -> None:
    from eloquent_plugins.engine import EngineConfig, create_engine_app
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.transports.http3.server import start_http3_server

    srv = await start_http3_server(create_engine_app(EngineConfig()), host="127.0.0.1", port=0, config=StreamConfig())
    try:
        srv.admission.refused, srv.admission.evicted, srv.admission.idle_closed = 3, 2, 1
        metrics = StreamMetrics()
        metrics.quic = srv
        text = metrics.render()[0].decode()
    finally:
        await srv.close()
    for line in ("eloquent_quic_connections_refused_total 3.0", "eloquent_quic_connections_evicted_total 2.0",
                 "eloquent_quic_connections_idle_closed_total 1.0", "eloquent_quic_connections 0.0"):
        assert line in text.splitlines(), line
    assert "eloquent_sse_quic" not in text  # no legacy alias for the new names
