"""Each Eloquent response's sender starts its RTT estimate from what the connection's handshake measured (aioquic's
smoothed RTT), over real QUIC through the relay: not from the 250 ms default, whose first probe would wait 0.76 s
on any path (docs/results/real-links.md, point 10)."""

from __future__ import annotations

import asyncio

from eloquent_client import EloquentClient

from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.server import start_http3_server

ONE_WAY = 0.3
"""A round trip of 0.6 s: far from the default's 0.25 s, so the seed is told from it on a busy machine too."""


async def test_the_sender_starts_from_the_handshakes_rtt() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.01))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    path = PathConfig(delay=ONE_WAY, loss=0.0)
    relay = await start_relay(RelayConfig(target=("127.0.0.1", srv.port), upstream=path, downstream=path, seed=1))
    seeds: list[float] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            for conn in list(srv._state.connections):
                seeds.extend(r.eloquent.sender.config.initial_rtt for r in conn.requests.values()
                             if r.eloquent is not None)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 40,
            "messages": [{"role": "user", "content": "seed"}]}
    try:
        host, port = relay.listen_addr
        async with EloquentClient(f"https://{host}:{port}", verify=False, timeout=30) as client:
            await client.connection()
            async with client.stream("POST", "/v1/chat/completions", json=body) as s:
                await s.text()
    finally:
        stop.set()
        await sampler
        await relay.close()
        await srv.close()
    assert seeds, "the response went as Eloquent datagrams"
    assert len(set(seeds)) == 1  # fixed when the response started
    assert 2 * ONE_WAY <= seeds[0] < 2 * ONE_WAY + 0.4, seeds[0]
