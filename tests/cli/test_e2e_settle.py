"""``bench e2e --trace`` opens its connections off the trace and lets their handshakes end there too: the server's
last handshake packet leaves after the client already reports its connection ready, so switching the trace on at
that moment put it on the stretch under test (docs/results/real-links.md, point 11). Real QUIC through the relay,
whose downlink has no opportunity for 3 s: any packet let onto the trace waits there."""

from __future__ import annotations

import asyncio
import math

from eloquent_client import EloquentClient

from eloquent_plugins.cli.bench.e2e_links import settle_off_trace
from eloquent_plugins.cli.harness import Conditions, Harness
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.sim.netem import CapacityLink, PathConfig, parse_mahimahi
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.server import start_http3_server

ONE_WAY = 0.03
ACK_ONLY = 120
"""Bytes (IP/UDP included) above which a packet carries more than an ACK: one the server would wait for to be
acknowledged (the handshake's last is 266); an ACK answering a late client packet on a busy machine is not one."""


async def _down_after_trace_on(settle: bool) -> tuple[int, int]:
    """Connect with the trace off, optionally settle, switch it on: (the server's bytes in flight then, the
    downlink packets beyond an ACK that reached the relay from then on within 0.5 s)."""
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.01))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    gap = CapacityLink(parse_mahimahi("3000\n3002", "gap"), queue_packets=50)
    relay = await start_relay(RelayConfig(target=("127.0.0.1", srv.port), upstream=PathConfig(delay=ONE_WAY),
                                          downstream=PathConfig(delay=ONE_WAY, capacity=gap), record=True))
    try:
        relay.trace_from = math.inf
        host, port = relay.listen_addr
        async with EloquentClient(f"https://{host}:{port}", verify=False, timeout=30) as client:
            await client.connection()
            if settle:
                await settle_off_trace(Harness(srv, relay, Conditions(rtt=2 * ONE_WAY)))
            in_flight = srv.bytes_in_flight
            relay.trace_from = relay.elapsed()
            await asyncio.sleep(0.5)
            late = [r for r in relay.record_of(0, "down") if r.received >= relay.trace_from and r.size > ACK_ONLY]
        return in_flight, len(late)
    finally:
        await relay.close()
        await srv.close()


async def test_the_handshakes_last_packets_stay_off_the_trace() -> None:
    in_flight, late = await _down_after_trace_on(settle=True)
    assert in_flight == 0
    assert late == 0


async def test_without_the_wait_the_servers_last_handshake_packet_meets_the_trace() -> None:
    """What the wait is for: the server answers the client's Finished only after the client reported ready."""
    in_flight, late = await _down_after_trace_on(settle=False)
    assert late >= 1
