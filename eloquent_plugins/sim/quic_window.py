"""The QUIC connection under the simulator's Eloquent stream: its datagrams leave only inside a congestion window.

End to end, the HTTP/3 front end hands Eloquent's datagrams to aioquic only while the congestion controller has
room (``transports/http3/scheduler.py``, ``datagram_queue.py``, ``pump.py``), and aioquic sends them only inside
its window; a full window holds the token's packet in the server while the link stalls with packets in flight
(docs/results/real-links.md). This module gives the simulated path the same: aioquic's own loss recovery and
congestion controller (``QuicPacketRecovery``, sans-I/O: CUBIC or NewReno, RFC 9002 loss detection and probe
timeout, the initial and minimum windows of ``max_datagram_size`` 1350 as the front end configures), fed the
packets the simulated path carries and the QUIC ACKs the simulated client returns. Not a model of them: the
window, its growth, its cuts, the PTO's backoff and the pacer (which after an RTT spike spaces what the front end
handed over) are aioquic's code. What is modelled is the packet framing
(every server packet numbered, one DATAGRAM per packet as the front end transmits between a stream's
datagrams) and the client's ACK timing (aioquic acknowledges each ack-eliciting packet ``ACK_DELAY`` after it
arrives, in the next packet that leaves then: an ACK-only one, or the client's Eloquent ack when one is sent at
or after that instant). The server acknowledges each client packet that elicits one in its next transmit (the
front end's ``acknowledge_now``): in a data packet leaving then, else in an ACK-only packet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import MAX_ACK_RANGES, QuicPacketRecovery, QuicPacketSpace
from aioquic.tls import Epoch

from eloquent_plugins.core.errors import ConfigError, EloquentError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import PACKET_OVERHEAD, QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.core.wire import DataPacket, decode_packet
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER

WINDOWS = ("none", "reno", "cubic")
"""``none``: no congestion window (the sender's datagrams leave at once); otherwise aioquic's controller."""
IP_UDP = 28
"""IPv4 (20) + UDP (8): outside the QUIC packet, which is what aioquic counts in flight."""
DATAGRAM_FRAME = 2
"""A DATAGRAM frame's type and length."""
SHORT_HEADER = QUIC_DATAGRAM_HEADER - IP_UDP - DATAGRAM_FRAME
"""A 1-RTT packet's header and AEAD tag, as ``link.QUIC_DATAGRAM_HEADER`` counts them (the same bytes with and
without the window)."""
ACK_FRAME = 7
"""An ACK frame of one range: type, largest (2), delay (2), range count, first range."""
PING_FRAME = 2
"""PING (1) and the one byte of padding header protection needs in so short a packet."""
ACK_DELAY = 0.001
"""aioquic's delay before it acknowledges an ack-eliciting packet (``QuicConnection._ack_delay``, K_GRANULARITY)."""
TIMER_SLACK = 1e-6
"""How late aioquic's loss-detection timer fires on the virtual clock (``_arm``)."""
PROBE_BUDGET = min(Limits().max_datagram_size, QUIC_MAX_DATAGRAM_SIZE - PACKET_OVERHEAD)
"""The room the front end grants a due Eloquent probe when the window is full (the scheduler's ``probe_size``)."""


@dataclass(frozen=True, slots=True)
class ServerPacket:
    """One QUIC packet server -> client: its number, and the Eloquent datagram it carries (None: ACK or PING)."""

    number: int
    datagram: bytes | None
    ack_eliciting: bool


@dataclass(frozen=True, slots=True)
class ClientPacket:
    """One QUIC packet client -> server: an Eloquent ack datagram and/or a QUIC ACK frame."""

    datagram: bytes | None
    ack: RangeSet | None = None
    ack_delay: float = 0.0


def datagram_packet_size(datagram: bytes) -> int:
    """Bytes of the QUIC packet carrying one DATAGRAM frame (what aioquic counts in flight), IP/UDP excluded."""
    return SHORT_HEADER + DATAGRAM_FRAME + len(datagram)


class QuicSender:
    """aioquic's loss recovery, congestion controller and pacer for one simulated QUIC sender, with their timers on
    the virtual clock: what Eloquent's window (``ServerWindow``) and the QUIC download (``quic_bulk``) share.
    ``wake()`` runs when aioquic's loss-detection timer or its pacer's timer fires (the connection's transmit)."""

    def __init__(self, loop: EventLoop, algorithm: str, initial_rtt: float, wake: Callable[[], None]) -> None:
        self.loop = loop
        self._wake = wake
        self.recovery = QuicPacketRecovery(congestion_control_algorithm=algorithm, initial_rtt=initial_rtt,
                                           max_datagram_size=QUIC_MAX_DATAGRAM_SIZE,
                                           peer_completed_address_validation=True, send_probe=self._probe)
        self.recovery.handshake_confirmed = True
        self.space = QuicPacketSpace(is_application_data=True)
        self.recovery.spaces = [self.space]
        self._probe_pending = False
        self._next_number = 0
        self._timer_at: float | None = None
        self._pacing_at: float | None = None
        self.ptos = 0
        """aioquic's own probe timeouts."""

    def _sent(self, size: int, in_flight: bool) -> int:
        """A packet of ``size`` bytes (IP/UDP excluded) leaves now: counted by the recovery and the pacer; its
        number."""
        number = self._next_number
        self._next_number += 1
        self._probe_pending = False
        packet = QuicSentPacket(epoch=Epoch.ONE_RTT, in_flight=in_flight, is_ack_eliciting=in_flight,
                                is_crypto_packet=False, packet_number=number, packet_type=QuicPacketType.ONE_RTT,
                                sent_time=self.loop.now, sent_bytes=size)
        self.recovery.on_packet_sent(packet=packet, space=self.space)
        self.recovery._pacer.update_after_send(now=self.loop.now)
        return number

    def _take_ack(self, packet: ClientPacket) -> None:
        if packet.ack is not None:
            self.recovery.on_ack_received(ack_rangeset=packet.ack, ack_delay=packet.ack_delay, now=self.loop.now,
                                          space=self.space)

    def _paced(self, now: float) -> bool:
        """aioquic's pacer holds the next packet; its timer then wakes the sender."""
        at = self.recovery._pacer.next_send_time(now=now)
        if at is None:
            return False
        if self._pacing_at is None or self._pacing_at <= now or at < self._pacing_at:
            self._pacing_at = at
            self.loop.at(at, self._on_pacing, at)
        return True

    def _on_pacing(self, when: float) -> None:
        if when != self._pacing_at:
            return
        self._pacing_at = None
        self._wake()

    def _probe(self) -> None:
        self._probe_pending = True

    def _arm(self) -> None:
        when = self.recovery.get_loss_detection_time(amplification_limited=False)
        if when is not None and when != self._timer_at:
            self._timer_at = when
            # A microsecond late, as a real clock reads: at the loss time itself float rounding can leave the
            # packet a hair short of aioquic's time threshold, and the timer would fire again at the same instant.
            self.loop.at(when + TIMER_SLACK, self._on_timer, when)
        elif when is None:
            self._timer_at = None

    def _on_timer(self, when: float) -> None:
        if when != self._timer_at:
            return  # re-armed since
        self._timer_at = None
        if self.space.loss_time is None:
            self.ptos += 1
        self.recovery.on_loss_detection_timeout(now=self.loop.now)
        self._wake()


class ServerWindow(QuicSender):
    """The server's side: the front end's admission (what it pulls from the sender, the one parked run) over
    aioquic's recovery (what leaves, what is in flight, what is lost). ``send(packet, size)`` puts a packet of
    ``size`` bytes (IP/UDP included) on the forward path; ``pump()`` is the front end's plan, run after every
    input and timer as ``Http3Connection.after_input`` / ``after_timer`` do."""

    def __init__(self, loop: EventLoop, algorithm: str, initial_rtt: float,
                 send: Callable[[ServerPacket, int], None]) -> None:
        if algorithm not in WINDOWS[1:]:
            raise ConfigError(f"unknown congestion control {algorithm!r} (known: {', '.join(WINDOWS[1:])})")
        super().__init__(loop, algorithm, initial_rtt, self._wake_up)
        self._send = send
        self.pending: list[bytes] = []
        """aioquic's DATAGRAM queue: handed over by the front end, not yet sent (no room in the window)."""
        self.parked: list[bytes] = []
        """The front end's ``DatagramQueue`` run of this stream: pulled from the sender, not yet handed over."""
        self.handed: list[tuple[float, bytes]] = []
        """When each datagram went to QUIC (the front end's ``record_timings`` log; ``held`` is measured on it)."""
        self.pump: Callable[[], None] = lambda: None
        self._ack_pending = False
        self.probes = 0
        """Eloquent probes the front end sent over a full window."""

    # ---- the front end's plan ---------------------------------------------------------------------------
    def room(self) -> int:
        """``h3glue.common.datagram_room``: the window left, minus what aioquic's queue already holds."""
        queued = sum(len(d) + 8 for d in self.pending)
        return int(self.recovery.congestion_window - self.recovery.bytes_in_flight - queued)

    def plan(self, now: float, pull: Callable[[float], list[bytes]], probe_due: bool) -> None:
        """``DatagramScheduler.plan`` for one stream, then the transmit: pull the sender's datagrams only when
        there is room (a due probe gets ``PROBE_BUDGET`` over a full window when aioquic's queue is empty), a
        newer run replacing the parked one, and hand over what fits."""
        room = self.room()
        if room <= 0 and not self.pending and probe_due:
            self._probe_pending = True
            self.probes += 1
            room = PROBE_BUDGET
        if room > 0:
            pulled = pull(now)
            if pulled:
                self.parked = pulled
        released: list[bytes] = []
        if room > 0 and self.parked:
            spent = 0
            while self.parked and (not released or spent + len(self.parked[0]) <= room) and spent < room:
                spent += len(self.parked[0])
                released.append(self.parked.pop(0))
        for datagram in released:  # the pump transmits between one stream's datagrams: one packet each
            self.handed.append((now, datagram))
            self.pending.append(datagram)
            self.transmit(now)
        if not released:
            self.transmit(now)

    # ---- aioquic's transmit -----------------------------------------------------------------------------
    def transmit(self, now: float) -> None:
        """``QuicConnection.datagrams_to_send``: queued datagrams while they fit the window (a probe may exceed it
        by one full packet) and the pacer lets them go, the probe's PING if no datagram took it, the pending ACK in
        the first packet."""
        recovery = self.recovery
        flight = recovery.congestion_window - recovery.bytes_in_flight
        if self._probe_pending and flight < QUIC_MAX_DATAGRAM_SIZE:
            flight = QUIC_MAX_DATAGRAM_SIZE
        while self.pending:
            size = datagram_packet_size(self.pending[0]) + self._extras()
            if size > flight or self._paced(now):
                break
            flight -= size
            self._emit(self.pending.pop(0), size, True)
        if (self._probe_pending or self._ack_pending) and not self._paced(now):
            self._emit(None, SHORT_HEADER + self._extras(), self._probe_pending)
        self._arm()

    def _paced(self, now: float) -> bool:
        """Not while an ACK is due (``_write_application``)."""
        return not self._ack_pending and super()._paced(now)

    def _extras(self) -> int:
        return (ACK_FRAME if self._ack_pending else 0) + (PING_FRAME if self._probe_pending else 0)

    def _emit(self, datagram: bytes | None, size: int, in_flight: bool) -> None:
        self._ack_pending = False
        number = self._sent(size, in_flight)
        self._send(ServerPacket(number, datagram, in_flight), IP_UDP + size)

    # ---- input and aioquic's timer ----------------------------------------------------------------------
    def on_packet(self, packet: ClientPacket, deliver: Callable[[bytes], None]) -> None:
        """A client packet arrives: its ACK to the recovery, its Eloquent ack to the sender (``deliver``), then
        the front end's ``acknowledge_now`` and plan."""
        self._take_ack(packet)
        if packet.datagram is not None:
            self._ack_pending = True
            deliver(packet.datagram)
        self.pump()
        self._arm()

    def _wake_up(self) -> None:
        """A timer of aioquic's fired: its transmit, then the front end's ``after_timer`` (H3Protocol)."""
        self.transmit(self.loop.now)
        self.pump()
        self._arm()


class ClientAcks:
    """The client's QUIC acknowledgements: every server packet recorded, an ACK ``ACK_DELAY`` after the first
    unacknowledged ack-eliciting one, in the next client packet that leaves then (``take``) or an ACK-only one.
    ``send(packet, size)`` puts a packet on the reverse path."""

    def __init__(self, loop: EventLoop, send: Callable[[ClientPacket, int], None]) -> None:
        self.loop = loop
        self._send = send
        self.received = RangeSet()
        self._largest_time = 0.0
        self._ack_at: float | None = None

    def on_packet(self, packet: ServerPacket) -> None:
        now = self.loop.now
        if not len(self.received) or packet.number >= self.received.bounds().stop:
            self._largest_time = now
        self.received.add(packet.number)
        if len(self.received) > MAX_ACK_RANGES:
            self.received.shift()
        if packet.ack_eliciting and self._ack_at is None:
            self._ack_at = now + ACK_DELAY
            self.loop.at(self._ack_at, self._on_timer, self._ack_at)

    def take(self) -> tuple[RangeSet | None, float]:
        """The ACK frame a client packet leaving now carries (None before ``ACK_DELAY`` has passed)."""
        now = self.loop.now
        if self._ack_at is None or self._ack_at > now:
            return None, 0.0
        self._ack_at = None
        return RangeSet(self.received), now - self._largest_time

    def send_datagram(self, datagram: bytes) -> None:
        """The client's Eloquent ack datagram, with the ACK frame if one is due."""
        ack, delay = self.take()
        size = datagram_packet_size(datagram) + (ACK_FRAME if ack is not None else 0)
        self._send(ClientPacket(datagram, ack, delay), IP_UDP + size)

    def _on_timer(self, when: float) -> None:
        if self._ack_at != when:
            return  # already carried by an Eloquent ack
        ack, delay = self.take()
        self._send(ClientPacket(None, ack, delay), IP_UDP + SHORT_HEADER + ACK_FRAME)


def held_times(generated: Sequence[float], handed: Sequence[tuple[float, bytes]]) -> tuple[float, ...]:
    """Per token, when its first datagram went to QUIC minus its generation: ``bench e2e --trace``'s ``held``
    (``cli/bench/link_terms.held_times`` on the front end's log), here on ``ServerWindow.handed``."""
    first: dict[int, float] = {}
    for sent, datagram in handed:
        try:
            packet = decode_packet(datagram)
        except EloquentError:
            continue
        if isinstance(packet, DataPacket):
            for entry in packet.entries:
                first.setdefault(entry.index, sent)
    return tuple(max(0.0, first[i] - g) if i in first else 0.0 for i, g in enumerate(generated))
