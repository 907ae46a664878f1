"""The TCP baselines: a reliable in-order stream of one segment per token event, as SSE chatbots get today.

Modelled on Linux with SACK (what a phone or laptop talks to): RTO per RFC 6298 with Linux's 200 ms floor on the
variance term (RTO = SRTT + max(4 RTTVAR, 200 ms), 1 s before any sample, doubling per timeout, Karn's rule,
counted from the oldest outstanding segment's transmission as Linux re-arms it),
fast retransmit once three segments above a hole are SACKed (RFC 6675's DupThresh, i.e. three duplicate ACKs),
no Nagle, delayed ACKs (every second segment or 40 ms, at once on any gap), a packet-counted congestion window
(initial 10; CUBIC: 0.7 reduction on fast retransmit and cubic regrowth towards the last maximum; 1 after a
timeout, then slow start; growth only while cwnd-limited, as Linux) and
Linux's coalescing of writes still queued behind the window into one segment. No tail loss probe and no RACK by
default: the issue fixes the baseline as RTO + three-duplicate-ACK fast retransmit; ``rack_tlp`` turns on
Linux's RACK-TLP for the sensitivity variant (docs/results/sim.md discusses both).

``copies`` > 1 is the duplication baseline: every data segment (new or retransmitted) goes out ``copies`` times
back to back, the receiver drops the extra copies of a first transmission silently (it still answers a
retransmission it already holds, since the ACK may have been lost), and the TCP machinery above is the fallback.
The receiving half is ``sim.tcp_receiver.TcpReceiver``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum, auto

from eloquent_plugins.sim.clock import EventLoop


@dataclass(frozen=True, slots=True)
class TcpConfig:
    copies: int = 1
    rto_min: float = 0.2
    rto_initial: float = 1.0
    rto_max: float = 120.0
    dupthresh: int = 3
    initial_cwnd: int = 10
    mss: int = 1448
    delayed_ack: float = 0.040
    cubic_beta: float = 0.7
    cubic_c: float = 0.4
    rack_tlp: bool = False
    """Linux's default loss recovery since 4.18 (RFC 8985): RACK marks a segment lost once one sent after it is
    delivered and a quarter of min RTT has passed (lost retransmissions too), and a tail loss probe resends the
    newest segment after 2 SRTT without ACKs. Off for the issue's baseline; on for the sensitivity variant."""


@dataclass(frozen=True, slots=True)
class Segment:
    index: int
    tokens: tuple[int, ...]
    size: int
    retransmission: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    cumulative: int
    """Next segment index expected."""
    sacked: frozenset[int]

    @property
    def option_bytes(self) -> int:
        """SACK option (2 + 8 per block, at most 3 blocks with timestamps off: 4) padded by two NOPs."""
        if not self.sacked:
            return 0
        blocks = sum(1 for i in self.sacked if i - 1 not in self.sacked)
        return 4 + 8 * min(blocks, 4)


class SegmentState(Enum):
    """Where an outstanding segment stands, one at a time (was two booleans, ``sacked`` and ``lost``)."""

    IN_FLIGHT = auto()
    """Sent (or resent) and neither SACKed nor deemed lost: it counts in the pipe."""
    LOST = auto()
    """Deemed lost (RTO, DupThresh or RACK): the next to retransmit."""
    SACKED = auto()
    """The receiver holds it above a hole; it leaves when the cumulative ACK passes it."""


@dataclass(slots=True)
class _Outstanding:
    segment: Segment
    first_sent: float
    last_sent: float = 0.0
    retransmitted: bool = False
    """Sent more than once (Karn's rule): history, independent of ``state``."""
    state: SegmentState = SegmentState.IN_FLIGHT
    recovery_epoch: int = -1


@dataclass(slots=True)
class TcpStats:
    segments: int = 0
    retransmissions: int = 0
    timeouts: int = 0
    fast_retransmits: int = 0
    loss_probes: int = 0
    rto_history: list[float] = field(default_factory=list)


class TcpSender:
    def __init__(self, loop: EventLoop, config: TcpConfig, initial_rtt: float | None,
                 transmit: Callable[[Segment], None]) -> None:
        self.loop = loop
        self.config = config
        self._transmit = transmit
        self.stats = TcpStats()
        self.srtt: float | None = initial_rtt  # the handshake's SYN/SYN-ACK gives the first sample
        self.rttvar = initial_rtt / 2 if initial_rtt is not None else 0.0
        self.backoff = 0
        self.cwnd = float(config.initial_cwnd)
        self.ssthresh = float("inf")
        self._out: dict[int, _Outstanding] = {}
        self._una = 0
        self._nxt = 0
        self._unsent: deque[tuple[int, int]] = deque()
        self._recovery_point: int | None = None
        self._epoch = 0
        self._cwnd_limited = False
        self._rto_at: float | None = None
        self._w_max = 0.0
        self._cubic_epoch: float | None = None
        self._min_rtt = initial_rtt if initial_rtt is not None else float("inf")
        self._rack_xmit = -1.0
        self._rack_rtt = 0.0
        self._reo_at: float | None = None
        self._tlp_at: float | None = None
        self._tlp_out = False

    @property
    def rto(self) -> float:
        if self.srtt is None:
            base = self.config.rto_initial
        else:
            base = self.srtt + max(4 * self.rttvar, self.config.rto_min)
        return min(self.config.rto_max, base * (2 ** self.backoff))

    @property
    def idle(self) -> bool:
        return not self._out and not self._unsent

    # ---- application ------------------------------------------------------------------------------------
    def write(self, token: int, size: int) -> None:
        self._unsent.append((token, size))
        self._try_send()

    # ---- sending ----------------------------------------------------------------------------------------
    def _pipe(self) -> int:
        return sum(1 for o in self._out.values() if o.state is SegmentState.IN_FLIGHT)

    def _send(self, entry: _Outstanding) -> None:
        segment = replace(entry.segment, retransmission=True) if entry.retransmitted else entry.segment
        entry.last_sent = self.loop.now
        for _ in range(self.config.copies):
            self._transmit(segment)
        if self._rto_at is None:
            self._arm_rto()
        elif not entry.retransmitted:
            self._arm_tlp()  # Linux re-schedules the loss probe after sending new data

    def _try_send(self) -> None:
        now = self.loop.now
        while True:
            lost = [o for o in self._out.values() if o.state is SegmentState.LOST]
            if not lost and not self._unsent:
                self._cwnd_limited = False
                return
            if self._pipe() >= int(self.cwnd):
                self._cwnd_limited = True
                return
            if lost:
                entry = min(lost, key=lambda o: o.segment.index)
                entry.state = SegmentState.IN_FLIGHT
                entry.retransmitted = True
                entry.recovery_epoch = self._epoch
                self.stats.retransmissions += 1
                self._send(entry)
                continue
            tokens: list[int] = []
            size = 0
            while self._unsent and (not tokens or size + self._unsent[0][1] <= self.config.mss):
                token, nbytes = self._unsent.popleft()
                tokens.append(token)
                size += nbytes
            segment = Segment(self._nxt, tuple(tokens), size)
            self._nxt += 1
            self.stats.segments += 1
            entry = _Outstanding(segment, now)
            self._out[segment.index] = entry
            self._send(entry)

    # ---- timers -----------------------------------------------------------------------------------------
    def _arm_rto(self) -> None:
        if not self._out:
            self._rto_at = None
            return
        # Linux (tcp_rearm_rto): the timeout counts from the oldest outstanding segment's last transmission
        head = self._out[min(self._out)]
        self._rto_at = max(self.loop.now + 1e-6, head.last_sent + self.rto)
        self.loop.at(self._rto_at, self._on_rto, self._rto_at)
        self._arm_tlp()

    def _arm_tlp(self) -> None:
        """Linux tcp_schedule_loss_probe: 2 SRTT (+200 ms with one segment out), never after the RTO."""
        if not self.config.rack_tlp or self._tlp_out or self._recovery_point is not None or not self._out \
                or self.srtt is None or self.backoff:
            self._tlp_at = None
            return
        pto = 2 * self.srtt + (self.config.rto_min if len(self._out) == 1 else 0.002)
        at = self.loop.now + pto
        if self._rto_at is not None:
            at = min(at, self._rto_at)
        self._tlp_at = at
        self.loop.at(at, self._on_tlp, at)

    def _on_tlp(self, when: float) -> None:
        if self._tlp_at != when:
            return
        self._tlp_at = None
        if not self._out:
            return
        if self._recovery_point is not None or self._tlp_out:
            if self._rto_at is not None and self._rto_at <= self.loop.now:
                self._on_rto(self._rto_at)  # the timeout this timer stood in for is due: take it now
            return
        self._tlp_out = True
        self.stats.loss_probes += 1
        if self._unsent and self._pipe() < int(self.cwnd):
            self._try_send()
        else:
            newest = self._out[max(self._out)]
            newest.retransmitted = True
            self.stats.retransmissions += 1
            self._send(newest)
        # the RTO it stood in for, a full RTO from now (Linux re-arms from the head's send time only while a
        # probe or reorder timer is pending, and none is once this one has fired)
        self._rto_at = self.loop.now + self.rto
        self.loop.at(self._rto_at, self._on_rto, self._rto_at)

    def _on_rto(self, when: float) -> None:
        if self._rto_at != when or not self._out:
            return
        if self._tlp_at is not None and self._tlp_at <= when:
            return  # Linux: a pending loss probe takes the retransmission timer's place; it re-arms the RTO
        self.stats.timeouts += 1
        self.stats.rto_history.append(self.rto)
        self.backoff += 1
        self._reduce()
        self.cwnd = 1.0
        self._epoch += 1
        self._recovery_point = None
        for entry in self._out.values():
            if entry.state is not SegmentState.SACKED:
                entry.state = SegmentState.LOST
        self._rto_at = None
        self._try_send()
        if self._rto_at is None:
            self._arm_rto()

    # ---- acks -------------------------------------------------------------------------------------------
    def _rtt_sample(self, sample: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = sample, sample / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample

    def on_ack(self, ack: Ack) -> None:
        now = self.loop.now
        acked_new = ack.cumulative > self._una
        flight = len(self._out)
        sample: float | None = None
        self._tlp_out = False
        if self.config.rack_tlp:
            self._rack_update(ack, now)
        if acked_new:
            count = 0
            oldest: float | None = None
            karn = False
            for index in range(self._una, ack.cumulative):
                entry = self._out.pop(index, None)
                if entry is None:
                    continue
                count += 1
                karn = karn or entry.retransmitted
                if entry.state is not SegmentState.SACKED and oldest is None:  # SACKed ones gave their sample when SACKed
                    oldest = entry.first_sent
            if oldest is not None and not karn:  # Linux: no sample from an ACK that covers retransmitted data
                sample = now - oldest
            self._una = ack.cumulative
            self.backoff = 0
            if self._recovery_point is not None and self._una >= self._recovery_point:
                self._recovery_point = None
                self.cwnd = max(self.ssthresh, 2.0)
            elif self._recovery_point is None and (self._cwnd_limited or
                                                   (self.cwnd < self.ssthresh and self.cwnd < 2 * flight)):
                self._grow(count, now)  # Linux's tcp_is_cwnd_limited: slow start grows up to twice the flight
        for index in sorted(ack.sacked):
            entry = self._out.get(index)
            if entry is not None and entry.state is not SegmentState.SACKED:
                entry.state = SegmentState.SACKED
                if sample is None and not entry.retransmitted:
                    sample = now - entry.first_sent
        if sample is not None:
            self._rtt_sample(sample)
        self._detect_losses()
        if acked_new:
            self._rto_at = None
            self._arm_rto()
        self._try_send()

    def _grow(self, acked: int, now: float) -> None:
        if self.cwnd < self.ssthresh:
            self.cwnd = min(self.cwnd + acked, max(self.ssthresh, self.cwnd))
            return
        cfg = self.config
        if self._cubic_epoch is None:
            self._cubic_epoch = now
        k = max(0.0, self._w_max * (1 - cfg.cubic_beta) / cfg.cubic_c) ** (1 / 3) if self.cwnd < self._w_max else 0.0
        target = cfg.cubic_c * (now - self._cubic_epoch - k) ** 3 + max(self._w_max, self.cwnd)
        # at least Reno's +1 per window (CUBIC's TCP-friendly region)
        self.cwnd += max(acked / self.cwnd, acked * (target - self.cwnd) / self.cwnd if target > self.cwnd else 0.0)

    def _reduce(self) -> None:
        self._w_max = self.cwnd
        self._cubic_epoch = None
        self.ssthresh = max(self.cwnd * self.config.cubic_beta, 2.0)

    def _rack_update(self, ack: Ack, now: float) -> None:
        delivered = [self._out[i] for i in range(self._una, ack.cumulative) if i in self._out]
        delivered += [self._out[i] for i in ack.sacked
                      if i in self._out and self._out[i].state is not SegmentState.SACKED]
        for entry in delivered:
            rtt = now - entry.last_sent
            if entry.retransmitted and rtt < self._min_rtt:
                continue  # RFC 8985: too early to be the retransmission's ACK
            self._min_rtt = min(self._min_rtt, rtt)
            if entry.last_sent > self._rack_xmit:
                self._rack_xmit, self._rack_rtt = entry.last_sent, rtt

    def _rack_detect(self) -> bool:
        now = self.loop.now
        reo_wnd = self._min_rtt / 4
        newly = False
        earliest: float | None = None
        for entry in self._out.values():
            if entry.state is not SegmentState.IN_FLIGHT or entry.last_sent >= self._rack_xmit:
                continue
            deadline = entry.last_sent + self._rack_rtt + reo_wnd
            if now >= deadline:
                entry.state = SegmentState.LOST
                newly = True
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None and (self._reo_at is None or earliest < self._reo_at or self._reo_at <= now):
            self._reo_at = earliest
            self.loop.at(earliest, self._on_reorder_timer, earliest)
        return newly

    def _on_reorder_timer(self, when: float) -> None:
        if self._reo_at != when:
            return
        self._reo_at = None
        self._detect_losses()
        self._try_send()

    def _detect_losses(self) -> None:
        """RFC 6675 IsLost: a hole with DupThresh SACKed segments above it is lost (once per recovery); with
        ``rack_tlp``, RACK's time-based rule instead."""
        if self.config.rack_tlp:
            if self._rack_detect():
                self._enter_recovery()
            return
        sacked = sorted(i for i, o in self._out.items() if o.state is SegmentState.SACKED)
        if len(sacked) < self.config.dupthresh:
            return
        newly = False
        for index, entry in self._out.items():
            if entry.state is not SegmentState.IN_FLIGHT or entry.recovery_epoch == self._epoch:
                continue
            above = len(sacked) - bisect_right(sacked, index)
            if above >= self.config.dupthresh:
                entry.state = SegmentState.LOST
                newly = True
        if newly:
            self._enter_recovery()

    def _enter_recovery(self) -> None:
        if self._recovery_point is None:
            self.stats.fast_retransmits += 1
            self._epoch += 1
            self._recovery_point = self._nxt
            self._reduce()
            self.cwnd = self.ssthresh
            for entry in self._out.values():
                if entry.state is SegmentState.LOST:
                    entry.recovery_epoch = -1  # retransmit in this epoch
