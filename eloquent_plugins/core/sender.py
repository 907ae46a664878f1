"""Eloquent sender state machine (sans-I/O).

Feed it engine events (``push``/``end``/``fail``), peer datagrams (``receive_datagram``) and the clock
(``handle_timer``); pull datagrams with ``datagrams_to_send`` and sleep until ``next_deadline``. Every data
packet carries the run from the oldest unacknowledged event to the newest, so any packet that arrives can be
rendered on its own. Packets are built when the transport pulls them, never queued inside: a later packet
supersedes an earlier one by construction.

As in aioquic, the machine is split three ways: this module keeps the event log and the state (``SenderState``
and the ``Pending`` work), ``recovery`` times probes and detects loss, ``packetizer`` builds the datagrams;
all three read ``sender_config`` (``SenderConfig``, ``SenderStats``), a leaf, so none imports another in a circle.

With ``SenderConfig.send_tick`` every datagram leaves at a multiple of the tick (``core.pacing``): work that falls
due between two multiples is held, ``next_deadline`` names the multiple, and the call there sends it all at once.
"""

from __future__ import annotations

from collections import deque
from enum import Enum, IntFlag, auto

from eloquent_plugins.core.delta import make_delta
from eloquent_plugins.core.errors import LimitExceeded, ProtocolViolation, StreamClosed
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.keepalive import KeepAliveTimer
from eloquent_plugins.core.pacing import next_tick
from eloquent_plugins.core.packetizer import Packetizer
from eloquent_plugins.core.recovery import Recovery
from eloquent_plugins.core.sender_config import SenderConfig, SenderStats
from eloquent_plugins.core.wire import AckPacket, decode_packet


class SenderState(Enum):
    """The stream's lifecycle: one at a time, in this order only."""

    OPEN = auto()
    """Events may be pushed."""
    ENDED = auto()
    """The final event (END or ERROR) was pushed and is not yet acknowledged; pushes raise ``StreamClosed``."""
    DONE = auto()
    """The final event was acknowledged: nothing more will ever be sent."""


class Pending(IntFlag):
    """Work the next ``datagrams_to_send`` owes. Flags, not part of ``SenderState``: these are independent and
    several are often due at once (new events while a probe timer fires, a keep-alive falling due meanwhile),
    and each is cleared on its own (an ack that moves the window clears only ``PROBE``)."""

    NONE = 0
    RUN = auto()
    """New events to send, or an ack moved the window past a flush cut at ``max_run_datagrams``."""
    PROBE = auto()
    """Resend the unacked run: probe timer, fast recovery, a transport's ``probe()``, or a cadence probe."""
    CADENCE = auto()
    """The due probe is a cadence probe: it leaves the PTO backoff alone."""
    KEEPALIVE = auto()
    """The keep-alive idle timer expired."""


# The sender keeps its ``Pending`` set as a plain int and tests it with these: Flag arithmetic runs enum.py's
# Python code on every token, before the token's packet can leave (render latency; docs/results/e2e-vs-sim.md).
_RUN, _PROBE, _CADENCE, _KEEPALIVE = int(Pending.RUN), int(Pending.PROBE), int(Pending.CADENCE), int(Pending.KEEPALIVE)
_SEND = _RUN | _PROBE
"""What makes ``datagrams_to_send`` flush the run."""


class EloquentSender:
    """One stream's sending half. Not thread-safe; one transport drives it."""

    def __init__(self, stream_id: int = 0, config: SenderConfig | None = None, *, now: float = 0.0) -> None:
        self.stream_id = stream_id
        self.config = config or SenderConfig()
        self.stats = SenderStats()
        self._recovery = Recovery(self.config)
        self.rtt = self._recovery.rtt
        self.loss = self._recovery.loss
        self._keepalive = KeepAliveTimer(self.config.keepalive, now)
        self._packetizer = Packetizer(stream_id, self.config, self.stats, self._recovery, self._keepalive)
        self._unacked: deque[StreamEvent] = deque()
        self._deltas: dict[int, tuple[int, int, bytes]] = {}
        self._base = 0
        self._next_index = 0
        self._reference: bytes | None = None
        self.state = SenderState.OPEN
        self._pending = 0
        """``Pending`` bits, as an int."""
        self._tick = self.config.send_tick
        self._release_at: float | None = None
        """With a tick: the multiple of it at which the pending work goes out (None: nothing held yet)."""
        self._named: float | None = None
        """With a tick: the multiple ``next_deadline`` last named, until a call at or after it: that call is the
        transport's timer for it (perhaps a little late), so what is due goes then, not a whole tick later."""

    # ---- engine side -------------------------------------------------------------------------------------
    def push(self, payload: bytes, now: float, kind: EventKind = EventKind.DATA) -> StreamEvent:
        """Append an event to the log; it goes out on the next ``datagrams_to_send``."""
        if self.state is not SenderState.OPEN:
            raise StreamClosed(f"stream {self.stream_id} already ended; cannot push event {self._next_index}")
        limit = self.config.limits.max_event_bytes
        if len(payload) > limit:
            raise LimitExceeded(f"event of {len(payload)} bytes exceeds max_event_bytes={limit}")
        event = StreamEvent(self._next_index, bytes(payload), kind)
        self._recovery.on_push(now)
        if self.config.delta:
            previous = self._unacked[-1].payload if self._unacked else self._reference
            if previous is not None:
                self._deltas[event.index] = make_delta(previous, event.payload)
        self._unacked.append(event)
        self._next_index += 1
        self._pending |= _RUN
        if kind is not EventKind.DATA:
            self.state = SenderState.ENDED
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
        recovery, sent_upto = self._recovery, self._packetizer.sent_upto
        if ack.stream_id != self.stream_id:
            raise ProtocolViolation(f"ack for stream {ack.stream_id} delivered to stream {self.stream_id}")
        if ack.next_expected > sent_upto + 1:
            raise ProtocolViolation(
                f"ack claims events up to {ack.next_expected - 1} but only {sent_upto + 1} were sent")
        if ack.largest_packet_number >= self._packetizer.next_number:
            raise ProtocolViolation(f"ack for packet {ack.largest_packet_number}, never sent")
        self.stats.acks_received += 1
        if ack.largest_packet_number > recovery.largest_acked:
            recovery.on_largest_acked(ack.largest_packet_number, ack.ack_delay, now)
        if ack.next_expected > self._base:
            while self._unacked and self._unacked[0].index < ack.next_expected:
                event = self._unacked.popleft()
                self._deltas.pop(event.index, None)
                self._packetizer.forget(event.index)
                recovery.on_event_acked(event.index)
                self._reference = event.payload
            self._base = ack.next_expected
            if self.state is SenderState.ENDED and not self._unacked:
                self.state = SenderState.DONE
            recovery.on_progress()
            self._pending &= ~_PROBE
            if sent_upto + 1 < self._next_index:
                self._pending |= _RUN  # a flush was cut at max_run_datagrams: the window moved, send more
        elif (self._unacked and recovery.split_run_lost(ack.largest_packet_number)
              and not self._pending & _RUN):
            # The receiver has our newest flush but still misses its start: part of a split run was lost.
            self._pending |= _PROBE
        if (not self.config.carry_unacked or self.config.recarry_limit is not None) and self._unacked:
            # Packets carry only new events here, so a lost one is never repaired by the next: once the packet
            # carrying the oldest unacked event is deemed lost, the run is resent from it (a retransmission).
            if recovery.carrier_lost(self._unacked[0].index, ack.largest_packet_number):
                self._pending |= _PROBE
        if not self._pending:
            self._release_at = None  # the held probe was answered: new work waits for its own multiple

    def _recarry_capped(self) -> bool:
        """``SenderConfig.recarry_limit``: the sent part of the unacked run is past it."""
        limit = self.config.recarry_limit
        return limit is not None and self._packetizer.unacked_bytes() > limit

    def copies_now(self) -> int:
        """How many copies of each run datagram the next flush sends (``SenderConfig.redundancy``)."""
        return self._recovery.copies()

    # ---- clock -------------------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When ``handle_timer`` next has work; None when nothing is scheduled. With a tick: a multiple of it
        (the held work's, or the one at or after the next timer)."""
        if self._tick:
            self._named = self._paced_deadline()
            return self._named
        return self._timer_deadline()

    def _timer_deadline(self) -> float | None:
        unacked = bool(self._unacked)
        recovery = self._recovery
        best = recovery.probe_deadline(unacked)
        for deadline in (recovery.cadence_deadline(unacked), None if self.done else self._keepalive.deadline()):
            if deadline is not None and (best is None or deadline < best):
                best = deadline
        return best

    def _paced_deadline(self) -> float | None:
        """``next_deadline`` with a tick: the held work's multiple, or the one at or after the next timer."""
        if self._release_at is not None and self._pending:
            return self._release_at
        best = self._timer_deadline()
        return None if best is None else next_tick(best, self._tick)

    def handle_timer(self, now: float) -> None:
        unacked = bool(self._unacked)
        probe = self._recovery.probe_deadline(unacked)
        if probe is not None and now >= probe:
            self._pending |= _PROBE
        cadence = self._recovery.cadence_deadline(unacked)
        if cadence is not None and now >= cadence and not self._pending & _PROBE:
            self._pending |= _PROBE | _CADENCE
        if not self.done and self._keepalive.due(now):
            self._pending |= _KEEPALIVE

    def probe(self) -> None:
        """Resend the unacked run on the next ``datagrams_to_send`` (a transport protecting the stream's tail:
        the last packet has no successor to repair it)."""
        if self._unacked:
            self._pending |= _PROBE

    # ---- output ------------------------------------------------------------------------------------------
    def datagrams_to_send(self, now: float) -> list[bytes]:
        """Datagrams due now: the current run (on new events or a probe) or a keep-alive during silence."""
        self.handle_timer(now)
        pending = self._pending
        if not pending:  # most calls: the transport pumps after every ack
            return []
        if self._tick and not self._paced(now):
            return []
        if pending & _SEND and self._unacked:
            packetizer, recovery = self._packetizer, self._recovery
            if pending & _RUN:
                recovery.new_data_at = now
            carry = self.config.carry_unacked and not self._recarry_capped()
            datagrams = packetizer.build_run(self._unacked, self._base, self._reference, self._deltas, now,
                                             only_new=not (pending & _PROBE or carry))
            last = packetizer.next_number - 1
            copies = recovery.copies()
            if copies > 1:
                datagrams = datagrams + packetizer.recopies(copies - 1, now)
            recovery.on_flush(now, last, packetizer.next_number - 1, len(datagrams), copies)
            datagrams = packetizer.duplicate(datagrams)
            if not pending & _RUN:  # a probe: it resends the run, nothing new
                recovery.on_probe_sent(cadence=bool(pending & _CADENCE))
                self.stats.probe_packets += len(datagrams)
            self._pending = 0
            return datagrams
        self._pending &= _KEEPALIVE
        if self._pending and not self.done:
            self._pending = 0
            return [self._packetizer.keepalive(now)]
        return []

    def _paced(self, now: float) -> bool:
        """With a tick: whether the pending work may go now. New events, an ack's repair or a transport's
        ``probe()`` wait for the next multiple of the tick; a call at or after the multiple ``next_deadline``
        named is that multiple's (its timer, perhaps late), and a timer's work (probe, keep-alive) is due only
        there: a probe deadline passed while nothing was unacked is new work, not a late timer."""
        release = self._release_at
        if release is None:
            release = next_tick(now, self._tick)
        named = self._named
        if named is not None and named <= now:
            self._named = None
            release = min(release, named)
        if now < release:
            self._release_at = release
            return False
        self._release_at = None
        return True

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
        return self.state is not SenderState.OPEN

    @property
    def done(self) -> bool:
        """The final event was pushed and acknowledged: nothing more will ever be sent."""
        return self.state is SenderState.DONE

    @property
    def _pto_count(self) -> int:
        """The probe backoff exponent (tests read it under this, its pre-split name)."""
        return self._recovery.pto_count
