"""The decoder and both state machines, fed arbitrary bytes, raise only typed protocol errors."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins import EloquentReceiver, EloquentSender, Limits, ProtocolError
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.wire import (VERSION, AckPacket, DataPacket, Entry, KeepAlivePacket, PacketType,
                                   decode_packet, encode_packet)

FUZZ = settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = Limits(max_datagram_size=1200, max_event_bytes=4096, max_index_gap=64, max_buffered_bytes=65536)

header_bytes = st.builds(lambda t, rest: bytes((VERSION, t)) + rest,
                         st.sampled_from([int(p) for p in PacketType] + [0, 9, 255]), st.binary(max_size=200))
any_bytes = st.one_of(st.binary(max_size=300), header_bytes)


@FUZZ
@given(data=any_bytes)
def test_decoder_raises_only_protocol_errors(data: bytes) -> None:
    try:
        packet = decode_packet(data, LIMITS)
    except ProtocolError:
        return
    assert encode_packet(packet) == data or decode_packet(encode_packet(packet), LIMITS) == packet


@FUZZ
@given(datagrams=st.lists(any_bytes, max_size=8))
def test_receiver_raises_only_protocol_errors(datagrams: list[bytes]) -> None:
    receiver = EloquentReceiver(0, __import__("eloquent_plugins").ReceiverConfig(limits=LIMITS))
    for i, datagram in enumerate(datagrams):
        try:
            receiver.receive_datagram(datagram, float(i))
        except ProtocolError:
            pass
        receiver.datagrams_to_send(float(i))


entries = st.lists(st.builds(Entry, st.just(0), st.sampled_from(list(EventKind)), st.binary(max_size=64),
                             st.booleans(), st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=5)


@st.composite
def structured_packets(draw: st.DrawFn) -> bytes:
    """Well-formed-looking packets with hostile field values, to reach deep receiver states."""
    kind = draw(st.sampled_from(["data", "ack", "keepalive"]))
    stream = draw(st.sampled_from([0, 0, 0, 1]))
    if kind == "ack":
        return encode_packet(AckPacket(stream, draw(st.integers(0, 100)), draw(st.integers(0, 100)), 0.0))
    if kind == "keepalive":
        return encode_packet(KeepAlivePacket(stream, draw(st.integers(0, 100))))
    first = draw(st.integers(0, 80))
    items = draw(entries)
    items = [Entry(first + i, e.kind, e.middle, e.delta, e.prefix, e.suffix) for i, e in enumerate(items)]
    ref = draw(st.one_of(st.none(), st.integers(0, max(0, first - 1)))) if first else None
    return encode_packet(DataPacket(stream, draw(st.integers(0, 50)), ref, first, tuple(items)))


@FUZZ
@given(datagrams=st.lists(structured_packets(), max_size=12))
def test_receiver_structured_hostile_packets(datagrams: list[bytes]) -> None:
    receiver = EloquentReceiver(0, __import__("eloquent_plugins").ReceiverConfig(limits=LIMITS))
    delivered: list[int] = []
    for i, datagram in enumerate(datagrams):
        try:
            delivered.extend(e.index for e in receiver.receive_datagram(datagram, float(i)))
        except ProtocolError:
            pass
    assert delivered == list(range(len(delivered))), "delivered out of order or twice"


@FUZZ
@given(datagrams=st.lists(st.one_of(any_bytes, structured_packets()), max_size=8), pushed=st.integers(0, 5))
def test_sender_raises_only_protocol_errors(datagrams: list[bytes], pushed: int) -> None:
    sender = EloquentSender(0, __import__("eloquent_plugins").SenderConfig(limits=LIMITS))
    for i in range(pushed):
        sender.push(b"event %d" % i, 0.0)
    sender.datagrams_to_send(0.0)
    for i, datagram in enumerate(datagrams):
        try:
            sender.receive_datagram(datagram, 0.1 * i)
        except ProtocolError:
            pass
        sender.datagrams_to_send(0.1 * i)
    assert sender.acked <= pushed


def test_ack_delay_survives_a_round_trip_exactly() -> None:
    """Found by hypothesis in CI: 15964 us decodes to 0.015964 s, whose float times 1e6 is 15963.999...; encoding
    truncated it to 15963, so a re-encoded ack differed from the one received."""
    for us in (15964, 1, 7, 999_999, 123_456_789, 2**40 + 1):
        packet = AckPacket(0, 0, 0, us / 1_000_000)
        assert decode_packet(encode_packet(packet)) == packet
