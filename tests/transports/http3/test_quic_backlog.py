"""Under loss and a full congestion window the front end keeps aioquic's DATAGRAM queue bounded: packets are
pulled only when there is room, and a parked Eloquent run is replaced by a newer one, never queued behind."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.h3glue.common import congestion_window, pending_datagram_bytes
from eloquent_plugins.sim.netem import LossSchedule, PathConfig
from tests.support.h3_relay import stream_sampled


async def test_no_stale_datagram_backlog_under_loss() -> None:
    # Tokens far faster than a lossy 200 ms path can carry: the window, not the engine, is the limit.
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))
    # Lossless for the handshake, then 30% loss.
    path = PathConfig(delay=0.1, loss=0.0, burst=2.0, bandwidth=400_000,
                      loss_schedule=LossSchedule(((0.0, 0.0), (1.0, 0.3))))
    samples: list[tuple[int, int, int]] = []

    def sample(conn: Any) -> None:
        samples.append((pending_datagram_bytes(conn.quic), congestion_window(conn.quic),
                        conn.scheduler.queue.pending()))

    body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 1500,
            "messages": [{"role": "user", "content": "flood"}]}
    run = await stream_sampled(app, path, body, seed=2, every=0.002, sample=sample)
    text, s = run.text, run.stream
    stats = [c.scheduler.queue.stats for c in run.connections]
    assert len(text) > 3000 and s.rendered[-1].data == "[DONE]"
    assert samples
    largest_window = max(w for _, w, _ in samples)
    assert max(p for p, _, _ in samples) <= largest_window  # aioquic never holds more than one window
    assert max(q for _, _, q in samples) <= 16  # at most one parked run (max_run_datagrams) per stream
    assert sum(st.superseded for st in stats) > 0  # the window really was the limit, and runs were replaced
