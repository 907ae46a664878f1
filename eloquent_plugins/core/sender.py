"""Eloquent sender state machine (sans-I/O).

Feed it engine events (``push``/``end``/``fail``), peer datagrams (``receive_datagram``) and the clock
(``handle_timer``); pull datagrams with ``datagrams_to_send`` and sleep until ``next_deadline``. Every data
packet carries the run from the oldest unacknowledged event to the newest, so any packet that arrives can be
rendered on its own. Packets are built when the transport pulls them, never queued inside: a later packet
supersedes an earlier one by construction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from eloquent_plugins.core.delta import make_delta
from eloquent_plugins.core.errors import ProtocolViolation, StreamClosed
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.keepalive import KeepAlivePolicy, KeepAliveTimer
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.rtt import LossEstimator, RttEstimator
from eloquent_plugins.core.wire import AckPacket, DataPacket, Entry, KeepAlivePacket, data_header_size, decode_packet, encode_packet

_SENT_HISTORY = 1024
_PACKET_THRESHOLD = 3
"""Duplication mode: a packet is lost once an ack covers a packet this many numbers newer (QUIC's kPacketThreshold)."""


@dataclass(frozen=True, slots=True)
class SenderConfig:
    limits: Limits = field(default_factory=Limits)
    initial_rtt: float = 0.25
    max_ack_delay: float = 0.005
    """What the sender assumes the receiver may delay an ack by (the receiver default acks at once)."""
    max_probe_interval: float = 1.0
    """Cap on backed-off tail probes, so a stream resumes within this long after an outage ends."""
    keepalive: KeepAlivePolicy = field(default_factory=lambda: KeepAlivePolicy(interval=15.0))
    delta: bool = True
    """Encode each event as a prefix/suffix delta against the one before it."""
    carry_unacked: bool = True
    """The Eloquent rule: every packet carries the whole unacked run. False sends only new events (tail
    probes still resend the run): the packet-duplication baseline, driven by the same machine."""
    copies: int = 1
    """Send each datagram this many times (2 for the duplication baseline)."""
    redundancy: Literal["off", "adaptive"] | int = "off"
    """Copies of every run datagram, each under its own packet number: "off" (one), an int n (always n), or
    "adaptive": two while the loss estimate is at least ``redundancy_threshold``, one on a clean path. A copy
    repairs an independent loss at once instead of one token interval later."""
    redundancy_threshold: float = 0.01
    """Adaptive mode: the smoothed round-trip packet loss rate at or above which runs are sent twice."""
    loss_gain: float = 1 / 16
    """Weight of each packet in the loss estimate (``rtt.LossEstimator``): how fast it forgets."""
    cadence_probes: bool = False
    """While the loss estimate is at or above ``redundancy_threshold``, resend the run once no packet has left for
    1.5 mean push intervals, until a probe timeout after the newest event first left: the tail and generation
    gaps get a packet per token interval (as the simulator's oracle does) instead of waiting a PTO."""

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ValueError(f"copies must be >= 1, got {self.copies}")
        r = self.redundancy
        if isinstance(r, bool) or not (r in ("off", "adaptive") or (isinstance(r, int) and r >= 1)):
            raise ValueError(f'redundancy must be "off", "adaptive" or an int >= 1, got {r!r}')
        if not 0 <= self.redundancy_threshold <= 1:
            raise ValueError(f"redundancy_threshold must be in [0, 1], got {self.redundancy_threshold}")
        if not 0 < self.loss_gain <= 1:
            raise ValueError(f"loss_gain must be in (0, 1], got {self.loss_gain}")


@dataclass(slots=True)
class SenderStats:
    data_packets: int = 0
    probe_packets: int = 0
    keepalive_packets: int = 0
    bytes_sent: int = 0
    acks_received: int = 0
    events_resent: int = 0
    redundant_packets: int = 0
    """Extra copies sent by ``SenderConfig.redundancy`` (also counted in ``data_packets``)."""


class EloquentSender:
    """One stream's sending half. Not thread-safe; one transport drives it."""

    def __init__(self, stream_id: int = 0, config: SenderConfig | None = None, *, now: float = 0.0) -> None:
        self.stream_id = stream_id
        self.config = config or SenderConfig()
        self.rtt = RttEstimator(self.config.initial_rtt)
        self.loss = LossEstimator(self.config.loss_gain)
        self.stats = SenderStats()
        self._unacked: deque[StreamEvent] = deque()
        self._deltas: dict[int, tuple[int, int, bytes]] = {}
        self._base = 0
        self._next_index = 0
        self._reference: bytes | None = None
        self._packet_number = 0
        self._sent_times: dict[int, float] = {}
        self._data_numbers: deque[int] = deque()
        """Numbers of data packets above the largest acked, oldest first: what the loss estimate counts."""
        self._run_packets: list[DataPacket] = []
        """The data packets of the last run built, in datagram order: redundant copies re-number these."""
        self._largest_acked_packet = -1
        self._sent_upto = -1
        self._last_flush_last_packet = -1
        self._last_flush_tail: tuple[int, ...] = ()
        """Numbers of the newest flush's last datagram and its redundant copies."""
        self._dirty = False
        self._probe_due = False
        self._pto_count = 0
        self._last_data_send: float | None = None
        self._new_data_at: float | None = None
        self._last_push: float | None = None
        self._push_gap: float | None = None
        """Smoothed interval between pushes: the token cadence cadence probes follow."""
        self._cadence_due = False
        self._keepalive = KeepAliveTimer(self.config.keepalive, now)
        self._keepalive_due = False
        self._final = False
        self._carried_in: dict[int, int] = {}
        """Duplication mode only: event index -> number of the last packet that carried it."""

    # ---- engine side -------------------------------------------------------------------------------------
    def push(self, payload: bytes, now: float, kind: EventKind = EventKind.DATA) -> StreamEvent:
        """Append an event to the log; it goes out on the next ``datagrams_to_send``."""
        if self._final:
            raise StreamClosed(f"stream {self.stream_id} already ended; cannot push event {self._next_index}")
        limit = self.config.limits.max_event_bytes
        if len(payload) > limit:
            raise ValueError(f"event of {len(payload)} bytes exceeds max_event_bytes={limit}")
        event = StreamEvent(self._next_index, bytes(payload), kind)
        if self._last_push is not None and now > self._last_push:
            gap = now - self._last_push
            self._push_gap = gap if self._push_gap is None else 0.875 * self._push_gap + 0.125 * gap
        self._last_push = now
        if self.config.delta:
            previous = self._unacked[-1].payload if self._unacked else self._reference
            if previous is not None:
                self._deltas[event.index] = make_delta(previous, event.payload)
        self._unacked.append(event)
        self._next_index += 1
        self._dirty = True
        if kind is not EventKind.DATA:
            self._final = True
        return event

    def end(self, now: float, payload: bytes = b"") -> StreamEvent:
        """Close the log with the final END event (``payload`` may carry the engine's own terminator)."""
        return self.push(payload, now, EventKind.END)

    def fail(self, payload: bytes, now: float) -> StreamEvent:
        """Close the log with an in-band ERROR event carrying the engine's error in its own format."""
        return self.push(payload, now, EventKind.ERROR)

    # ---- peer side ---------------------------------------------------------------------------------------
    def receive_datagram(self, data: bytes, now: float) -> None:
        packet = decode_packet(data, self.config.limits)
        if not isinstance(packet, AckPacket):
            raise ProtocolViolation(f"a sender only accepts acks, got {type(packet).__name__}")
        self.receive_ack(packet, now)

    def receive_ack(self, ack: AckPacket, now: float) -> None:
        if ack.stream_id != self.stream_id:
            raise ProtocolViolation(f"ack for stream {ack.stream_id} delivered to stream {self.stream_id}")
        if ack.next_expected > self._sent_upto + 1:
            raise ProtocolViolation(
                f"ack claims events up to {ack.next_expected - 1} but only {self._sent_upto + 1} were sent")
        if ack.largest_packet_number >= self._packet_number:
            raise ProtocolViolation(f"ack for packet {ack.largest_packet_number}, never sent")
        self.stats.acks_received += 1
        if ack.largest_packet_number > self._largest_acked_packet:
            self._sample_loss(ack.largest_packet_number)
            self._largest_acked_packet = ack.largest_packet_number
            sent_at = self._sent_times.get(ack.largest_packet_number)
            if sent_at is not None:
                self.rtt.update(now - sent_at, ack.ack_delay)
        if ack.next_expected > self._base:
            while self._unacked and self._unacked[0].index < ack.next_expected:
                event = self._unacked.popleft()
                self._deltas.pop(event.index, None)
                self._carried_in.pop(event.index, None)
                self._reference = event.payload
            self._base = ack.next_expected
            self._pto_count = 0
            self._probe_due = False
            if self._sent_upto + 1 < self._next_index:
                self._dirty = True  # a flush was cut at max_run_datagrams: the window moved, send more
        elif (self._unacked and ack.largest_packet_number in self._last_flush_tail
              and not self._dirty):
            # The receiver has our newest flush but still misses its start: part of a split run was lost.
            self._probe_due = True
        if not self.config.carry_unacked and self._unacked:
            # Packets carry only new events here, so a lost one is never repaired by the next: once an ack
            # covers a packet _PACKET_THRESHOLD newer than the last one carrying the oldest unacked event,
            # that event's packet is lost and the run is resent from it (as a retransmission would).
            carried = self._carried_in.get(self._unacked[0].index)
            if carried is not None and ack.largest_packet_number >= carried + _PACKET_THRESHOLD:
                self._probe_due = True

    def _sample_loss(self, largest: int) -> None:
        """Data packets sent before ``largest`` and above the previous largest acked were never reported."""
        numbers = self._data_numbers
        unreported = 0
        while numbers and numbers[0] < largest:
            numbers.popleft()
            unreported += 1
        if numbers and numbers[0] == largest:
            numbers.popleft()
        self.loss.on_ack(unreported)

    def copies_now(self) -> int:
        """How many copies of each run datagram the next flush sends (``SenderConfig.redundancy``)."""
        mode = self.config.redundancy
        if mode == "off":
            return 1
        if mode == "adaptive":
            return 2 if self.loss.rate >= self.config.redundancy_threshold and self.loss.rate > 0 else 1
        return int(mode)

    # ---- clock -------------------------------------------------------------------------------------------
    def _probe_deadline(self) -> float | None:
        if not self._unacked or self._last_data_send is None:
            return None
        pto = self.rtt.probe_timeout(self.config.max_ack_delay)
        interval = min(pto * (2 ** self._pto_count), max(self.config.max_probe_interval, pto))
        return self._last_data_send + interval

    def _cadence_deadline(self) -> float | None:
        if (not self.config.cadence_probes or not self._unacked or self._last_data_send is None
                or self._new_data_at is None or self._push_gap is None
                or not 0 < self.config.redundancy_threshold <= self.loss.rate):
            return None
        deadline = self._last_data_send + 1.5 * self._push_gap
        if deadline > self._new_data_at + self.rtt.probe_timeout(self.config.max_ack_delay):
            return None
        return deadline

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` next has work; None when nothing is scheduled."""
        candidates = [d for d in (self._probe_deadline(), self._cadence_deadline(),
                                  None if self.done else self._keepalive.deadline())
                      if d is not None]
        return min(candidates) if candidates else None

    def handle_timer(self, now: float) -> None:
        probe = self._probe_deadline()
        if probe is not None and now >= probe:
            self._probe_due = True
        cadence = self._cadence_deadline()
        if cadence is not None and now >= cadence and not self._probe_due:
            self._probe_due = self._cadence_due = True
        if not self.done and self._keepalive.due(now):
            self._keepalive_due = True

    def probe(self) -> None:
        """Resend the unacked run on the next ``datagrams_to_send`` (a transport protecting the stream's tail:
        the last packet has no successor to repair it)."""
        if self._unacked:
            self._probe_due = True

    # ---- output ------------------------------------------------------------------------------------------
    def datagrams_to_send(self, now: float) -> list[bytes]:
        """Datagrams due now: the current run (on new events or a probe) or a keep-alive during silence."""
        self.handle_timer(now)
        if (self._dirty or self._probe_due) and self._unacked:
            probe = self._probe_due and not self._dirty
            if self._dirty:
                self._new_data_at = now
            datagrams = self._build_run(now, only_new=not (self._probe_due or self.config.carry_unacked))
            self._last_flush_tail = (self._last_flush_last_packet,)
            extra = self.copies_now() - 1
            if extra:
                datagrams = datagrams + [self._recopy(p, now) for _ in range(extra) for p in self._run_packets]
                last = self._last_flush_last_packet
                self._last_flush_tail = (last, *range(self._packet_number - 1, last, -(len(datagrams) // (extra + 1))))
            if self.config.copies > 1:
                # _emit counted each datagram once; the identical copies add the rest.
                self.stats.bytes_sent += (self.config.copies - 1) * sum(map(len, datagrams))
                datagrams = [d for d in datagrams for _ in range(self.config.copies)]
            if probe:
                self._pto_count += 0 if self._cadence_due else 1
                self.stats.probe_packets += len(datagrams)
            self._dirty = self._probe_due = self._keepalive_due = self._cadence_due = False
            return datagrams
        self._dirty = self._probe_due = self._cadence_due = False
        if self._keepalive_due and not self.done:
            self._keepalive_due = False
            return [self._emit(encode_packet(KeepAlivePacket(self.stream_id, self._take_packet_number(now))),
                               now)]
        return []

    def _recopy(self, packet: DataPacket, now: float) -> bytes:
        """The same data packet under a fresh number, so the loss estimate sees each copy's fate."""
        self.stats.redundant_packets += 1
        return self._encode_data(replace(packet, packet_number=self._take_packet_number(now)), now)

    def _take_packet_number(self, now: float) -> int:
        number = self._packet_number
        self._packet_number += 1
        self._sent_times[number] = now
        if len(self._sent_times) > _SENT_HISTORY:
            del self._sent_times[next(iter(self._sent_times))]
        return number

    def _emit(self, datagram: bytes, now: float) -> bytes:
        self.stats.bytes_sent += len(datagram)
        self._keepalive.activity(now)
        return datagram

    def _entry(self, event: StreamEvent, reference: bytes | None, cached: bool) -> Entry:
        raw = Entry(event.index, event.kind, event.payload)
        if reference is None or not self.config.delta:
            return raw
        delta = self._deltas.get(event.index) if cached else None
        if delta is None:
            delta = make_delta(reference, event.payload)
        prefix, suffix, middle = delta
        entry = Entry(event.index, event.kind, middle, True, prefix, suffix)
        return entry if entry.encoded_size() < raw.encoded_size() else raw

    def _build_run(self, now: float, *, only_new: bool = False) -> list[bytes]:
        """Pack the unacked run oldest-first into at most ``max_run_datagrams`` self-contained datagrams."""
        limits = self.config.limits
        budget = limits.max_datagram_size
        ref_index = self._base - 1 if self._reference is not None else None
        datagrams: list[bytes] = []
        self._run_packets = []  # what _data_packet encodes into ``datagrams``, in the same order (for copies)
        entries: list[Entry] = []
        size = 0
        previous = b""
        for event in self._unacked:
            if only_new and event.index <= self._sent_upto:
                continue
            if len(datagrams) >= limits.max_run_datagrams:
                break
            if entries:
                entry = self._entry(event, previous, cached=True)
                if size + entry.encoded_size() > budget or len(entries) >= limits.max_entries_per_packet:
                    datagrams.append(self._data_packet(ref_index, entries, now))
                    entries = []
                    if len(datagrams) >= limits.max_run_datagrams:
                        break
            if not entries:
                # First entry of a datagram: its delta base is the last acked event, which the receiver holds.
                size = data_header_size(self.stream_id, self._packet_number + 8, ref_index, event.index,
                                        limits.max_entries_per_packet)
                entry = self._entry(event, self._reference, cached=event.index == self._base)
                if size + entry.encoded_size() > budget:  # too big for any datagram: fragment it
                    datagrams.extend(self._fragments(event, now))
                    self._note_sent(event.index)
                    if not self.config.carry_unacked:
                        self._carried_in[event.index] = self._packet_number - 1
                    continue
            entries.append(entry)
            size += entry.encoded_size()
            previous = event.payload
            self._note_sent(event.index)
            if not self.config.carry_unacked:
                self._carried_in[event.index] = self._packet_number  # the number the pending packet will take
        if entries:
            datagrams.append(self._data_packet(ref_index, entries, now))
        self._last_data_send = now
        self._last_flush_last_packet = self._packet_number - 1
        return datagrams

    def _note_sent(self, index: int) -> None:
        if index <= self._sent_upto:
            self.stats.events_resent += 1
        else:
            self._sent_upto = index

    def _data_packet(self, ref_index: int | None, entries: list[Entry], now: float) -> bytes:
        number = self._take_packet_number(now)
        packet = DataPacket(self.stream_id, number, ref_index, entries[0].index, tuple(entries))
        self._run_packets.append(packet)
        return self._encode_data(packet, now)

    def _encode_data(self, packet: DataPacket, now: float) -> bytes:
        self.stats.data_packets += 1
        self._data_numbers.append(packet.packet_number)
        if len(self._data_numbers) > _SENT_HISTORY:
            self._data_numbers.popleft()
        return self._emit(encode_packet(packet), now)

    def _fragments(self, event: StreamEvent, now: float) -> list[bytes]:
        """An event larger than one datagram goes as raw fragments, each alone in its packet."""
        total = len(event.payload)
        # Worst-case header: 8-byte varints for packet number, index, total and offset keep chunks stable.
        overhead = 2 + 8 + 8 + 1 + 8 + 1 + 1 + 8 + 8 + 8
        chunk = max(1, self.config.limits.max_datagram_size - overhead)
        out: list[bytes] = []
        for offset in range(0, total, chunk):
            entry = Entry(event.index, event.kind, event.payload[offset : offset + chunk], frag_total=total,
                          frag_offset=offset)
            out.append(self._data_packet(None, [entry], now))
        return out

    # ---- state -------------------------------------------------------------------------------------------
    @property
    def next_index(self) -> int:
        return self._next_index

    @property
    def acked(self) -> int:
        """Events the receiver has confirmed (cumulative)."""
        return self._base

    @property
    def loss_rate(self) -> float:
        """Smoothed round-trip packet loss rate seen in acks (drives ``redundancy="adaptive"``)."""
        return self.loss.rate

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def ended(self) -> bool:
        """The final event was pushed."""
        return self._final

    @property
    def done(self) -> bool:
        """The final event was pushed and acknowledged: nothing more will ever be sent."""
        return self._final and not self._unacked
