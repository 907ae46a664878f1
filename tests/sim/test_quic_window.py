"""The simulator's QUIC window under Eloquent (``sim.quic_window``): datagrams leave only inside aioquic's congestion
window, a full window holds them in the server, and the client's acks release them, as in the HTTP/3 front end."""

from __future__ import annotations

import random

import pytest

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.eloquent import connect
from eloquent_plugins.sim.links import RealLink
from eloquent_plugins.sim.netem import parse_mahimahi
from eloquent_plugins.sim.quic_window import IP_UDP, held_times
from eloquent_plugins.sim.run import LinkRun, StreamSeeds
from eloquent_plugins.sim.scenario import Scenario, parse_scenario
from eloquent_plugins.sim.timeline import Timeline, TokenModel, generate_timeline
from eloquent_plugins.sim.timeline_record import carried

GAP = (1.0, 4.0)
"""The uplink's outage (s): the client's acks wait in its queue, the server's window fills."""


def _fixed_rate_link() -> RealLink:
    """12 Mbit/s each way (one 1500-byte opportunity per ms), the uplink with no opportunity during ``GAP``."""
    down = parse_mahimahi("1\n", "down")
    up = parse_mahimahi("\n".join(str(ms) for ms in range(6000) if not GAP[0] * 1000 <= ms < GAP[1] * 1000), "up")
    return RealLink("fixed", down, up, queue_packets=1000)


def _timeline() -> Timeline:
    return generate_timeline(TokenModel(tokens=150, tpot=0.03), random.Random(7))


def _spy(recovery, sends: list[tuple[int, int, int]]) -> None:  # type: ignore[no-untyped-def]
    """Note, for each packet counted in flight, the bytes in flight before it, its bytes and the window."""
    sent = recovery.on_packet_sent

    def on_packet_sent(*, packet, space) -> None:  # type: ignore[no-untyped-def]
        if packet.in_flight:
            sends.append((recovery.bytes_in_flight, packet.sent_bytes, recovery.congestion_window))
        sent(packet=packet, space=space)

    recovery.on_packet_sent = on_packet_sent


def _run(window: str):  # type: ignore[no-untyped-def]
    scenario = Scenario(loss=0.0, rtt_ms=60, window=window)
    timeline = _timeline()
    loop = EventLoop()
    forward_path, reverse_path = LinkRun(_fixed_rate_link(), 0.0, False).paths(
        scenario.path_config(), timeline, StreamSeeds.derive(1, 0))
    rendered = [float("nan")] * len(timeline.times)

    def render(index: int, now: float) -> None:
        if rendered[index] != rendered[index]:
            rendered[index] = now

    conn = connect(loop, 0.06, forward_path, reverse_path, render, window=window)
    sends: list[tuple[int, int, int]] = []
    acks_at: list[float] = []
    if conn.window is not None:
        _spy(conn.window.recovery, sends)
        deliver = conn.reverse.deliver

        def arrive(packet) -> None:  # type: ignore[no-untyped-def]
            if packet.ack is not None:
                acks_at.append(loop.now)
            deliver(packet)

        conn.reverse.deliver = arrive
    last = len(timeline.times) - 1
    for index, (when, payload) in enumerate(zip(timeline.times, timeline.payloads)):
        loop.at(when, conn.ends.push, payload, timeline.end_payload if index == last else None)
    loop.run(timeline.times[-1] + 60)
    assert conn.ends.sender.done
    return timeline, rendered, conn, sends, acks_at


@pytest.mark.parametrize("algorithm", ["reno", "cubic"])
def test_a_full_window_holds_datagrams_and_acks_release_them(algorithm: str) -> None:
    timeline, rendered, conn, sends, acks_at = _run(algorithm)
    quic = conn.window
    assert quic is not None
    held = held_times(timeline.times, quic.handed)
    waited = [i for i, h in enumerate(held) if h > 0.005]
    # Before the outage nothing waits; during it the window fills and tokens wait in the server.
    assert all(h == 0.0 for g, h in zip(timeline.times, held) if g < GAP[0])
    assert waited and all(GAP[0] < timeline.times[i] < GAP[1] + 1.0 for i in waited)
    # Only a probe (the front end's for a due Eloquent probe, aioquic's on its PTO) sends over a full window
    # (RFC 9002 section 7), at most one full packet's bytes each.
    over = [min(size, before + size - cwnd) for before, size, cwnd in sends if before + size > cwnd]
    assert quic.probes and over
    assert sum(over) <= (quic.probes + quic.ptos) * QUIC_MAX_DATAGRAM_SIZE
    # During the outage only the probes let held tokens out; the tokens waiting when the uplink comes back
    # leave at the instant an ack arrives (the plan runs after every input).
    first: dict[int, float] = {}
    for when, datagram in quic.handed:
        for index in carried(datagram)[1]:
            first.setdefault(index, when)
    acks = set(acks_at)
    by_ack = [i for i in waited if first[i] in acks]
    assert by_ack and all(first[i] >= GAP[1] for i in by_ack)
    assert all(first[i] not in acks for i in waited if first[i] < GAP[1])
    assert all(i in by_ack for i in waited if timeline.times[i] > GAP[1] - 0.1)
    assert all(r == r for r in rendered)  # every token rendered


def test_without_a_window_nothing_is_held_and_the_window_costs_the_held_tokens() -> None:
    timeline, plain, conn, _, _ = _run("none")
    assert conn.window is None and conn.acks is None
    _, windowed, wconn, _, _ = _run("cubic")
    held = held_times(timeline.times, wconn.window.handed)
    waited = [i for i, h in enumerate(held) if h > 0.005]
    assert sum(windowed[i] - plain[i] for i in waited) > 0
    # Before the outage both render every token at the same instant: the window is not full there.
    early = [i for i, g in enumerate(timeline.times) if g < GAP[0] - 0.1]
    assert [windowed[i] for i in early] == pytest.approx([plain[i] for i in early], abs=1e-3)


def test_the_window_is_a_scenario_setting_and_an_unknown_one_is_refused() -> None:
    assert Scenario().window == "none"
    assert parse_scenario("loss=0.1,window=reno").window == "reno"
    assert "window=cubic" in parse_scenario("loss=0.1,window=cubic").label
    with pytest.raises(ConfigError):
        Scenario(window="bbr")
    assert IP_UDP == 28


def test_aioquic_s_pacer_spaces_the_datagrams_it_was_handed() -> None:
    """End to end aioquic paces what the front end hands it (rate: window over smoothed RTT), which after an outage
    has inflated the RTT holds datagrams in its queue; the simulator's window does the same with aioquic's pacer,
    while an ACK due still goes at once."""
    from eloquent_plugins.sim.quic_window import ServerPacket, ServerWindow

    loop = EventLoop()
    sent: list[tuple[float, ServerPacket]] = []
    window = ServerWindow(loop, "cubic", 0.06, lambda packet, size: sent.append((loop.now, packet)))
    window.recovery._pacer.update_rate(congestion_window=13500, smoothed_rtt=1.0)  # one 1350-byte packet / 0.1 s
    window.plan(0.0, lambda now: [bytes(100) for _ in range(4)], probe_due=False)
    loop.run_until(1.0)  # no acks come back: aioquic's probe timer would go on firing
    times = [t for t, p in sent if p.datagram is not None]
    assert len(times) == 4
    assert times[0] >= 0.099 and times[-1] >= 0.29  # at once without the pacer
    assert len(set(times)) >= 3  # spread over the packet time (float rounding may let two go together)
