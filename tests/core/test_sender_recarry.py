"""``SenderConfig.recarry_limit`` (opt-in, off by default): past the limit a flush for new events carries only
them; losses are still repaired, and every event still arrives exactly once (docs/results/redundancy.md)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins import EloquentSender, EventKind, ReceiverConfig, SenderConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.wire import AckPacket, DataPacket, decode_packet
from tests.support.lossy_network import payloads, run_stream

NO_KEEPALIVE = KeepAlivePolicy(interval=0.0)


def _indexes(datagrams: list[bytes]) -> list[list[int]]:
    out = []
    for d in datagrams:
        packet = decode_packet(d)
        assert isinstance(packet, DataPacket)
        out.append([e.index for e in packet.entries])
    return out


def _flushes(limit: int | None, before: list[int] | None = None) -> list[list[list[int]]]:
    """Four tokens, nothing acked (the run grows); ``before`` gets the run's sent bytes before each flush."""
    sender = EloquentSender(0, SenderConfig(keepalive=NO_KEEPALIVE, recarry_limit=limit))
    out = []
    for i in range(6):
        sender.push(b"token %d " % i * 4, i * 0.03)
        if before is not None:
            before.append(sender._packetizer.unacked_bytes())
        out.append(_indexes(sender.datagrams_to_send(i * 0.03)))
    return out


def test_without_a_limit_every_packet_carries_the_run() -> None:
    assert _flushes(None) == [[list(range(i + 1))] for i in range(6)]


def test_past_the_limit_a_flush_carries_only_the_new_events() -> None:
    assert _flushes(0) == [[[i]] for i in range(6)]
    # A limit the run passes midway: it is re-carried while its sent part is within the limit, not after.
    before: list[int] = []
    flushes = _flushes(80, before)
    assert before[1] <= 80 < before[-1]
    for i, (flush, sent) in enumerate(zip(flushes, before)):
        assert flush == ([list(range(i + 1))] if sent <= 80 else [[i]])


def test_a_carrier_shown_lost_is_repaired_past_the_limit() -> None:
    sender = EloquentSender(0, SenderConfig(keepalive=NO_KEEPALIVE, recarry_limit=0))
    for i in range(5):
        sender.push(b"t%d" % i, i * 0.03)
        sender.datagrams_to_send(i * 0.03)
    # Packet 0 (event 0) was lost; the receiver got packets 1..4 but cannot render past the gap.
    sender.receive_ack(AckPacket(0, 0, 4, 0.0), 0.2)
    assert _indexes(sender.datagrams_to_send(0.2))[0][:1] == [0]  # the run goes again from the oldest


def test_recarry_limit_is_checked() -> None:
    with pytest.raises(ConfigError):
        SenderConfig(recarry_limit=-1)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=st.lists(payloads, max_size=20), limit=st.sampled_from([0, 40, 400]), data=st.data())
def test_a_limited_sender_delivers_exactly_once(events: list[bytes], limit: int, data: st.DataObject) -> None:
    config = SenderConfig(limits=Limits(max_datagram_size=1200, max_run_datagrams=4), recarry_limit=limit)
    run_stream(events, EventKind.END, data, config, ReceiverConfig(), 0.03)
