"""Wire format: round trips, exact bytes, limits, and what a receiver refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eloquent_plugins import (DecodeError, EloquentReceiver, EloquentSender, LimitExceeded, Limits,
                              ProtocolViolation, ReceiverConfig)
from eloquent_plugins.core.delta import apply_delta, make_delta
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.varint import decode_varint, encode_varint
from eloquent_plugins.core.wire import AckPacket, DataPacket, Entry, KeepAlivePacket, decode_packet, encode_packet


@given(st.integers(0, (1 << 62) - 1))
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded, 0) == (value, len(encoded))


def test_varint_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_varint(1 << 62)
    with pytest.raises(DecodeError):
        decode_varint(b"\x80\x00", 0)


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_delta_rebuilds_exact_bytes(reference: bytes, payload: bytes) -> None:
    prefix, suffix, middle = make_delta(reference, payload)
    assert prefix + suffix <= min(len(reference), len(payload))
    assert apply_delta(reference, prefix, suffix, middle) == payload


def test_known_packet_bytes() -> None:
    """Pin the v1 layout so an accidental format change fails loudly (docs/PROTOCOL.md documents it)."""
    packet = DataPacket(3, 5, None, 0, (Entry(0, EventKind.DATA, b"hi"), Entry(1, EventKind.END, b"")))
    assert encode_packet(packet) == bytes([1, 1, 3, 5, 0, 0, 2, 0, 2]) + b"hi" + bytes([1, 0])
    assert encode_packet(AckPacket(3, 2, 5, 0.000064)) == bytes([1, 2, 3, 2, 5, 0x40, 64])
    assert encode_packet(KeepAlivePacket(3, 6)) == bytes([1, 3, 3, 6])
    assert decode_packet(encode_packet(packet)) == packet


@pytest.mark.parametrize("data, error", [
    (b"", DecodeError), (b"\x02\x01\x00", DecodeError), (b"\x01\x07\x00", DecodeError),
    (bytes([1, 1, 0, 0, 0, 0, 0]), DecodeError),                       # no entries
    (bytes([1, 1, 0, 0, 0, 0, 1, 0x10, 0]), DecodeError),              # unknown flag
    (bytes([1, 1, 0, 0, 0, 0, 1, 0x03, 0]), DecodeError),              # unknown kind
    (bytes([1, 1, 0, 0, 0, 0, 2, 1, 0, 0, 0]), DecodeError),           # final event not last
    (bytes([1, 1, 0, 0, 0, 0, 1, 0x08, 0, 0, 0]), DecodeError),        # delta without reference
    (bytes([1, 1, 0, 0, 0, 0, 1, 0, 5, 1]), DecodeError),              # entry past the end
    (bytes([1, 2, 0, 0, 0, 0, 9]), DecodeError),                       # trailing bytes
])
def test_decoder_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_packet(data)


def test_limits_enforced() -> None:
    limits = Limits(max_event_bytes=100, max_entries_per_packet=2)
    big = DataPacket(0, 0, None, 0, (Entry(0, EventKind.DATA, b"x" * 101),))
    with pytest.raises(LimitExceeded):
        decode_packet(encode_packet(big), limits)
    many = DataPacket(0, 0, None, 0, tuple(Entry(i, EventKind.DATA, b"x") for i in range(3)))
    with pytest.raises(LimitExceeded):
        decode_packet(encode_packet(many), limits)


def test_receiver_refuses_index_gap_beyond_limit() -> None:
    receiver = EloquentReceiver(0, ReceiverConfig(limits=Limits(max_index_gap=10)))
    far = DataPacket(0, 0, None, 50, (Entry(50, EventKind.DATA, b"x"),))
    with pytest.raises(LimitExceeded, match="max_index_gap"):
        receiver.receive_datagram(encode_packet(far), 0.0)


def test_receiver_refuses_events_after_final() -> None:
    receiver = EloquentReceiver(0)
    receiver.receive_datagram(encode_packet(DataPacket(0, 0, None, 0, (Entry(0, EventKind.END, b""),))), 0.0)
    with pytest.raises(ProtocolViolation):
        receiver.receive_datagram(encode_packet(DataPacket(0, 1, None, 1, (Entry(1, EventKind.DATA, b"x"),))), 0.0)


def test_sender_refuses_ack_for_unsent_events() -> None:
    sender = EloquentSender(0)
    sender.push(b"a", 0.0)
    sender.datagrams_to_send(0.0)
    with pytest.raises(ProtocolViolation, match="only 1 were sent"):
        sender.receive_datagram(encode_packet(AckPacket(0, 5, 0, 0.0)), 0.1)
    with pytest.raises(ProtocolViolation, match="never sent"):
        sender.receive_datagram(encode_packet(AckPacket(0, 1, 9, 0.0)), 0.1)


def test_run_split_oldest_first_each_datagram_alone() -> None:
    """A run bigger than the budget is split oldest-first; any single datagram renders on its own."""
    limits = Limits(max_datagram_size=120)
    sender = EloquentSender(0, __import__("eloquent_plugins").SenderConfig(limits=limits))
    payloads = [b"event-%03d-" % i + bytes([65 + i % 26]) * 30 for i in range(12)]
    for p in payloads:
        sender.push(p, 0.0)
    datagrams = sender.datagrams_to_send(0.0)
    assert len(datagrams) > 1 and all(len(d) <= 120 for d in datagrams)
    firsts = [decode_packet(d).first_index for d in datagrams]
    assert firsts == sorted(firsts) and firsts[0] == 0
    # The last datagram alone, to a receiver holding the events before it, renders its events.
    receiver = EloquentReceiver(0, ReceiverConfig(limits=limits))
    got = [e for d in reversed(datagrams) for e in receiver.receive_datagram(d, 0.0)]
    assert [e.payload for e in got] == payloads


def test_large_event_is_fragmented_and_reassembled() -> None:
    limits = Limits(max_datagram_size=200)
    sender = EloquentSender(0, __import__("eloquent_plugins").SenderConfig(limits=limits))
    big = bytes(range(256)) * 8
    sender.push(b"small", 0.0)
    sender.push(big, 0.0)
    sender.end(0.0)
    datagrams = sender.datagrams_to_send(0.0)
    assert all(len(d) <= 200 for d in datagrams) and len(datagrams) > 10
    receiver = EloquentReceiver(0, ReceiverConfig(limits=limits))
    got = [e for d in reversed(datagrams) for e in receiver.receive_datagram(d, 0.0)]
    assert [e.payload for e in got] == [b"small", big, b""]
    assert receiver.complete


def test_delta_makes_openai_chunks_small() -> None:
    sender = EloquentSender(0)
    receiver = EloquentReceiver(0)
    chunk = b'{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}'
    sizes = []
    for word in (b"Hello", b" world", b" again"):
        sender.push(chunk % word, 0.0)
        datagrams = sender.datagrams_to_send(0.0)
        sizes.append(sum(map(len, datagrams)))
        for d in datagrams:
            receiver.receive_datagram(d, 0.0)
        for ack in receiver.datagrams_to_send(0.0):
            sender.receive_datagram(ack, 0.01)
    assert sizes[0] > len(chunk) - 10  # first event goes whole
    assert sizes[2] < sizes[0] // 4    # later ones carry only their differing bytes
