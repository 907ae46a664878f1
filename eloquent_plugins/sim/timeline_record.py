"""Per-token timelines: when each token was generated, when each datagram carrying it left the sender, what the
path did with it (dropped, or when it arrived) and when the token rendered. The same rows come from a simulated
stream (here) and from an end-to-end run (``cli/bench/timeline.py``), so the two can be compared term by term.

``replay_eloquent`` runs the real sender and receiver over paths that replay a relay's recorded drop pattern
(``relay_record.fate_trace_text``) with the real stream's generation times, so the simulator meets the same
losses as the end-to-end run did.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.sender import SenderConfig
from eloquent_plugins.core.wire import DataPacket, decode_packet
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.eloquent import EloquentEndpoints
from eloquent_plugins.sim.netem import PathConfig, PathModel, SlottedPath, Trace
from eloquent_plugins.sim.timeline import Timeline, TokenModel, generate_timeline

TOKEN_FIELDS = ("index", "generated", "first_send", "sends", "delivered_by", "rendered")
"""Every token row has these; each entry of ``sends`` has ``SEND_FIELDS``."""
SEND_FIELDS = ("sent", "packet_number", "dropped", "relay_in", "due", "relay_out")


@dataclass(slots=True)
class SendLog:
    """One datagram: when it left, and the path's answer (``relay_in``/``relay_out``: None in the simulator)."""

    sent: float
    datagram: bytes
    due: float | None
    relay_in: float | None = None
    relay_out: float | None = None
    cause: str = ""

    @property
    def dropped(self) -> bool:
        return self.due is None


def carried(datagram: bytes) -> tuple[int | None, tuple[int, ...]]:
    """(packet number, event indexes) of an Eloquent data datagram; (None, ()) for acks and keep-alives."""
    try:
        packet = decode_packet(datagram)
    except EloquentError:
        return None, ()
    if not isinstance(packet, DataPacket):
        return None, ()
    return packet.packet_number, tuple(e.index for e in packet.entries)


def token_rows(generated: Sequence[float], rendered: Sequence[float], sends: Sequence[SendLog],
               origin: float = 0.0) -> list[dict[str, Any]]:
    """One row per token (fields ``TOKEN_FIELDS``), times in seconds from ``origin``. ``delivered_by`` is the
    position in ``sends`` of the datagram whose arrival rendered it: the first to arrive that carries it."""
    rows: list[dict[str, Any]] = [{"index": i, "generated": g - origin, "first_send": None, "sends": [],
                                   "delivered_by": None, "rendered": r - origin, "_arrival": math.inf}
                                  for i, (g, r) in enumerate(zip(generated, rendered))]

    def rel(t: float | None) -> float | None:
        return None if t is None else t - origin

    for k, s in enumerate(sends):
        number, indexes = carried(s.datagram)
        entry = {"sent": s.sent - origin, "packet_number": number, "dropped": s.dropped, "cause": s.cause,
                 "relay_in": rel(s.relay_in), "due": rel(s.due), "relay_out": rel(s.relay_out), "send": k}
        arrival = s.relay_out if s.relay_out is not None else s.due
        for i in indexes:
            if i >= len(rows):
                continue
            row = rows[i]
            row["sends"].append(entry)
            if row["first_send"] is None:
                row["first_send"] = s.sent - origin
            if arrival is not None and arrival < row["_arrival"]:
                row["_arrival"], row["delivered_by"] = arrival, k
    for row in rows:
        del row["_arrival"]
    return rows


class _Wire:
    """One simulated direction that logs what it sends (data direction) and delivers through a path model."""

    def __init__(self, loop: EventLoop, path: PathModel | SlottedPath, header: int,
                 deliver: Callable[[bytes], None], log: list[SendLog] | None) -> None:
        self.loop, self.path, self.header, self.deliver, self.log = loop, path, header, deliver, log
        self.bytes = 0
        self.packets = 0

    def send(self, datagram: bytes) -> None:
        size = self.header + len(datagram)
        self.bytes += size
        self.packets += 1
        arrival = self.path.transmit(self.loop.now, size)
        if self.log is not None:
            self.log.append(SendLog(self.loop.now, datagram, arrival, cause="" if arrival is not None else "loss"))
        if arrival is not None:
            self.loop.at(arrival, self.deliver, datagram)


@dataclass(slots=True)
class SimTimeline:
    generated: list[float]
    rendered: list[float]
    sends: list[SendLog] = field(default_factory=list)
    bytes_sent: int = 0
    details: dict[str, float] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        return token_rows(self.generated, self.rendered, self.sends)


def run_recorded(timeline: Timeline, forward: PathModel | SlottedPath, reverse: PathModel | SlottedPath,
                 initial_rtt: float, sender_config: SenderConfig | None = None,
                 time_guard: float = 900.0) -> SimTimeline:
    """The real Eloquent sender and receiver (``sim.eloquent``) over the two paths, every data datagram logged."""
    from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER

    loop = EventLoop()
    rendered = [math.nan] * len(timeline.times)

    def render(index: int, now: float) -> None:
        if index < len(rendered) and math.isnan(rendered[index]):
            rendered[index] = now

    log: list[SendLog] = []
    config = sender_config or SenderConfig(initial_rtt=initial_rtt, keepalive=KeepAlivePolicy(interval=0.0))
    ends = EloquentEndpoints(loop, initial_rtt, lambda d: fwd.send(d), lambda a: rev.send(a), render,
                             sender_config=config)
    fwd = _Wire(loop, forward, QUIC_DATAGRAM_HEADER, ends.on_data, log)
    rev = _Wire(loop, reverse, QUIC_DATAGRAM_HEADER, ends.on_ack, None)
    last = len(timeline.times) - 1
    for index, (when, payload) in enumerate(zip(timeline.times, timeline.payloads)):
        loop.at(when, ends.push, payload, timeline.end_payload if index == last else None)
    loop.run(timeline.times[-1] + time_guard)
    stats = ends.sender.stats
    return SimTimeline(list(timeline.times), rendered, log, fwd.bytes + rev.bytes,
                       {"data_packets": stats.data_packets, "probe_packets": stats.probe_packets,
                        "events_resent": stats.events_resent, "acks": ends.receiver.stats.acks_sent})


def timeline_with_times(times: Sequence[float], seed: int = 0) -> Timeline:
    """The simulator's token texts and SSE payloads on given generation times (shifted to start at 0)."""
    base = generate_timeline(TokenModel(tokens=len(times)), random.Random(seed))
    t0 = times[0]
    return Timeline(tuple(t - t0 for t in times), base.texts, base.payloads, base.end_payload)


def replay_eloquent(generated: Sequence[float], down: Trace, up: Trace, one_way: float, rtt: float,
                    sender_config: SenderConfig | None = None) -> SimTimeline:
    """Replay one end-to-end stream: its generation times, the relay's recorded drops each way (as traces whose
    time 0 is the stream's first token), the path's one-way delay, nothing else (no processing time)."""
    timeline = timeline_with_times(generated)
    forward = PathModel(PathConfig(delay=one_way, trace=down), 1)
    reverse = PathModel(PathConfig(delay=one_way, trace=up), 2)
    return run_recorded(timeline, forward, reverse, rtt, sender_config)


def simulated_stream(scenario: Any, seed: int, stream: int) -> dict[str, Any]:
    """``bench sim --timeline``: one stream of a scenario, Eloquent on exactly the paths ``simulate_stream``
    gives it (same seeds, same slots), every token's row."""
    from eloquent_plugins.sim.run import StreamSeeds, _initial_rtt, _paths

    seeds = StreamSeeds.derive(seed, stream)
    timeline = generate_timeline(scenario.token_model(), random.Random(seeds.timeline))
    forward, reverse = _paths(scenario.path_config(scenario.load_trace()), timeline, seeds)
    run = run_recorded(timeline, forward, reverse, _initial_rtt(scenario))
    return {"scheme": "eloquent", "scenario": scenario.label, "seed": seed, "stream": stream,
            "sim": run.rows(), "details": run.details}


def replay_tcp(generated: Sequence[float], down: Trace, up: Trace, one_way: float, rtt: float,
               rack_tlp: bool = False, config: Any = None) -> list[float]:
    """The simulator's retransmission baseline (``sim.tcp``) on a replayed drop pattern: render times of each
    token, for comparing the model's reliable stream with the real HTTP/3 stream on the same losses."""
    from eloquent_plugins.sim.link import TCP_HEADER, SimWire
    from eloquent_plugins.sim.run import _payload_sizes
    from eloquent_plugins.sim.tcp import TcpConfig, TcpSender
    from eloquent_plugins.sim.tcp_receiver import TcpReceiver

    timeline = timeline_with_times(generated)
    loop = EventLoop()
    rendered = [math.nan] * len(timeline.times)

    def render(index: int, now: float) -> None:
        if index < len(rendered) and math.isnan(rendered[index]):
            rendered[index] = now

    config = config or TcpConfig(rack_tlp=rack_tlp)
    receiver = TcpReceiver(loop, config, lambda ack: reverse.send(ack, 0, ack.option_bytes), render)
    sender = TcpSender(loop, config, rtt, lambda seg: forward.send(seg, seg.size))
    forward = SimWire(loop, PathModel(PathConfig(delay=one_way, trace=down), 1), TCP_HEADER,  # type: ignore[arg-type]
                      receiver.on_segment)
    reverse = SimWire(loop, PathModel(PathConfig(delay=one_way, trace=up), 2), TCP_HEADER,  # type: ignore[arg-type]
                      sender.on_ack)
    for index, (when, size) in enumerate(zip(timeline.times, _payload_sizes(timeline))):
        loop.at(when, sender.write, index, size)
    loop.run(timeline.times[-1] + 900.0)
    return rendered
