"""Fuzz the datagram decoder: any bytes a network peer sends must decode or raise DecodeError/LimitExceeded.

Also checks that whatever decodes re-encodes to a packet that decodes to the same thing (so the sender and the
receiver agree on every field a hostile peer can reach), that ``peek_stream_id`` agrees with the decoder, and that
zero padding after a packet changes nothing while any other trailing byte is refused.
Run: ``python fuzz/fuzz_wire.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from eloquent_plugins.core.errors import DecodeError, LimitExceeded
    from eloquent_plugins.core.limits import Limits
    from eloquent_plugins.core.wire import (
        AckPacket,
        DataPacket,
        decode_packet,
        encode_packet,
        pad_packet,
        peek_stream_id,
    )

# The default limits, and tight ones so the LimitExceeded branches are reachable with short inputs.
LIMITS = (Limits(), Limits(max_datagram_size=64, max_event_bytes=256, max_entries_per_packet=4,
                           max_stream_id=1 << 20))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    limits = LIMITS[data[0] & 1]
    packet_bytes = data[1:]
    try:
        packet = decode_packet(packet_bytes, limits)
    except (DecodeError, LimitExceeded):
        try:
            peek_stream_id(packet_bytes)
        except DecodeError:
            pass
        return
    assert peek_stream_id(packet_bytes) == packet.stream_id
    again = decode_packet(encode_packet(packet), Limits(max_datagram_size=1 << 16))
    if isinstance(packet, AckPacket):
        # ack_delay travels as whole microseconds; float rounding may move it by one.
        assert isinstance(again, AckPacket)
        assert (again.stream_id, again.next_expected, again.largest_packet_number) == \
            (packet.stream_id, packet.next_expected, packet.largest_packet_number)
        assert abs(again.ack_delay - packet.ack_delay) <= max(2e-6, packet.ack_delay * 1e-12)
    else:
        assert again == packet, (packet, again)
    # Padding (zero bytes after the last field) never changes what decodes; any other trailing byte is refused.
    wide = Limits(max_datagram_size=1 << 16)
    encoded = encode_packet(packet)
    assert decode_packet(pad_packet(encoded, len(encoded) + 1 + data[0] % 64), wide) == again
    try:
        decode_packet(encoded + bytes((1 + data[0] % 255,)), wide)
    except DecodeError:
        pass
    else:
        raise AssertionError("a non-zero byte after a packet decoded")
    if isinstance(packet, DataPacket):
        assert 1 <= len(packet.entries) <= limits.max_entries_per_packet
        for i, entry in enumerate(packet.entries):
            assert entry.index == packet.first_index + i
            if entry.is_fragment:
                assert len(packet.entries) == 1
                assert 0 < len(entry.middle) and entry.frag_offset + len(entry.middle) <= entry.frag_total
                assert entry.frag_total <= limits.max_event_bytes
            else:
                assert len(entry.middle) + entry.prefix + entry.suffix <= limits.max_event_bytes


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
