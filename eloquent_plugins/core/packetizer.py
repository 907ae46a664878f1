"""Packet building for one Eloquent stream: the unacked run into self-contained datagrams (sans-I/O).

Split from the sender as aioquic splits packet building from recovery: this module numbers packets and encodes
them (deltas, fragments, redundant copies, keep-alives); it tells ``recovery`` what left and never decides when
to send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from eloquent_plugins.core.delta import make_delta
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.core.keepalive import KeepAliveTimer
from eloquent_plugins.core.recovery import Recovery
from eloquent_plugins.core.sender_config import SenderConfig, SenderStats
from eloquent_plugins.core.wire import (
    DataPacket,
    Entry,
    KeepAlivePacket,
    data_header_size,
    encode_data_from,
    encode_entry,
    encode_packet,
    pad_packet,
)


_FRAGMENT_OVERHEAD = 2 + 8 + 8 + 1 + 8 + 1 + 1 + 8 + 8 + 8
"""Worst-case fragment header: 8-byte varints for packet number, index, total and offset keep chunks stable."""


class Packetizer:
    """Numbers and encodes one stream's packets; counts them in the sender's ``stats``."""

    def __init__(self, stream_id: int, config: SenderConfig, stats: SenderStats, recovery: Recovery,
                 keepalive: KeepAliveTimer) -> None:
        self.stream_id = stream_id
        self.config = config
        self.stats = stats
        self._recovery = recovery
        self._keepalive = keepalive
        pad = config.padding
        self._pad = pad if pad is not None and pad.enabled else None
        """The datagram padding policy (``core.padding``); None when off: ``_emit`` then adds nothing."""
        self._budget = (self._pad.size if self._pad is not None and self._pad.mode == "constant"
                        else config.limits.max_datagram_size)
        """Bytes a datagram may take: the budget, or the one size of ``constant`` padding (runs split at it)."""
        self.next_number = 0
        """The packet number the next packet takes (every number below it was sent)."""
        self.sent_upto = -1
        """The newest event index ever sent."""
        self._run_packets: list[DataPacket] = []
        """The data packets of the last run built, in datagram order: redundant copies re-number these."""
        self._encoded: dict[int, tuple[Entry, int, bytes]] = {}
        """Per unacked event, its entry against its predecessor (a delta when smaller), that entry's size and bytes:
        the run goes out again in every packet until acked, and each of its entries is built and encoded once
        (``forget`` drops an acked event's)."""

    # ---- runs ------------------------------------------------------------------------------------------------
    def build_run(self, events: Iterable[StreamEvent], base: int, reference: bytes | None,
                  deltas: Mapping[int, tuple[int, int, bytes]], now: float, *, only_new: bool = False) -> list[bytes]:
        """Pack the unacked run ``events`` (from ``base``; ``reference`` is event ``base - 1``, ``deltas`` the
        cached ones against each predecessor) oldest-first into at most ``max_run_datagrams`` self-contained
        datagrams."""
        limits = self.config.limits
        # Which packet carried each event, for ``Recovery.carrier_lost``: when runs do not carry everything.
        track = only_new or not self.config.carry_unacked or self.config.recarry_limit is not None
        budget = self._budget
        ref_index = base - 1 if reference is not None else None
        datagrams: list[bytes] = []
        self._run_packets = []  # what _data_packet encodes into ``datagrams``, in the same order (for copies)
        entries: list[Entry] = []
        encoded: list[bytes] = []
        size = 0
        previous = b""
        for event in events:
            if only_new and event.index <= self.sent_upto:
                continue
            if len(datagrams) >= limits.max_run_datagrams:
                break
            if entries:
                entry, entry_size, data = self._run_entry(event, previous, deltas, cached=True)
                if size + entry_size > budget or len(entries) >= limits.max_entries_per_packet:
                    datagrams.append(self._data_packet(ref_index, entries, encoded, now))
                    entries, encoded = [], []
                    if len(datagrams) >= limits.max_run_datagrams:
                        break
            if not entries:
                # First entry of a datagram: its delta base is the last acked event, which the receiver holds.
                size = data_header_size(self.stream_id, self.next_number + 8, ref_index, event.index,
                                        limits.max_entries_per_packet)
                entry, entry_size, data = self._run_entry(event, reference, deltas, cached=event.index == base)
                if size + entry_size > budget:  # too big for any datagram: fragment it
                    datagrams.extend(self._fragments(event, now))
                    self._note_sent(event.index)
                    if track:
                        self._recovery.on_carried(event.index, self.next_number - 1)
                    continue
            entries.append(entry)
            encoded.append(data)
            size += entry_size
            previous = event.payload
            self._note_sent(event.index)
            if track:
                self._recovery.on_carried(event.index, self.next_number)  # the number the pending packet takes
        if entries:
            datagrams.append(self._data_packet(ref_index, entries, encoded, now))
        return datagrams

    def unacked_bytes(self) -> int:
        """Encoded bytes of the unacked events built so far (``SenderConfig.recarry_limit``)."""
        return sum(size for _, size, _ in self._encoded.values())

    def forget(self, index: int) -> None:
        """Event ``index`` was acknowledged: it is never sent again."""
        self._encoded.pop(index, None)

    def recopies(self, extra: int, now: float) -> list[bytes]:
        """``extra`` more copies of the last run, each datagram under a fresh number so the loss estimate sees
        each copy's fate."""
        out: list[bytes] = []
        for _ in range(extra):
            for packet in self._run_packets:
                self.stats.redundant_packets += 1
                out.append(self._encode_data(replace(packet, packet_number=self.take_number(now)), now))
        return out

    def duplicate(self, datagrams: list[bytes]) -> list[bytes]:
        """``SenderConfig.copies``: each datagram byte for byte (packet number included) that many times."""
        copies = self.config.copies
        if copies == 1:
            return datagrams
        # _emit counted each datagram once; the identical copies add the rest.
        self.stats.bytes_sent += (copies - 1) * sum(map(len, datagrams))
        return [d for d in datagrams for _ in range(copies)]

    def keepalive(self, now: float) -> bytes:
        return self._emit(encode_packet(KeepAlivePacket(self.stream_id, self.take_number(now))), now)

    # ---- pieces ------------------------------------------------------------------------------------------------
    def take_number(self, now: float) -> int:
        number = self.next_number
        self.next_number += 1
        self._recovery.on_packet_sent(number, now)
        return number

    def _emit(self, datagram: bytes, now: float) -> bytes:
        pad = self._pad
        if pad is not None:
            datagram = pad_packet(datagram, pad.target(len(datagram)))
        self.stats.bytes_sent += len(datagram)
        self._keepalive.activity(now)
        return datagram

    def _run_entry(self, event: StreamEvent, reference: bytes | None, deltas: Mapping[int, tuple[int, int, bytes]],
                   cached: bool) -> tuple[Entry, int, bytes]:
        """The entry of ``event`` in a run, its size and its bytes (empty for one too big for any datagram: it
        goes as fragments). ``cached``: against its predecessor (the previous entry of the packet, or the acked
        event before it), whose delta ``deltas`` holds -- the same every time, so it is kept; otherwise against
        ``reference`` (a split run's later datagram starts from the acked event)."""
        if cached:
            hit = self._encoded.get(event.index)
            if hit is not None:
                return hit
        entry = self._entry(event, reference, deltas, cached)
        size = entry.encoded_size()
        built = entry, size, encode_entry(entry) if size <= self._budget else b""
        if cached:
            self._encoded[event.index] = built
        return built

    def _entry(self, event: StreamEvent, reference: bytes | None, deltas: Mapping[int, tuple[int, int, bytes]],
               cached: bool) -> Entry:
        raw = Entry(event.index, event.kind, event.payload)
        if reference is None or not self.config.delta:
            return raw
        delta = deltas.get(event.index) if cached else None
        if delta is None:
            delta = make_delta(reference, event.payload)
        prefix, suffix, middle = delta
        entry = Entry(event.index, event.kind, middle, True, prefix, suffix)
        return entry if entry.encoded_size() < raw.encoded_size() else raw

    def _note_sent(self, index: int) -> None:
        if index <= self.sent_upto:
            self.stats.events_resent += 1
        else:
            self.sent_upto = index

    def _data_packet(self, ref_index: int | None, entries: list[Entry], encoded: list[bytes] | None,
                     now: float) -> bytes:
        """``encoded``: each entry's bytes (``encode_entry``), when the caller has them."""
        packet = DataPacket(self.stream_id, self.take_number(now), ref_index, entries[0].index, tuple(entries))
        self._run_packets.append(packet)
        return self._encode_data(packet, now, encoded)

    def _encode_data(self, packet: DataPacket, now: float, encoded: list[bytes] | None = None) -> bytes:
        self.stats.data_packets += 1
        self._recovery.on_data_sent(packet.packet_number)
        return self._emit(encode_packet(packet) if encoded is None else encode_data_from(packet, encoded), now)

    def _fragments(self, event: StreamEvent, now: float) -> list[bytes]:
        """An event larger than one datagram goes as raw fragments, each alone in its packet."""
        total = len(event.payload)
        chunk = max(1, self._budget - _FRAGMENT_OVERHEAD)
        out: list[bytes] = []
        for offset in range(0, total, chunk):
            entry = Entry(event.index, event.kind, event.payload[offset : offset + chunk], frag_total=total,
                          frag_offset=offset)
            out.append(self._data_packet(None, [entry], None, now))
        return out
