"""Each Eloquent response's sender starts its RTT estimate from what the connection's handshake measured (aioquic's
smoothed RTT), over real QUIC through the relay: not from the 250 ms default, whose first probe would wait 0.76 s
on any path (docs/results/real-links.md, point 10)."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.sim.netem import PathConfig
from tests.support.h3_relay import stream_sampled

ONE_WAY = 0.3
"""A round trip of 0.6 s: far from the default's 0.25 s, so the seed is told from it on a busy machine too."""


async def test_the_sender_starts_from_the_handshakes_rtt() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.01))
    seeds: list[float] = []

    def sample(conn: Any) -> None:
        seeds.extend(r.eloquent.sender.config.initial_rtt for r in conn.requests.values() if r.eloquent is not None)

    body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 40,
            "messages": [{"role": "user", "content": "seed"}]}
    await stream_sampled(app, PathConfig(delay=ONE_WAY, loss=0.0), body, seed=1, every=0.005, sample=sample)
    assert seeds, "the response went as Eloquent datagrams"
    assert len(set(seeds)) == 1  # fixed when the response started
    assert 2 * ONE_WAY <= seeds[0] < 2 * ONE_WAY + 0.4, seeds[0]
