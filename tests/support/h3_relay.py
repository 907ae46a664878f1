"""One streaming request to a fresh HTTP/3 front end through the UDP relay, with the server's connections sampled
while it runs: for tests that read the front end's live state (its QUIC window and queues, each response's sender)
over real QUIC on a shaped path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eloquent_client import EloquentClient

from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.server import start_http3_server


@dataclass
class SampledStream:
    text: str
    stream: Any
    """The client's stream (its ``rendered`` events)."""
    connections: list[Any]
    """The server's connections once the stream ended, before the server closed."""


async def stream_sampled(app: Any, path: PathConfig, body: dict[str, Any], *, seed: int, every: float,
                         sample: Callable[[Any], None]) -> SampledStream:
    """``body`` streamed through a relay with ``path`` both ways (``seed``); ``sample(connection)`` for each server
    connection every ``every`` seconds until the stream ended."""
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    relay = await start_relay(RelayConfig(target=("127.0.0.1", srv.port), upstream=path, downstream=path, seed=seed))
    stop = asyncio.Event()

    async def sampler() -> None:
        while not stop.is_set():
            for conn in list(srv._state.connections):
                sample(conn)
            await asyncio.sleep(every)

    task = asyncio.create_task(sampler())
    try:
        host, port = relay.listen_addr
        async with EloquentClient(f"https://{host}:{port}", verify=False, timeout=30) as client:
            await client.connection()
            async with client.stream("POST", "/v1/chat/completions", json=body) as s:
                text = await s.text()
        connections = list(srv._state.connections)
    finally:
        stop.set()
        await task
        await relay.close()
        await srv.close()
    return SampledStream(text, s, connections)
