"""Eloquent receiver state machine (sans-I/O).

Feed it datagrams and the clock; it returns the events that became renderable, in order, each exactly once,
and produces cumulative acknowledgements (at once by default, and always at once when a gap shows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eloquent_plugins.core.delta import apply_delta
from eloquent_plugins.core.errors import LimitExceeded, ProtocolViolation
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.wire import AckPacket, DataPacket, KeepAlivePacket, Packet, decode_packet, encode_packet


REFERENCE_SLACK = 256
"""Events kept below the newest delta base seen: a packet delayed behind up to this many newer acks still
decodes."""


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    limits: Limits = field(default_factory=Limits)
    ack_delay: float = 0.0
    """Longest an ack may wait for more packets to batch with; 0 acks every data packet at once, which keeps
    the sender's unacked run (and so every packet) as short as the path allows."""


@dataclass(slots=True)
class ReceiverStats:
    data_packets: int = 0
    keepalives: int = 0
    undecodable: int = 0
    """Packets whose delta base this side no longer holds; they wait for a newer packet."""
    duplicate_entries: int = 0
    acks_sent: int = 0


@dataclass(slots=True)
class _Fragments:
    total: int
    kind: EventKind
    data: bytearray
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def add(self, offset: int, piece: bytes) -> bool:
        """Store a piece; True when the whole event is present."""
        self.data[offset : offset + len(piece)] = piece
        merged: list[tuple[int, int]] = []
        for start, end in sorted([*self.ranges, (offset, offset + len(piece))]):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        self.ranges = merged
        return merged == [(0, self.total)]


class EloquentReceiver:
    """One stream's receiving half."""

    def __init__(self, stream_id: int = 0, config: ReceiverConfig | None = None) -> None:
        self.stream_id = stream_id
        self.config = config or ReceiverConfig()
        self.stats = ReceiverStats()
        self._next = 0
        self._buffer: dict[int, tuple[EventKind, bytes]] = {}
        self._buffered_bytes = 0
        self._fragments: dict[int, _Fragments] = {}
        self._references: dict[int, bytes] = {}
        """Delivered payloads a later packet may use as its delta base: always the indices ``[_references_low,
        _next)`` (``_deliver`` adds them in order, ``_prune_references`` drops them from the low end)."""
        self._references_low = 0
        self._reference_floor = -1
        self._final_index: int | None = None
        self._largest_packet = -1
        self._largest_received_at = 0.0
        self._ack_pending = False
        self._ack_deadline: float | None = None

    def receive_datagram(self, data: bytes, now: float) -> list[StreamEvent]:
        """Decode and apply one datagram; return the events it made renderable (possibly none)."""
        return self.receive_packet(decode_packet(data, self.config.limits), now)

    def receive_packet(self, packet: Packet, now: float) -> list[StreamEvent]:
        if packet.stream_id != self.stream_id:
            raise ProtocolViolation(f"packet for stream {packet.stream_id} delivered to stream {self.stream_id}")
        if isinstance(packet, KeepAlivePacket):
            self.stats.keepalives += 1
            return []
        if isinstance(packet, AckPacket):
            raise ProtocolViolation("a receiver does not accept acks")
        self.stats.data_packets += 1
        if packet.packet_number > self._largest_packet:
            self._largest_packet = packet.packet_number
            self._largest_received_at = now
        if packet.ref_index is not None and packet.ref_index > self._reference_floor:
            # The sender's acked base only grows; references below it can never be asked for again.
            self._reference_floor = min(packet.ref_index, self._next - 1)
        urgent = self._apply(packet)
        delivered = self._deliver()
        self._prune_references()
        self._schedule_ack(now, urgent or bool(self._buffer) or self.complete)
        return delivered

    def _apply(self, packet: DataPacket) -> bool:
        """Store what the packet adds; True when the packet showed a gap (so the ack should not wait)."""
        limits = self.config.limits
        previous = self._known(packet.ref_index) if packet.ref_index is not None else None
        gap = False
        for entry in packet.entries:
            index = entry.index
            if self._final_index is not None and index > self._final_index:
                raise ProtocolViolation(f"event {index} after the final event {self._final_index}")
            if entry.kind is not EventKind.DATA and self._final_index not in (None, index):
                raise ProtocolViolation(f"second final event at {index} (first at {self._final_index})")
            if index - self._next > limits.max_index_gap:
                raise LimitExceeded(f"event {index} is {index - self._next} past the next expected "
                                    f"(max_index_gap={limits.max_index_gap})")
            known = self._known(index)
            if known is not None:
                self.stats.duplicate_entries += 1
                previous = known
                continue
            # Below next_expected and not held: delivered long ago and pruned from the references (a packet
            # reordered behind many newer ones). A late duplicate: it must not go back into the buffer.
            stale = index < self._next
            if entry.is_fragment:
                if stale:
                    self.stats.duplicate_entries += 1
                    previous = None
                    continue
                previous = self._add_fragment(entry.index, entry.kind, entry.frag_total, entry.frag_offset,
                                              entry.middle)
                gap = gap or index > self._next
                continue
            if entry.delta:
                if previous is None:
                    self.stats.undecodable += 1
                    return True
                if entry.prefix + entry.suffix > len(previous):
                    raise ProtocolViolation(f"event {index}: delta takes {entry.prefix + entry.suffix} bytes "
                                            f"from a {len(previous)}-byte reference")
                payload = apply_delta(previous, entry.prefix, entry.suffix, entry.middle)
            else:
                payload = entry.middle
            if stale:
                self.stats.duplicate_entries += 1
            else:
                self._store(index, entry.kind, payload)
                gap = gap or index > self._next
            previous = payload
        return gap

    def _known(self, index: int) -> bytes | None:
        if index < self._next:
            return self._references.get(index)
        held = self._buffer.get(index)
        return held[1] if held is not None else None

    def _store(self, index: int, kind: EventKind, payload: bytes) -> None:
        limits = self.config.limits
        if self._buffered_bytes + len(payload) > limits.max_buffered_bytes:
            raise LimitExceeded(f"receiver buffer above max_buffered_bytes={limits.max_buffered_bytes}")
        if kind is not EventKind.DATA:
            self._final_index = index
            if any(i > index for i in self._buffer):
                raise ProtocolViolation(f"events buffered past the final event {index}")
        self._buffer[index] = (kind, payload)
        self._buffered_bytes += len(payload)

    def _add_fragment(self, index: int, kind: EventKind, total: int, offset: int, piece: bytes) -> bytes | None:
        frags = self._fragments.get(index)
        if frags is None:
            if sum(f.total for f in self._fragments.values()) + total + self._buffered_bytes > \
                    self.config.limits.max_buffered_bytes:
                raise LimitExceeded("fragmented events above max_buffered_bytes")
            frags = self._fragments[index] = _Fragments(total, kind, bytearray(total))
        elif frags.total != total or frags.kind is not kind:
            raise ProtocolViolation(f"event {index}: fragments disagree on size or kind")
        if frags.add(offset, piece):
            del self._fragments[index]
            payload = bytes(frags.data)
            self._store(index, kind, payload)
            return payload
        return None

    def _deliver(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        while self._next in self._buffer:
            kind, payload = self._buffer.pop(self._next)
            self._buffered_bytes -= len(payload)
            self._references[self._next] = payload
            out.append(StreamEvent(self._next, payload, kind))
            self._next += 1
        return out

    def _prune_references(self) -> None:
        """Keep the events a future packet may use as its delta base: from the sender's newest base (less a
        slack for packets reordered behind newer ones) to the newest delivered."""
        floor = max(self._reference_floor - REFERENCE_SLACK, self._next - 1 - self.config.limits.max_index_gap)
        if len(self._references) > 1:
            references, low = self._references, self._references_low
            while low < floor:  # the held indices are contiguous: drop from the low end, never scan them all
                del references[low]
                low += 1
            self._references_low = low

    # ---- acks --------------------------------------------------------------------------------------------
    def _schedule_ack(self, now: float, urgent: bool) -> None:
        self._ack_pending = True
        due = now if urgent or self.config.ack_delay <= 0 else now + self.config.ack_delay
        self._ack_deadline = due if self._ack_deadline is None else min(self._ack_deadline, due)

    def next_deadline(self) -> float | None:
        return self._ack_deadline if self._ack_pending else None

    def handle_timer(self, now: float) -> None:
        """Nothing to do beyond what ``datagrams_to_send`` checks; kept for a uniform driver loop."""

    def datagrams_to_send(self, now: float) -> list[bytes]:
        if not self._ack_pending or self._ack_deadline is None or now < self._ack_deadline:
            return []
        self._ack_pending = False
        self._ack_deadline = None
        self.stats.acks_sent += 1
        ack = AckPacket(self.stream_id, self._next, self._largest_packet, max(0.0, now - self._largest_received_at))
        return [encode_packet(ack)]

    # ---- state -------------------------------------------------------------------------------------------
    @property
    def next_expected(self) -> int:
        return self._next

    @property
    def complete(self) -> bool:
        """The final event has been delivered."""
        return self._final_index is not None and self._next > self._final_index
