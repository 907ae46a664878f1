"""The per-connection datagram scheduler (sans-I/O): which Eloquent streams send what, and when.

The connection tells it the clock and the room the congestion controller leaves; it answers with a ``Plan``:
reliable-stream steps in stream order (fallback records, stalled streams to cancel, finished streams to end)
and the datagrams to hand to aioquic now. Packets are pulled from a stream's sender only when there is room,
and what was pulled but does not fit waits in ``DatagramQueue`` (one run per stream, see there), so aioquic's
unbounded DATAGRAM queue never holds a stale backlog.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.varint import varint_size
from eloquent_plugins.transports.http3.datagram_queue import DatagramQueue


class StepKind(Enum):
    FALLBACK = "fallback"
    """Write ``data`` (the fallback record) on the request stream and end it."""
    STALLED = "stalled"
    """No ack progress for ``ack_timeout``: reset the request stream, the client is gone."""
    FINISHED = "finished"
    """Every event acked: end the request stream."""


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    stream_id: int
    data: bytes = b""


@dataclass(slots=True)
class Plan:
    steps: list[Step] = field(default_factory=list)
    """In stream order; each step's stream has already left the scheduler."""
    datagrams: list[tuple[int, bytes]] = field(default_factory=list)
    probe: bool = False
    """Mark a QUIC probe so these datagrams may exceed the full congestion window."""


BLOCKED_RETRY = 0.01
"""Seconds between plans while the window keeps a due send back (``wake_at``)."""


def fits(stream_id: int, datagram: bytes, peer_limit: int) -> bool:
    """Whether the HTTP/3 datagram (quarter stream id + packet) fits the peer's DATAGRAM frame limit."""
    return len(datagram) + varint_size(stream_id // 4) <= peer_limit


class DatagramScheduler:
    def __init__(self, probe_size: int) -> None:
        self.probe_size = probe_size
        """Room granted to a due probe when the window is full (one datagram budget)."""
        self.streams: dict[int, EloquentResponseStream] = {}
        self.queue = DatagramQueue()
        self._marks: dict[int, int] = {}
        """Per trailed stream awaiting its path: the first packet number sent after its trailer."""

    def add(self, stream: EloquentResponseStream) -> None:
        self.streams[stream.stream_id] = stream

    def get(self, stream_id: int) -> EloquentResponseStream | None:
        return self.streams.get(stream_id)

    def drop(self, stream_id: int) -> bool:
        """Forget a stream (and its parked datagrams); True when it was live."""
        self.queue.discard(stream_id)
        self._marks.pop(stream_id, None)
        return self.streams.pop(stream_id, None) is not None

    def clear(self) -> None:
        self.streams.clear()

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self.streams

    def __iter__(self) -> Iterator[EloquentResponseStream]:
        return iter(self.streams.values())

    def direct(self, stream_id: int, now: float, room: int) -> list[tuple[int, bytes]] | None:
        """The app pushed events on ``stream_id``: its datagrams, to go out before anything else is planned, when
        nothing is parked, the window has room for all of them and the stream is not due for a fallback or a
        stall cut. None: use ``plan``. The caller runs ``plan`` after the send (timers, the other streams), so the
        token's packet does not wait for bookkeeping (issue 19: work before the send is render latency)."""
        stream = self.streams.get(stream_id)
        if stream is None or room <= 0 or self.queue or stream.fallback_due(now) or stream.stalled(now):
            return None
        datagrams = stream.datagrams_to_send(now)
        if sum(map(len, datagrams)) > room:  # over the window: parked like plan does, plan releases what fits
            self.queue.put(stream_id, datagrams, supersede=stream.supersede)
            return None
        return [(stream_id, d) for d in datagrams]

    def note_path(self, now: float, next_packet: int, largest_acked: int) -> None:
        """The connection's packet numbers: a trailed stream's fallback clock starts once the peer acknowledged a
        packet numbered at or above the first one sent after its trailer (``path_delivered``)."""
        for stream_id, stream in self.streams.items():
            if stream.awaiting_path:
                if largest_acked >= self._marks.setdefault(stream_id, next_packet):
                    stream.path_delivered(now)

    def plan(self, now: float, room: int, *, transport_queue_empty: bool) -> Plan:
        """What to do now. ``room``: bytes the congestion controller would let out, minus aioquic's queue."""
        plan = Plan()
        if room <= 0 and transport_queue_empty and any(
                (d := s.next_deadline()) is not None and d <= now for s in self.streams.values()):
            # A stream's probe is due but the window is full: after an outage aioquic only learns that its
            # packets are lost when its own (exponentially backed-off) probe is answered, seconds later.
            # RFC 9002 section 7 lets a probe exceed the window; ours goes out now, in one packet.
            plan.probe = True
            room = self.probe_size
        for stream_id, stream in list(self.streams.items()):
            if stream.fallback_due(now):
                plan.steps.append(Step(StepKind.FALLBACK, stream_id, stream.fallback_record()))
                self.drop(stream_id)
                continue
            if stream.stalled(now):
                plan.steps.append(Step(StepKind.STALLED, stream_id))
                self.drop(stream_id)
                continue
            if room > 0:
                self.queue.put(stream_id, stream.datagrams_to_send(now), supersede=stream.supersede)
            if stream.finished:
                plan.steps.append(Step(StepKind.FINISHED, stream_id))
                self.drop(stream_id)
        if room > 0 and self.queue:
            plan.datagrams = self.queue.take(room)
        return plan

    def next_deadline(self) -> float | None:
        deadlines = [d for s in self.streams.values() if (d := s.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def wake_at(self, planned_at: float) -> float | None:
        """When the plan should run again after one ran at ``planned_at``: the next deadline, but a deadline that
        plan left past due (a send the full window kept back while aioquic still holds datagrams; fallbacks and
        stalls never wait) only ``BLOCKED_RETRY`` later. The ack that opens the window runs the plan anyway; a
        timer at the past deadline re-ran it on every turn of the loop, about every 0.5 ms, for nothing."""
        deadline = self.next_deadline()
        if deadline is not None and deadline <= planned_at:
            return planned_at + BLOCKED_RETRY
        return deadline
