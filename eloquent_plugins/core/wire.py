"""Eloquent wire format, version 1: binary packets carried in one datagram each. See docs/PROTOCOL.md.

Pure functions: bytes in, dataclasses out (and back). Decoding checks every length against ``Limits`` and
raises only ``DecodeError`` / ``LimitExceeded``, so a transport can hand it hostile bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from eloquent_plugins.core.errors import DecodeError, LimitExceeded
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.varint import MAX_VARINT, decode_varint, encode_varint, varint_size

VERSION = 1

_KIND_MASK = 0x03
_FLAG_FRAGMENT = 0x04
_FLAG_DELTA = 0x08
_KNOWN_FLAGS = _KIND_MASK | _FLAG_FRAGMENT | _FLAG_DELTA
_KINDS = (EventKind.DATA, EventKind.END, EventKind.ERROR)
"""Event kinds by wire value (a tuple index, not an ``EventKind(value)`` call per entry)."""


class PacketType(IntEnum):
    DATA = 1
    ACK = 2
    KEEPALIVE = 3


@dataclass(frozen=True, slots=True)
class Entry:
    """One event in a data packet, either whole (possibly as a delta) or as one fragment of a large event.

    Whole entries: the payload is ``reference[:prefix] + middle + reference[-suffix:]`` where the reference is
    the previous entry of the packet (or the packet's ``ref_index`` event for the first entry); with
    ``delta`` false, ``middle`` is the payload. Fragments carry raw bytes ``[frag_offset, +len(middle))`` of an
    event of ``frag_total`` bytes and always travel alone in their packet.
    """

    index: int
    kind: EventKind
    middle: bytes
    delta: bool = False
    prefix: int = 0
    suffix: int = 0
    frag_total: int = 0
    frag_offset: int = 0

    @property
    def is_fragment(self) -> bool:
        return self.frag_total > 0

    def encoded_size(self) -> int:
        n = 1 + varint_size(len(self.middle)) + len(self.middle)
        if self.frag_total:
            return n + varint_size(self.frag_total) + varint_size(self.frag_offset)
        if self.delta:
            return n + varint_size(self.prefix) + varint_size(self.suffix)
        return n


@dataclass(frozen=True, slots=True)
class DataPacket:
    stream_id: int
    packet_number: int
    ref_index: int | None
    """Index of an event the receiver already holds, the delta base of the first entry; None if unused."""
    first_index: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class AckPacket:
    stream_id: int
    next_expected: int
    """Cumulative: the receiver holds every event below this index."""
    largest_packet_number: int
    """Newest data packet number received, echoed for the sender's RTT estimate."""
    ack_delay: float
    """Seconds between receiving that packet and sending this ack (sent as microseconds)."""


@dataclass(frozen=True, slots=True)
class KeepAlivePacket:
    stream_id: int
    packet_number: int


Packet = DataPacket | AckPacket | KeepAlivePacket


def data_header_size(stream_id: int, packet_number: int, ref_index: int | None, first_index: int,
                     count: int) -> int:
    """Bytes of a data packet before its entries; the sender uses it to fill the datagram budget."""
    ref = 0 if ref_index is None else ref_index + 1
    return (2 + varint_size(stream_id) + varint_size(packet_number) + varint_size(ref)
            + varint_size(first_index) + varint_size(count))


def encode_packet(packet: Packet) -> bytes:
    if isinstance(packet, DataPacket):
        return _encode_data(packet)
    if isinstance(packet, AckPacket):
        delay_us = min(MAX_VARINT, max(0, round(packet.ack_delay * 1_000_000)))
        return b"".join((bytes((VERSION, PacketType.ACK)), encode_varint(packet.stream_id),
                         encode_varint(packet.next_expected), encode_varint(packet.largest_packet_number),
                         encode_varint(delay_us)))
    if isinstance(packet, KeepAlivePacket):
        return b"".join((bytes((VERSION, PacketType.KEEPALIVE)), encode_varint(packet.stream_id),
                         encode_varint(packet.packet_number)))
    raise TypeError(f"not a packet: {packet!r}")


def _encode_data(packet: DataPacket) -> bytes:
    return encode_data_from(packet, [encode_entry(entry) for entry in packet.entries])


def encode_data_from(packet: DataPacket, entries: Sequence[bytes]) -> bytes:
    """A data packet's bytes from ``encode_entry`` of each of its entries: a sender that resends the same entries
    packet after packet (the unacked run) encodes each once."""
    ref = 0 if packet.ref_index is None else packet.ref_index + 1
    return b"".join((bytes((VERSION, PacketType.DATA)), encode_varint(packet.stream_id),
                     encode_varint(packet.packet_number), encode_varint(ref), encode_varint(packet.first_index),
                     encode_varint(len(packet.entries)), *entries))


def encode_entry(entry: Entry) -> bytes:
    """One entry as it goes in a data packet (``encoded_size`` bytes)."""
    flags = int(entry.kind)
    if entry.frag_total:
        head = (bytes((flags | _FLAG_FRAGMENT,)), encode_varint(entry.frag_total), encode_varint(entry.frag_offset))
    elif entry.delta:
        head = (bytes((flags | _FLAG_DELTA,)), encode_varint(entry.prefix), encode_varint(entry.suffix))
    else:
        head = (bytes((flags,)),)
    return b"".join((*head, encode_varint(len(entry.middle)), entry.middle))


def peek_stream_id(data: bytes) -> int:
    """Stream id of a packet without decoding the rest, so a transport can route it cheaply."""
    _check_header(data)
    return decode_varint(data, 2)[0]


def _check_header(data: bytes) -> int:
    if len(data) < 3:
        raise DecodeError(f"packet too short ({len(data)} bytes)")
    if data[0] != VERSION:
        raise DecodeError(f"unsupported protocol version {data[0]} (this side speaks {VERSION})")
    ptype = data[1]
    if ptype not in (PacketType.DATA, PacketType.ACK, PacketType.KEEPALIVE):
        raise DecodeError(f"unknown packet type {ptype}")
    return ptype


def decode_packet(data: bytes, limits: Limits | None = None) -> Packet:
    """Decode one datagram. Raises DecodeError or LimitExceeded, nothing else, whatever the bytes are."""
    limits = limits or _DEFAULT_LIMITS
    if len(data) > max(limits.max_datagram_size, 1) * 64:
        raise LimitExceeded(f"datagram of {len(data)} bytes is far above the {limits.max_datagram_size} budget")
    ptype = _check_header(data)
    stream_id, pos = decode_varint(data, 2)
    if stream_id > limits.max_stream_id:
        raise LimitExceeded(f"stream id {stream_id} above max_stream_id")
    if ptype == PacketType.ACK:
        next_expected, pos = decode_varint(data, pos)
        largest, pos = decode_varint(data, pos)
        delay_us, pos = decode_varint(data, pos)
        _expect_end(data, pos)
        return AckPacket(stream_id, next_expected, largest, delay_us / 1_000_000)
    if ptype == PacketType.KEEPALIVE:
        number, pos = decode_varint(data, pos)
        _expect_end(data, pos)
        return KeepAlivePacket(stream_id, number)
    return _decode_data(data, pos, stream_id, limits)


def _expect_end(data: bytes, pos: int) -> None:
    """Past the last field only padding may follow: zero bytes to the end of the datagram (``pad_packet``)."""
    end = len(data)
    if pos != end and data.count(0, pos) != end - pos:
        raise DecodeError(f"{end - pos} trailing bytes after packet (padding is zero bytes only)")


def pad_packet(data: bytes, size: int) -> bytes:
    """``data`` (an encoded packet) padded to ``size`` bytes with zeros, which every decoder skips (the way QUIC's
    PADDING frames are zero bytes): what ``core.padding`` uses to make datagrams take a few sizes only."""
    gap = size - len(data)
    return data + bytes(gap) if gap > 0 else data


def _decode_data(data: bytes, pos: int, stream_id: int, limits: Limits) -> DataPacket:
    number, pos = decode_varint(data, pos)
    ref, pos = decode_varint(data, pos)
    first_index, pos = decode_varint(data, pos)
    count, pos = decode_varint(data, pos)
    if count == 0:
        raise DecodeError("data packet with no entries")
    if count > limits.max_entries_per_packet:
        raise LimitExceeded(f"{count} entries in one packet (max_entries_per_packet={limits.max_entries_per_packet})")
    if first_index + count - 1 > MAX_VARINT:
        raise DecodeError("event index overflow")
    ref_index = None if ref == 0 else ref - 1
    if ref_index is not None and ref_index >= first_index:
        raise DecodeError(f"reference event {ref_index} is not before the first entry {first_index}")
    entries: list[Entry] = []
    end = len(data)
    last = count - 1
    for i in range(count):
        if pos >= end:
            raise DecodeError("truncated entry")
        flags = data[pos]
        pos += 1
        if flags & ~_KNOWN_FLAGS:
            raise DecodeError(f"unknown entry flags 0x{flags:02x}")
        kind_value = flags & _KIND_MASK
        if kind_value > EventKind.ERROR:
            raise DecodeError(f"unknown event kind {kind_value}")
        kind = _KINDS[kind_value]
        if kind_value and i != last:
            raise DecodeError("a final event must be the last entry of its packet")
        frag_total = frag_offset = prefix = suffix = 0
        is_fragment = bool(flags & _FLAG_FRAGMENT)
        is_delta = bool(flags & _FLAG_DELTA)
        if is_fragment and is_delta:
            raise DecodeError("an entry cannot be both a fragment and a delta")
        if is_fragment:
            if count != 1:
                raise DecodeError("a fragment must travel alone in its packet")
            frag_total, pos = decode_varint(data, pos)
            frag_offset, pos = decode_varint(data, pos)
        elif is_delta:
            # One-byte varints (values below 64) inline: the common case; decode_varint does the rest and the errors.
            if pos < end and data[pos] < 0x40:
                prefix = data[pos]
                pos += 1
            else:
                prefix, pos = decode_varint(data, pos)
            if pos < end and data[pos] < 0x40:
                suffix = data[pos]
                pos += 1
            else:
                suffix, pos = decode_varint(data, pos)
            if i == 0 and ref_index is None:
                raise DecodeError("delta entry without a reference event")
        if pos < end and data[pos] < 0x40:
            length = data[pos]
            pos += 1
        else:
            length, pos = decode_varint(data, pos)
        if pos + length > end:
            raise DecodeError("entry runs past the end of the packet")
        if is_fragment:
            if frag_total > limits.max_event_bytes:
                raise LimitExceeded(f"event of {frag_total} bytes (max_event_bytes={limits.max_event_bytes})")
            if length == 0 or frag_offset + length > frag_total:
                raise DecodeError("fragment outside its event")
        elif length + prefix + suffix > limits.max_event_bytes:
            raise LimitExceeded(f"event above max_event_bytes={limits.max_event_bytes}")
        entries.append(Entry(first_index + i, kind, data[pos : pos + length], is_delta, prefix, suffix,
                             frag_total, frag_offset))
        pos += length
    _expect_end(data, pos)
    return DataPacket(stream_id, number, ref_index, first_index, tuple(entries))


_DEFAULT_LIMITS = Limits()
