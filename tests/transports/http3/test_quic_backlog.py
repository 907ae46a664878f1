"""Under loss and a full congestion window the front end keeps aioquic's DATAGRAM queue bounded: packets are
pulled only when there is room, and a parked Eloquent run is replaced by a newer one, never queued behind."""

from __future__ import annotations

import asyncio

from eloquent_client import EloquentClient

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.h3glue.common import congestion_window, pending_datagram_bytes
from eloquent_plugins.sim.netem import LossSchedule, PathConfig
from eloquent_plugins.transports.http3.server import start_http3_server
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay


async def test_no_stale_datagram_backlog_under_loss() -> None:
    # Tokens far faster than a lossy 200 ms path can carry: the window, not the engine, is the limit.
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    # Lossless for the handshake, then 30% loss.
    path = PathConfig(delay=0.1, loss=0.0, burst=2.0, bandwidth=400_000,
                      loss_schedule=LossSchedule(((0.0, 0.0), (1.0, 0.3))))
    relay = await start_relay(RelayConfig(target=("127.0.0.1", srv.port), upstream=path, downstream=path, seed=2))
    samples: list[tuple[int, int, int]] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            for conn in list(srv._state.connections):
                samples.append((pending_datagram_bytes(conn.quic), congestion_window(conn.quic),
                                conn.scheduler.queue.pending()))
            await asyncio.sleep(0.002)

    sampler = asyncio.create_task(sample())
    body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 1500,
            "messages": [{"role": "user", "content": "flood"}]}
    try:
        host, port = relay.listen_addr
        async with EloquentClient(f"https://{host}:{port}", verify=False, timeout=30) as client:
            await client.connection()
            async with client.stream("POST", "/v1/chat/completions", json=body) as s:
                text = await s.text()
        stats = [c.scheduler.queue.stats for c in srv._state.connections]
    finally:
        stop.set()
        await sampler
        await relay.close()
        await srv.close()
    assert len(text) > 3000 and s.rendered[-1].data == "[DONE]"
    assert samples
    largest_window = max(w for _, w, _ in samples)
    assert max(p for p, _, _ in samples) <= largest_window  # aioquic never holds more than one window
    assert max(q for _, _, q in samples) <= 16  # at most one parked run (max_run_datagrams) per stream
    assert sum(st.superseded for st in stats) > 0  # the window really was the limit, and runs were replaced
