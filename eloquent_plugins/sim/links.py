"""Real links in the simulator: a scenario's cellular trace pair (``.down``/``.up``), its queue, where each stream
falls in the trace, and the bulk download that shares the bottleneck with the token stream (cross traffic).

The bulk flow is the simulator's own CUBIC TCP (``sim.tcp``, SACK, RTO) with an endless backlog: it grows its window
until the bottleneck queue overflows, backs off, grows again, so the token stream meets queueing delay and the
queue's drops the way a chat app beside a download does. Its packets join the scheme's own paths through
``Link.through`` (the same queue and delay, none of the scheme's random draws).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eloquent_plugins.sim.clock import EventLoop, SimulationError
from eloquent_plugins.sim.link import TCP_HEADER
from eloquent_plugins.sim.netem import CapacityLink, CapacityTrace, Link, PathConfig, SlottedPath
from eloquent_plugins.sim.tcp import Ack, Segment, TcpConfig, TcpSender
from eloquent_plugins.sim.tcp_receiver import TcpReceiver

LINK_RTT_MS = 60.0
"""Base RTT of the links (30 ms each way before the queue), as ``mm-delay 30`` would add; ``bench sim --link-rtt``
sets another (the figures' sensitivity to it, docs/results/real-links.md point 11)."""
LINK_WINDOW = "cubic"
"""The Eloquent schemes' QUIC congestion window on a link: the front end's in ``bench e2e --trace``
(``cli/bench/e2e_links.CONGESTION_CONTROL``), so both hold datagrams the same way."""
WARMUP = 2.0
"""Seconds the bulk flow runs before the first token (past its slow start), in the simulator and end to end."""
REQUEST_TTFT = 0.2
"""The engine's time to the first token end to end (``bench e2e``'s ``--ttft`` default): the request leaves that
much plus the one-way delay before the stream's first token is due."""
REQUEST_BYTES = 500
"""The request's one packet up the link: a short chat POST over HTTP/3 with QUIC's and UDP/IP's headers."""
REQUEST_TRIES = 20
"""Sends of the request before the simulation gives up on the link (a client would have failed it long before)."""
CROSS_FLOWS = ("tcp", "quic")
"""The bulk download: ``tcp``, the simulator's CUBIC TCP (``BulkFlow``, the default); ``quic``, aioquic's as
``bench e2e --trace --cross`` runs it (``quic_bulk.QuicBulkFlow``)."""
DEFAULT_QUEUE_PACKETS = 100
"""A cellular base station's per-user buffer is deep: 100 packets (150 KB) is a common emulation choice."""


def stream_span(tokens: int, tpot: float, ttft: float = 0.2) -> float:
    """How far apart in the trace consecutive streams start: the stream's length and room for its stalls. The
    end-to-end bench starts request i at ``WARMUP + i * span`` after the relay, so both sample the same part."""
    return round(ttft + tokens * tpot * 1.5 + 2.0, 3)


@dataclass(frozen=True, slots=True)
class RealLink:
    """A trace pair and its queues: what ``--links traces`` runs each scheme over."""

    name: str
    down: CapacityTrace
    up: CapacityTrace
    queue_packets: int = DEFAULT_QUEUE_PACKETS
    codel: bool = False

    def paths(self, base: PathConfig, offset: float) -> tuple[PathConfig, PathConfig]:
        """Forward (server -> client: ``.down``) and reverse (``.up``) configs from ``offset`` s into the trace."""
        def one(trace: CapacityTrace) -> PathConfig:
            return replace(base, capacity=CapacityLink(trace, queue_packets=self.queue_packets, codel=self.codel,
                                                       offset=offset % trace.period))
        return one(self.down), one(self.up)


def stream_offset(stream_index: int, span: float) -> float:
    """Where stream ``stream_index`` (counted over seeds: (seed - 1) * streams + stream) starts in the trace."""
    return stream_index * span


def request_delay(loop: EventLoop, reverse: Link, sent: float, retry: float) -> float:
    """How much later than on an idle link the stream's request reaches the server when it leaves at ``sent``:
    it waits for the uplink's opportunities and behind what queues there (a bulk flow's ACKs), as the end-to-end
    request does, so the stream starts that much later in the trace. Dropped by a full queue, it goes again
    ``retry`` s later (QUIC's probe timeout). ``loop`` runs whatever else shares the link up to each send."""
    at = sent
    for _ in range(REQUEST_TRIES):
        loop.run_until(at)
        arrival = reverse.through(at, REQUEST_BYTES)
        if arrival is not None:
            return max(0.0, arrival - sent - reverse.config.delay)
        at += retry
    raise SimulationError(f"the stream's request was dropped by the uplink's full queue {REQUEST_TRIES} times "
                          f"from {sent:.1f} s on")


@dataclass(slots=True)
class BulkStats:
    segments: int = 0
    lost: int = 0
    """Segments (first sends and retransmissions) the bottleneck dropped."""
    acks_lost: int = 0
    delivered_bytes: int = 0
    """Payload delivered in order inside the measuring window."""


class FlowFigures:
    """What a bulk flow reports, from its ``stats`` over its measuring ``window`` (either flow: ``BulkFlow``, or
    ``quic_bulk.QuicBulkFlow``)."""

    stats: BulkStats
    window: tuple[float, float]

    @property
    def loss(self) -> float:
        return self.stats.lost / self.stats.segments if self.stats.segments else 0.0

    def throughput(self) -> float:
        """Bits per second delivered in the window."""
        span = self.window[1] - self.window[0]
        return self.stats.delivered_bytes * 8 / span if span > 0 else 0.0


class BulkFlow(FlowFigures):
    """A bulk TCP download from ``start`` to ``stop`` over ``forward``/``reverse``; ``stats`` counts what the
    receiver got in order between ``window`` bounds (the token stream's span)."""

    def __init__(self, loop: EventLoop, forward: Link, reverse: Link, *, start: float, stop: float,
                 window: tuple[float, float], rtt: float) -> None:
        self.loop = loop
        self.forward = forward
        self.reverse = reverse
        self.stop = stop
        self.window = window
        self.stats = BulkStats()
        self.config = TcpConfig()
        self.sender = TcpSender(loop, self.config, rtt, self._send_segment)
        self.receiver = TcpReceiver(loop, self.config, self._send_ack, self._render)
        self._written = 0
        self._delivered = 0
        loop.at(start, self._top_up)

    def _top_up(self) -> None:
        if self.loop.now >= self.stop:
            return
        backlog = int(self.sender.cwnd) * 2 + 64  # always more than the window can take
        while self._written - self._delivered < backlog:
            self.sender.write(self._written, self.config.mss)
            self._written += 1

    def _send_segment(self, segment: Segment) -> None:
        self.stats.segments += 1
        arrival = self.forward.through(self.loop.now, TCP_HEADER + segment.size)
        if arrival is None:
            self.stats.lost += 1
        else:
            self.loop.at(arrival, self.receiver.on_segment, segment)

    def _send_ack(self, ack: Ack) -> None:
        arrival = self.reverse.through(self.loop.now, TCP_HEADER + ack.option_bytes)
        if arrival is None:
            self.stats.acks_lost += 1
        else:
            self.loop.at(arrival, self.sender.on_ack, ack)

    def _render(self, token: int, now: float) -> None:
        self._delivered += 1
        if self.window[0] <= now < self.window[1]:
            self.stats.delivered_bytes += self.config.mss
        if self._written - self._delivered < int(self.sender.cwnd) + 32:
            self._top_up()


def link_floor(forward: SlottedPath, generated: tuple[float, ...]) -> tuple[float, ...]:
    """Per token, when its packet alone could have left the forward queue (``TraceQueue.floor``)."""
    queue = forward.link.queue
    if queue is None:
        return generated
    arrivals = [a for a, _ in queue.tail]
    return tuple(queue.floor(g, arrivals) for g in generated)


def load_real_link(name: str, queue_packets: int = DEFAULT_QUEUE_PACKETS, codel: bool = False) -> RealLink:
    """The ``.down``/``.up`` pair of a named trace (``netem.capacity.traces_dir``) or of a path prefix."""
    from eloquent_plugins.sim.netem import load_mahimahi, trace_paths

    down, up = trace_paths(name)
    return RealLink(name, load_mahimahi(down), load_mahimahi(up), queue_packets, codel)
