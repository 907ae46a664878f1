"""End to end over real QUIC through the lossy relay: every scheme completes with the non-streaming text.
Correctness only -- the stall figures are the benchmark's job (``eloquent bench e2e``)."""

from __future__ import annotations

from eloquent_plugins.cli.bench.e2e import (
    SCHEMES,
    Conditions,
    Workload,
    format_table,
    run_e2e,
)
from eloquent_plugins.sim.netem import LossSchedule, Outage


def check(result) -> None:  # type: ignore[no-untyped-def]
    assert len(result.streams) == result.workload.requests * len(SCHEMES)
    for stream in result.streams:
        assert stream.error is None, f"{stream.scheme}: {stream.error}"
        assert stream.text == result.references[stream.request] and stream.text
        assert len(stream.rendered) == len(stream.generated) > 0
        assert stream.report is not None and stream.report.tokens == len(stream.rendered)
    assert {s.delivery for s in result.streams if s.scheme != "stream"} == {"eloquent"}
    assert {s.delivery for s in result.streams if s.scheme == "stream"} == {"h3-stream"}
    summary = result.summary()
    assert summary["text_identical"] and summary["all_completed"]
    assert "identical" in format_table(result)


async def test_ten_percent_bursty_loss_100ms_rtt_every_scheme_identical() -> None:
    result = await run_e2e(Conditions(loss=0.10, burst=2.0, rtt=0.1, seed=3),
                           Workload(requests=2, max_tokens=60, ttft=0.05, tpot=0.02))
    check(result)
    assert result.relay_stats.downstream.dropped > 0 and result.relay_stats.upstream.dropped > 0
    keys = set(result.as_json()["summary"])
    assert {"stall_reduction_vs_retransmission", "stall_reduction_vs_duplication", "text_identical"} <= keys


async def test_heavy_loss_and_a_five_second_outage_mid_stream_resume_and_complete() -> None:
    # Handshakes in the first second, then 30% loss for 10 s and everything dropped both ways from 4 s to
    # 9 s; the streams run ~12 s.
    conditions = Conditions(loss=0.0, burst=2.0, rtt=0.1, seed=5,
                            loss_schedule=LossSchedule(((0.0, 0.0), (1.0, 0.3), (11.0, 0.0))),
                            outages=(Outage(4.0, 5.0),))
    result = await run_e2e(conditions, Workload(requests=1, max_tokens=300, ttft=0.1, tpot=0.04))
    check(result)
    stats = result.relay_stats
    assert stats.downstream.outage_dropped > 0 and stats.upstream.outage_dropped > 0
    assert stats.downstream.dropped > 0
    for stream in result.streams:  # the outage hit each stream mid-way: a gap of seconds, then the rest
        gaps = [b - a for a, b in zip(stream.rendered, stream.rendered[1:])]
        assert max(gaps) > 2.0


def test_stagger_keeps_every_schemes_work_apart_at_server_client_and_ack() -> None:
    """At RTT 100 ms / TPOT 30 ms a hop is 20 ms modulo a token time, so spreading three schemes evenly over the
    token time put each one's client work on another's server work; the offsets must keep every instant apart."""
    from eloquent_plugins.cli.harness import stagger_offsets

    def closest(offsets: list[float], tpot: float, one_way: float) -> float:
        instants = [(o + hop * one_way) % tpot for o in offsets for hop in range(3)]
        return min(min(abs(a - b) % tpot, tpot - abs(a - b) % tpot)
                   for i, a in enumerate(instants) for b in instants[i + 1:])

    even = [k * 0.03 / 3 for k in range(3)]
    assert closest(even, 0.03, 0.05) < 1e-9  # the old split: collisions
    offsets = stagger_offsets(3, 0.03, 0.05)
    assert offsets[0] == 0.0 and len(set(offsets)) == 3
    assert closest(offsets, 0.03, 0.05) >= 0.0025 - 1e-9  # 9 instants 2.5 ms or more apart
    assert closest(stagger_offsets(3, 0.02, 0.025), 0.02, 0.025) >= 0.001
    assert stagger_offsets(1, 0.03, 0.05) == [0.0] and stagger_offsets(3, 0.0, 0.05) == [0.0] * 3
