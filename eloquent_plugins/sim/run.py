"""One stream of one scenario under every scheme, on the same token timeline and the same path sample.

Each scheme gets fresh ``SlottedPath`` models built from the same seeds and the same slots (the oracle's send
instants), so whichever scheme sends the first packet of a slot meets the same fate and delay there (common random
numbers), and every scheme streams the same generated tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.sim.netem import PathConfig, SlottedPath, Trace
from eloquent_plugins.core.sender import SenderConfig
from eloquent_plugins.sim.clock import EventLoop, SimulationError
from eloquent_plugins.sim.eloquent import connect
from eloquent_plugins.sim.quic_bulk import CrossFlow, bulk_flow
from eloquent_plugins.sim.quic_window import held_times
from eloquent_plugins.sim.scenario import Scenario
from eloquent_plugins.sim.tcp import TcpConfig, TcpSender
from eloquent_plugins.sim.tcp_receiver import TcpReceiver
from eloquent_plugins.sim.links import (REQUEST_TTFT, WARMUP, RealLink, link_floor, request_delay, stream_offset,
                                        stream_span)
from eloquent_plugins.sim.timeline import Timeline, generate_timeline
from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER, TCP_HEADER, SimWire

SCHEMES = ("retransmission", "duplication", "eloquent", "oracle")
RACK_TLP = "retransmission-rack-tlp"
"""Sensitivity variant, not one of the issue's schemes: the TCP baseline with Linux's RACK-TLP loss recovery."""
ELOQUENT_X2 = "eloquent-x2"
"""Sensitivity variant: the real Eloquent sender's datagrams each sent twice back to back by the driver."""
ELOQUENT_ADAPTIVE = "eloquent-adaptive"
"""Sensitivity variant: the real Eloquent sender with ``SenderConfig(redundancy="adaptive")``."""
ELOQUENT_NEW_ONLY = "eloquent-new-only"
"""Sensitivity variant: the real sender with ``carry_unacked=False`` (each packet carries only new events; a loss is
repaired by resending the run once an ack shows its carrier lost, or by a probe): Eloquent without re-carrying."""
ONCE = "once"
"""A bound on a real link, not a protocol: every token's packet once, at its generation, as big as an Eloquent
datagram carrying that token alone; no acks, no recovery (``run_once``)."""
ALL_SCHEMES = (*SCHEMES[:1], RACK_TLP, *SCHEMES[1:3], ELOQUENT_ADAPTIVE, ELOQUENT_X2, SCHEMES[3])
_TIME_GUARD = 900.0


@dataclass(frozen=True, slots=True)
class StreamRun:
    scheme: str
    generated: tuple[float, ...]
    rendered: tuple[float, ...]
    min_delay: float
    bytes_sent: int
    """Both directions, headers included; 0 for the oracle (it is a bound, not a protocol)."""
    packets_sent: int
    details: dict[str, float] = field(default_factory=dict)
    """Scheme internals worth checking (TCP timeouts and RTO, Eloquent probes), not used by the metrics."""
    ready: tuple[float, ...] = ()
    """On a real link: per token, when its packet alone could have left the bottleneck (``link_floor``)."""


@dataclass(frozen=True, slots=True)
class StreamSeeds:
    timeline: int
    forward: int
    reverse: int

    @classmethod
    def derive(cls, seed: int, stream: int) -> StreamSeeds:
        rng = random.Random(f"eloquent-sim/{seed}/{stream}")
        return cls(rng.getrandbits(63), rng.getrandbits(63), rng.getrandbits(63))


class _Renders:
    def __init__(self, n: int) -> None:
        self.times = [math.nan] * n

    def __call__(self, index: int, now: float) -> None:
        if index < len(self.times) and math.isnan(self.times[index]):
            self.times[index] = now

    def result(self, scheme: str) -> tuple[float, ...]:
        if any(math.isnan(t) for t in self.times):
            missing = sum(1 for t in self.times if math.isnan(t))
            raise SimulationError(f"{scheme}: {missing} tokens never rendered")
        return tuple(self.times)


def _initial_rtt(scenario: Scenario) -> float:
    """What the handshake measured: base RTT plus the mean jitter of both directions."""
    return max(scenario.rtt_ms + 2 * scenario.jitter_ms, 1.0) / 1000


def _payload_sizes(timeline: Timeline) -> list[int]:
    sizes = [len(p) for p in timeline.payloads]
    sizes[-1] += len(timeline.end_payload)
    return sizes


def oracle_sends(timeline: Timeline) -> tuple[list[tuple[float, int]], float]:
    """Send instants of the oracle (each token's generation, then one per mean token interval through longer
    silences) with the newest token each can carry; also the step used after the last token."""
    step = max(timeline.mean_gap, 1e-3)
    sends: list[tuple[float, int]] = []
    times = timeline.times
    for index, when in enumerate(times):
        sends.append((when, index))
        if index + 1 < len(times):
            filler = when + step
            while filler < times[index + 1] - step / 2:
                sends.append((filler, index))
                filler += step
    return sends, step


def _paths(path: PathConfig, timeline: Timeline, seeds: StreamSeeds,
           reverse: PathConfig | None = None) -> tuple[SlottedPath, SlottedPath]:
    sends, step = oracle_sends(timeline)
    slots = [when for when, _ in sends]
    return (SlottedPath(path, seeds.forward, slots, step),
            SlottedPath(reverse or path, seeds.reverse, [when + path.delay for when in slots], step))


@dataclass(frozen=True, slots=True)
class LinkRun:
    """One stream on a real link: the trace pair from ``offset`` s in, whether a bulk download shares it, and which
    (``flow``, ``links.CROSS_FLOWS``: the simulator's TCP, or aioquic's QUIC as end to end)."""

    link: RealLink
    offset: float
    cross: bool
    flow: str = "tcp"

    def paths(self, base: PathConfig, timeline: Timeline, seeds: StreamSeeds) -> tuple[SlottedPath, SlottedPath]:
        forward, reverse = self.link.paths(base, self.offset)
        return _paths(forward, timeline, seeds, reverse)

    def request_delay(self, scenario: Scenario, timeline: Timeline, seeds: StreamSeeds) -> float:
        """The request's wait up the link (``links.request_delay``), the same for every scheme."""
        loop = EventLoop()
        forward, reverse = self.paths(scenario.path_config(), timeline, seeds)
        self.bulk(loop, forward, reverse, timeline, _initial_rtt(scenario))
        sent = timeline.times[0] - REQUEST_TTFT - reverse.link.config.delay
        return request_delay(loop, reverse.link, sent, retry=3 * _initial_rtt(scenario))

    def bulk(self, loop: EventLoop, forward: SlottedPath, reverse: SlottedPath, timeline: Timeline,
             rtt: float) -> CrossFlow | None:
        span = (timeline.times[0], timeline.times[-1])
        return bulk_flow(self.flow, loop, forward.link, reverse.link, start=0.0, stop=span[1] + 1.0, window=span,
                         rtt=rtt) if self.cross else None


def _link_details(forward: SlottedPath, reverse: SlottedPath, bulk: CrossFlow | None) -> dict[str, float]:
    out = {"own_packets": float(forward.stats.packets + reverse.stats.packets),
           "own_queue_drops": float(forward.stats.queue_drops + reverse.stats.queue_drops)}
    if bulk is not None:
        out |= {"cross_bps": bulk.throughput(), "cross_segments": float(bulk.stats.segments),
                "cross_lost": float(bulk.stats.lost)}
    return out


def _stream_run(scheme: str, timeline: Timeline, renders: _Renders, path: PathConfig, wires: tuple[SimWire, SimWire],
                details: dict[str, float], link: LinkRun | None, paths: tuple[SlottedPath, SlottedPath],
                bulk: CrossFlow | None) -> StreamRun:
    """One run's result: what its wires carried and, on a simulated link, the link's details and each token's floor."""
    ready: tuple[float, ...] = ()
    if link is not None:
        details |= _link_details(*paths, bulk)
        ready = link_floor(paths[0], timeline.times)
    forward, reverse = wires
    return StreamRun(scheme, timeline.times, renders.result(scheme), path.min_delay,
                     forward.stats.bytes + reverse.stats.bytes, forward.stats.packets + reverse.stats.packets,
                     details, ready)


def run_bulk_alone(scenario: Scenario, timeline: Timeline, seeds: StreamSeeds, link: LinkRun) -> float:
    """The cross flow's throughput over the token stream's span with no token stream: its baseline."""
    loop = EventLoop()
    forward, reverse = link.paths(scenario.path_config(), timeline, seeds)
    bulk = link.bulk(loop, forward, reverse, timeline, _initial_rtt(scenario))
    assert bulk is not None
    loop.run(timeline.times[-1] + _TIME_GUARD)
    return bulk.throughput()


def run_tcp(scenario: Scenario, timeline: Timeline, seeds: StreamSeeds, trace: Trace | None, copies: int,
            scheme: str, rack_tlp: bool = False, sizes: list[int] | None = None,
            link: LinkRun | None = None) -> StreamRun:
    """``sizes``: bytes each token's write takes (``bench leak``: padded), instead of its payload's."""
    config = TcpConfig(copies=copies, rack_tlp=rack_tlp)
    path = scenario.path_config(trace)
    loop = EventLoop()
    renders = _Renders(len(timeline.times))
    receiver = TcpReceiver(loop, config, lambda ack: reverse.send(ack, 0, ack.option_bytes), renders)
    sender = TcpSender(loop, config, _initial_rtt(scenario), lambda seg: forward.send(seg, seg.size))
    forward_path, reverse_path = (_paths(path, timeline, seeds) if link is None
                                  else link.paths(path, timeline, seeds))
    bulk = None if link is None else link.bulk(loop, forward_path, reverse_path, timeline, _initial_rtt(scenario))
    forward = SimWire(loop, forward_path, TCP_HEADER, receiver.on_segment)
    reverse = SimWire(loop, reverse_path, TCP_HEADER, sender.on_ack)
    for index, (when, size) in enumerate(zip(timeline.times, sizes or _payload_sizes(timeline))):
        loop.at(when, sender.write, index, size)
    loop.run(timeline.times[-1] + _TIME_GUARD)
    stats = sender.stats
    details = {"timeouts": stats.timeouts, "fast_retransmits": stats.fast_retransmits,
               "loss_probes": stats.loss_probes,
               "retransmissions": stats.retransmissions, "segments": stats.segments,
               "first_rto": stats.rto_history[0] if stats.rto_history else 0.0}
    return _stream_run(scheme, timeline, renders, path, (forward, reverse), details, link,
                       (forward_path, reverse_path), bulk)


def run_eloquent(scenario: Scenario, timeline: Timeline, seeds: StreamSeeds, trace: Trace | None,
                 copies: int = 1, scheme: str = "eloquent", redundancy: str | int | None = None,
                 padding: PaddingPolicy | None = None,
                 observe: Callable[[float, bytes], None] | None = None,
                 link: LinkRun | None = None, send_tick: float = 0.0, carry_unacked: bool = True) -> StreamRun:
    """``redundancy`` None keeps the sender's default; otherwise it sets ``SenderConfig.redundancy``.
    ``padding`` and ``send_tick`` set ``SenderConfig``'s; ``observe(now, datagram)`` sees every data datagram sent
    (what an observer of the path sees, ``bench leak``)."""
    path = scenario.path_config(trace)
    loop = EventLoop()
    renders = _Renders(len(timeline.times))
    limit = scenario.recarry or None
    plain = redundancy is None and padding is None and not send_tick and carry_unacked and limit is None
    config = None if plain else replace(
        SenderConfig(), initial_rtt=_initial_rtt(scenario), keepalive=KeepAlivePolicy(interval=0.0),
        redundancy="off" if redundancy is None else redundancy, padding=padding, send_tick=send_tick,
        carry_unacked=carry_unacked, recarry_limit=limit)

    rtt = _initial_rtt(scenario)
    forward_path, reverse_path = (_paths(path, timeline, seeds) if link is None
                                  else link.paths(path, timeline, seeds))
    bulk = None if link is None else link.bulk(loop, forward_path, reverse_path, timeline, rtt)
    conn = connect(loop, rtt, forward_path, reverse_path, renders, window=scenario.window, sender_config=config,
                   copies=copies, observe=observe)
    ends, window, forward, reverse = conn.ends, conn.window, conn.forward, conn.reverse
    last = len(timeline.times) - 1
    for index, (when, payload) in enumerate(zip(timeline.times, timeline.payloads)):
        loop.at(when, ends.push, payload, timeline.end_payload if index == last else None)
    loop.run(timeline.times[-1] + _TIME_GUARD)
    if not ends.sender.done:
        raise SimulationError(f"{scheme}: the sender never saw its final event acknowledged")
    stats = ends.sender.stats
    details = {"data_packets": stats.data_packets, "probe_packets": stats.probe_packets,
               "redundant_packets": stats.redundant_packets,
               "events_resent": stats.events_resent, "acks": ends.receiver.stats.acks_sent}
    if window is not None:
        held = held_times(timeline.times, window.handed)
        details |= {"window_probes": window.probes, "window_ptos": window.ptos,
                    "held_mean": sum(held) / len(held), "held_tokens": float(sum(1 for h in held if h > 0.005))}
    return _stream_run(scheme, timeline, renders, path, (forward, reverse), details, link,
                       (forward_path, reverse_path), bulk)


def run_oracle(scenario: Scenario, timeline: Timeline, seeds: StreamSeeds, trace: Trace | None) -> StreamRun:
    """The bound for schemes that send at most one packet per slot: the first packet of every slot (each token's
    generation, one per mean token interval through longer silences and after the end, until one gets through),
    on the same forward path. Token i renders at the first arrival of any such packet sent at or after its
    generation, as if every packet carried every token so far."""
    path = scenario.path_config(trace)
    model, _ = _paths(path, timeline, seeds)
    sends, step = oracle_sends(timeline)
    times = timeline.times
    # The smallest packet any scheme puts on the wire (a QUIC datagram's headers), so a bandwidth limit never
    # delays the bound more than the schemes it bounds.
    size = QUIC_DATAGRAM_HEADER
    arrivals = [(model.transmit(when, size), newest) for when, newest in sends]
    when = times[-1]
    while arrivals[-1][0] is None or arrivals[-1][1] < len(times) - 1:
        when += step
        if when - times[-1] > _TIME_GUARD:
            raise SimulationError("oracle: no packet got through after the last token")
        arrivals.append((model.transmit(when, size), len(times) - 1))
    rendered = [math.inf] * len(times)
    best = math.inf
    pos = len(times) - 1
    for arrival, newest in reversed(arrivals):
        while pos > newest:
            rendered[pos] = best
            pos -= 1
        if arrival is not None:
            best = min(best, arrival)
    while pos >= 0:
        rendered[pos] = best
        pos -= 1
    return StreamRun("oracle", timeline.times, tuple(rendered), path.min_delay, 0, 0)


def single_token_sizes(timeline: Timeline) -> list[int]:
    """Per token, the bytes of an Eloquent datagram carrying it alone (a delta against the token before), with
    ``QUIC_DATAGRAM_HEADER``: the least a token's packet takes."""
    from eloquent_plugins.core.delta import make_delta
    from eloquent_plugins.core.events import EventKind
    from eloquent_plugins.core.wire import DataPacket, Entry, encode_packet

    sizes: list[int] = []
    previous: bytes | None = None
    for index, payload in enumerate(timeline.payloads):
        entry = Entry(index, EventKind.DATA, payload)
        if previous is not None:
            prefix, suffix, middle = make_delta(previous, payload)
            entry = min(entry, Entry(index, EventKind.DATA, middle, True, prefix, suffix), key=Entry.encoded_size)
        packet = DataPacket(0, index, None if previous is None else index - 1, index, (entry,))
        sizes.append(QUIC_DATAGRAM_HEADER + len(encode_packet(packet)))
        previous = payload
    return sizes


def run_once(scenario: Scenario, timeline: Timeline, seeds: StreamSeeds, link: LinkRun) -> StreamRun:
    """``ONCE``: token i renders at the first arrival of its packet or a later one (as if each carried every token
    before it); after the last token one more packet per mean token interval until one gets through."""
    path = scenario.path_config()
    loop = EventLoop()
    forward, reverse = link.paths(path, timeline, seeds)
    bulk = link.bulk(loop, forward, reverse, timeline, _initial_rtt(scenario))
    sizes = single_token_sizes(timeline)
    arrivals: list[float | None] = [None] * len(sizes)
    sent = [0]

    def send(index: int) -> None:
        sent[0] += sizes[index]
        arrivals[index] = forward.transmit(loop.now, sizes[index])

    def tail(when: float) -> None:
        if arrivals[-1] is None and when - timeline.times[-1] < _TIME_GUARD:
            send(len(sizes) - 1)
            loop.at(when + timeline.mean_gap, tail, when + timeline.mean_gap)

    for index, when in enumerate(timeline.times):
        loop.at(when, send, index)
    loop.at(timeline.times[-1] + timeline.mean_gap, tail, timeline.times[-1] + timeline.mean_gap)
    loop.run(timeline.times[-1] + _TIME_GUARD)
    rendered, best = [math.inf] * len(sizes), math.inf
    for index in range(len(sizes) - 1, -1, -1):
        arrival = arrivals[index]
        best = min(best, math.inf if arrival is None else arrival)
        rendered[index] = best
    if math.isinf(best):
        raise SimulationError(f"{ONCE}: no packet got through")
    return StreamRun(ONCE, timeline.times, tuple(rendered), path.min_delay, sent[0], forward.stats.packets,
                     _link_details(forward, reverse, bulk), link_floor(forward, timeline.times))


def stream_place(scenario: Scenario, seed: int, stream: int) -> float:
    """Where stream ``stream`` of seed ``seed`` starts in a real link's trace (s): end to end, request
    (seed - 1) * streams + stream starts there too (``bench sim --against`` pairs the two by it)."""
    span = stream_span(scenario.tokens, scenario.tpot_ms / 1000)
    return stream_offset((seed - 1) * scenario.streams + stream, span)


def simulate_stream(scenario: Scenario, seed: int, stream: int, trace: Trace | None = None,
                    schemes: tuple[str, ...] = SCHEMES, real_link: RealLink | None = None) -> dict[str, StreamRun]:
    """``real_link``: the stream runs on that trace pair (from its place in the trace, ``links.stream_offset``),
    after ``links.WARMUP`` s and its request's wait up the link (``LinkRun.request_delay``), beside a bulk
    download when ``scenario.cross``; the oracle is not defined there."""
    seeds = StreamSeeds.derive(seed, stream)
    timeline = generate_timeline(scenario.token_model(), random.Random(seeds.timeline))
    link: LinkRun | None = None
    if real_link is not None:
        timeline = replace(timeline, times=tuple(t + WARMUP for t in timeline.times))
        link = LinkRun(real_link, stream_place(scenario, seed, stream), bool(scenario.cross), scenario.cross_flow)
        wait = link.request_delay(scenario, timeline, seeds)
        timeline = replace(timeline, times=tuple(t + wait for t in timeline.times))
    out: dict[str, StreamRun] = {}
    alone = run_bulk_alone(scenario, timeline, seeds, link) if link is not None and link.cross else None
    for scheme in schemes:
        if scheme == "retransmission":
            out[scheme] = run_tcp(scenario, timeline, seeds, trace, 1, scheme, link=link)
        elif scheme == RACK_TLP:
            out[scheme] = run_tcp(scenario, timeline, seeds, trace, 1, scheme, rack_tlp=True, link=link)
        elif scheme == "duplication":
            out[scheme] = run_tcp(scenario, timeline, seeds, trace, scenario.copies, scheme, link=link)
        elif scheme == "eloquent":
            out[scheme] = run_eloquent(scenario, timeline, seeds, trace, link=link)
        elif scheme == ELOQUENT_ADAPTIVE:
            out[scheme] = run_eloquent(scenario, timeline, seeds, trace, scheme=scheme, redundancy="adaptive",
                                       link=link)
        elif scheme == ELOQUENT_NEW_ONLY:
            out[scheme] = run_eloquent(scenario, timeline, seeds, trace, scheme=scheme, carry_unacked=False,
                                       link=link)
        elif scheme == ONCE:
            if link is None:
                raise ConfigError(f"{ONCE} is a bound on a real link (--links)")
            out[scheme] = run_once(scenario, timeline, seeds, link)
        elif scheme == ELOQUENT_X2:
            out[scheme] = run_eloquent(scenario, timeline, seeds, trace, copies=2, scheme=scheme, link=link)
        elif scheme == "oracle":
            if link is not None:
                raise ConfigError("the oracle is not defined on a real link (its bound assumes no queue)")
            out[scheme] = run_oracle(scenario, timeline, seeds, trace)
        else:
            raise ConfigError(f"unknown scheme {scheme!r}")
        if alone is not None:
            out[scheme].details["cross_alone_bps"] = alone
    return out
