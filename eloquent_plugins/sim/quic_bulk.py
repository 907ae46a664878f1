"""The bulk download as ``bench e2e --trace --cross`` really runs it: an HTTP/3 GET of an endless body, over QUIC.

End to end the cross flow cannot be the kernel's TCP (it cannot pass a user-space UDP relay), so it is aioquic's
QUIC: CUBIC on a trace, RFC 9002 loss detection and probe timeouts (no 200 ms RTO floor, no exponential backoff of
a retransmission timer through an outage), its pacer, and a client that acknowledges ``ACK_DELAY`` after the first
unacknowledged packet. Those differ from the simulator's TCP (``links.BulkFlow``) exactly where the traces hurt:
after an outage the QUIC flow is back within a probe timeout and refills the queue the token stream shares, where
the TCP flow waits out a backed-off timer. For a like-for-like comparison with the end-to-end bench
(``bench sim --links traces --cross-flow quic``) this flow runs aioquic's own ``QuicPacketRecovery`` and pacer over
the simulated path, as ``quic_window.ServerWindow`` does for Eloquent's datagrams; each packet is a full one
(``QUIC_MAX_DATAGRAM_SIZE``), a lost one's data goes again in a later packet, so what the client receives in the
measuring window is the flow's goodput.
"""

from __future__ import annotations

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.links import CROSS_FLOWS, BulkFlow, BulkStats, FlowFigures
from eloquent_plugins.sim.netem import Link
from eloquent_plugins.sim.quic_window import IP_UDP, SHORT_HEADER, ClientAcks, ClientPacket, QuicSender, ServerPacket

PAYLOAD = QUIC_MAX_DATAGRAM_SIZE - SHORT_HEADER - 3
"""Body bytes in one full packet, counted as the rest less 3 (a STREAM frame's type, stream id, offset and length
take 3 to 8 bytes as the offset grows: the goodput is over-counted by at most 0.4%)."""


class QuicBulkFlow(QuicSender, FlowFigures):
    """A QUIC bulk download from ``start`` to ``stop`` over ``forward``/``reverse``; ``stats`` counts what the client
    received between ``window`` bounds (the token stream's span). The same interface as ``links.BulkFlow``."""

    def __init__(self, loop: EventLoop, forward: Link, reverse: Link, *, start: float, stop: float,
                 window: tuple[float, float], rtt: float, algorithm: str = "cubic") -> None:
        super().__init__(loop, algorithm, rtt, self.transmit)
        self.forward = forward
        self.reverse = reverse
        self.stop = stop
        self.window = window
        self.stats = BulkStats()
        self.acks = ClientAcks(loop, self._send_ack)
        loop.at(start, self.transmit)

    # ---- the server ---------------------------------------------------------------------------------------
    def transmit(self) -> None:
        """``QuicConnection.datagrams_to_send`` for a stream with an endless backlog: full packets while the window
        has room and the pacer lets them go (a probe may exceed the window by one packet)."""
        now = self.loop.now
        if now >= self.stop:
            return
        while True:
            room = self.recovery.congestion_window - self.recovery.bytes_in_flight
            if room < QUIC_MAX_DATAGRAM_SIZE and not self._probe_pending:
                break
            if not self._probe_pending and self._paced(now):
                break
            self._emit(now)
        self._arm()

    def _emit(self, now: float) -> None:
        number = self._sent(QUIC_MAX_DATAGRAM_SIZE, True)
        self.stats.segments += 1
        arrival = self.forward.through(now, IP_UDP + QUIC_MAX_DATAGRAM_SIZE)
        if arrival is None:
            self.stats.lost += 1
        else:
            self.loop.at(arrival, self._on_client_packet, ServerPacket(number, None, True))

    def _on_ack(self, packet: ClientPacket) -> None:
        self._take_ack(packet)
        self.transmit()

    # ---- the client ---------------------------------------------------------------------------------------
    def _on_client_packet(self, packet: ServerPacket) -> None:
        self.acks.on_packet(packet)
        if self.window[0] <= self.loop.now < self.window[1]:
            self.stats.delivered_bytes += PAYLOAD

    def _send_ack(self, packet: ClientPacket, size: int) -> None:
        arrival = self.reverse.through(self.loop.now, size)
        if arrival is None:
            self.stats.acks_lost += 1
        else:
            self.loop.at(arrival, self._on_ack, packet)


CrossFlow = BulkFlow | QuicBulkFlow


def bulk_flow(kind: str, loop: EventLoop, forward: Link, reverse: Link, *, start: float, stop: float,
              window: tuple[float, float], rtt: float) -> CrossFlow:
    """The cross flow ``kind`` (``CROSS_FLOWS``) over the stream's paths."""
    if kind == "tcp":
        return BulkFlow(loop, forward, reverse, start=start, stop=stop, window=window, rtt=rtt)
    if kind == "quic":
        return QuicBulkFlow(loop, forward, reverse, start=start, stop=stop, window=window, rtt=rtt)
    raise ConfigError(f"unknown cross flow {kind!r} (known: {', '.join(CROSS_FLOWS)})")
