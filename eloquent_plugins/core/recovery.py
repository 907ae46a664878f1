"""Loss recovery for one Eloquent stream: probe (PTO) and cadence timing, loss sampling, loss detection.

Split from the sender as aioquic splits ``recovery`` from packet building: this module only keeps the record of
what left when and decides *when* the run must go again and *how many* copies a flush sends; ``packetizer``
builds the bytes and ``sender`` ties both to the stream's event log. Sans-I/O: every method takes ``now``.
"""

from __future__ import annotations

from collections import deque

from eloquent_plugins.core.rtt import LossEstimator, RttEstimator
from eloquent_plugins.core.sender_config import SenderConfig

SENT_HISTORY = 1024
"""Send times and unreported data packet numbers remembered (older ones are forgotten, oldest first)."""
PACKET_THRESHOLD = 3
"""Duplication mode: a packet is lost once an ack covers a packet this many numbers newer (QUIC's kPacketThreshold)."""


class Recovery:
    """RTT and loss estimates, the probe backoff and the token cadence of one sender. Not thread-safe."""

    def __init__(self, config: SenderConfig) -> None:
        self.config = config
        self.rtt = RttEstimator(config.initial_rtt)
        self.loss = LossEstimator(config.loss_gain)
        self.pto_count = 0
        """Probes sent since the last ack that moved the window: the PTO backs off by 2^pto_count."""
        self.largest_acked = -1
        self.last_data_send: float | None = None
        self.new_data_at: float | None = None
        """When the newest events first left (cadence probes stop one PTO after it)."""
        self._sent_times: dict[int, float] = {}
        self._data_numbers: deque[int] = deque()
        """Numbers of data packets above the largest acked, oldest first: what the loss estimate counts."""
        self._last_push: float | None = None
        self._push_gap: float | None = None
        """Smoothed interval between pushes: the token cadence cadence probes follow."""
        self._last_flush_tail: tuple[int, ...] = ()
        """Numbers of the newest flush's last datagram and its redundant copies."""
        self._carried_in: dict[int, int] = {}
        """Duplication mode only: event index -> number of the last packet that carried it."""

    # ---- what left -----------------------------------------------------------------------------------------
    def on_push(self, now: float) -> None:
        """An event was appended: fold the interval since the previous one into the token cadence."""
        if self._last_push is not None and now > self._last_push:
            gap = now - self._last_push
            self._push_gap = gap if self._push_gap is None else 0.875 * self._push_gap + 0.125 * gap
        self._last_push = now

    def on_packet_sent(self, number: int, now: float) -> None:
        """Any packet took ``number`` at ``now`` (its ack gives an RTT sample)."""
        self._sent_times[number] = now
        if len(self._sent_times) > SENT_HISTORY:
            del self._sent_times[next(iter(self._sent_times))]

    def on_data_sent(self, number: int) -> None:
        """A data packet left: it is a loss sample once an ack reports it or a newer one."""
        self._data_numbers.append(number)
        if len(self._data_numbers) > SENT_HISTORY:
            self._data_numbers.popleft()

    def on_carried(self, index: int, number: int) -> None:
        """Duplication mode: event ``index`` last went out in packet ``number``."""
        self._carried_in[index] = number

    def on_flush(self, now: float, last: int, newest: int, datagrams: int, copies: int) -> None:
        """A run went out: ``last`` numbers its final datagram, ``newest`` the final redundant copy, ``datagrams``
        counts them all (``copies`` of each)."""
        self.last_data_send = now
        extra = copies - 1
        self._last_flush_tail = (last,) if not extra else (last, *range(newest, last, -(datagrams // copies)))

    def on_probe_sent(self, *, cadence: bool) -> None:
        """A probe left; only timer probes back off (cadence probes follow the token interval instead)."""
        self.pto_count += 0 if cadence else 1

    # ---- what came back ------------------------------------------------------------------------------------
    def on_largest_acked(self, largest: int, ack_delay: float, now: float) -> None:
        """An ack reported a packet newer than any before: one RTT sample and the loss samples up to it."""
        self._sample_loss(largest)
        self.largest_acked = largest
        sent_at = self._sent_times.get(largest)
        if sent_at is not None:
            self.rtt.update(now - sent_at, ack_delay)

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

    def on_event_acked(self, index: int) -> None:
        self._carried_in.pop(index, None)

    def on_progress(self) -> None:
        """An ack moved the window: the path works again, so the probe backoff restarts."""
        self.pto_count = 0

    def split_run_lost(self, largest: int) -> bool:
        """The ack reports the newest flush's last datagram (or a copy of it) yet not the whole run: fast
        recovery, part of a split run was lost."""
        return largest in self._last_flush_tail

    def carrier_lost(self, oldest: int, largest: int) -> bool:
        """Duplication mode: the ack covers a packet ``PACKET_THRESHOLD`` newer than the last one that carried the
        oldest unacked event, so that packet is lost."""
        carried = self._carried_in.get(oldest)
        return carried is not None and largest >= carried + PACKET_THRESHOLD

    # ---- when and how much -----------------------------------------------------------------------------------
    def copies(self) -> int:
        """How many copies of each run datagram the next flush sends (``SenderConfig.redundancy``)."""
        mode = self.config.redundancy
        if mode == "off":
            return 1
        if mode == "adaptive":
            return 2 if self.loss.rate >= self.config.redundancy_threshold and self.loss.rate > 0 else 1
        return int(mode)

    def probe_deadline(self, unacked: bool) -> float | None:
        """When the unacked run is resent if nothing else goes: ``PTO * 2^k``, capped."""
        if not unacked or self.last_data_send is None:
            return None
        pto = self.rtt.probe_timeout(self.config.max_ack_delay)
        interval = min(pto * (2 ** self.pto_count), max(self.config.max_probe_interval, pto))
        return self.last_data_send + interval

    def cadence_deadline(self, unacked: bool) -> float | None:
        """While loss is seen: 1.5 push intervals after the last data packet, until a PTO after new data left."""
        if (not self.config.cadence_probes or not unacked or self.last_data_send is None
                or self.new_data_at is None or self._push_gap is None
                or not 0 < self.config.redundancy_threshold <= self.loss.rate):
            return None
        deadline = self.last_data_send + 1.5 * self._push_gap
        if deadline > self.new_data_at + self.rtt.probe_timeout(self.config.max_ack_delay):
            return None
        return deadline
