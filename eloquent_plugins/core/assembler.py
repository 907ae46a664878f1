"""Client side of an Eloquent response (sans-I/O): datagrams and the reliable stream's control records in,
renderable events out, in order, each once, with the stream digest checked at the end.

Two sources feed one in-order log: the core receiver (datagrams) and the control records (the trailer's final
event, a fallback run). Whichever delivers an index first renders it. Acks only ever reflect what datagrams
delivered, so the server's sender never sees an ack for an event it has not sent as a datagram.

A stream that ends short, or whose digest does not match, raises ``core.errors.IncompleteStream``; the client
(``eloquent_client``) re-raises it as its own ``IncompleteStream``, which is also a ``ClientError``.
"""

from __future__ import annotations

from eloquent_plugins.core.control import ControlParser, Fallback, StreamDigest, Trailer
from eloquent_plugins.core.errors import IncompleteStream, LimitExceeded
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig

HELD_OVERHEAD = 128
"""Bytes counted per held event besides its payload (the objects around it): empty events are not free."""


def _held(event: StreamEvent) -> int:
    return len(event.payload) + HELD_OVERHEAD


class EloquentAssembler:
    def __init__(self, stream_id: int, limits: Limits | None = None) -> None:
        limits = limits or Limits()
        self.receiver = EloquentReceiver(stream_id, ReceiverConfig(limits=limits))
        self.control = ControlParser(max_record_bytes=limits.max_buffered_bytes * 2)
        self.trailer: Trailer | None = None
        self.fallback_events = 0
        self._next = 0
        self._pending: dict[int, StreamEvent] = {}
        self._pending_bytes = 0
        self._max_pending = limits.max_buffered_bytes
        """Ceiling on the payload bytes of control-record events held until their turn (out of order)."""
        self._digest = StreamDigest()
        self._final: StreamEvent | None = None

    def on_datagram(self, data: bytes, now: float) -> list[StreamEvent]:
        """Raises ProtocolError for a packet the server should never have sent."""
        return self._render(self.receiver.receive_datagram(data, now))

    def on_control(self, data: bytes) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for record in self.control.feed(data):
            if isinstance(record, Trailer):
                if self.trailer is not None:
                    raise IncompleteStream("two trailers on one stream")
                self.trailer = record
                self._stash([record.final])
            elif isinstance(record, Fallback):
                self.fallback_events += len(record.events)
                self._stash(list(record.events))
            out += self._drain()
        self._check()
        return out

    def acks(self, now: float) -> list[bytes]:
        return self.receiver.datagrams_to_send(now)

    def _stash(self, events: list[StreamEvent]) -> None:
        """Hold control-record events until their turn: none after the final event (nothing can come after it),
        none past the trailer's final index, and at most ``max_buffered_bytes`` of them (``LimitExceeded``), so
        a server that sends fallback records forever cannot make the client hold them forever."""
        last = self.trailer.final.index if self.trailer is not None else None
        for event in events:
            if event.index < self._next or self._final is not None or (last is not None and event.index > last):
                continue
            old = self._pending.get(event.index)
            self._pending_bytes += _held(event) - (_held(old) if old is not None else 0)
            self._pending[event.index] = event
        if self._pending_bytes > self._max_pending:
            raise LimitExceeded(f"control records hold {self._pending_bytes} bytes of events out of order "
                                f"(limit {self._max_pending})")

    def _render(self, events: list[StreamEvent]) -> list[StreamEvent]:
        out = [e for e in events if e.index >= self._next and self._final is None]
        for event in out:
            self._take(event)
        out += self._drain()
        self._check()
        return out

    def _drain(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        while self._final is None and self._next in self._pending:
            event = self._pending[self._next]  # popped (and uncounted) by _take
            self._take(event)
            out.append(event)
        return out

    def _take(self, event: StreamEvent) -> None:
        self._digest.update(event.payload)
        self._next = event.index + 1
        held = self._pending.pop(event.index, None)
        if held is not None:
            self._pending_bytes -= _held(held)
        if event.kind is not EventKind.DATA:
            self._final = event

    def _check(self) -> None:
        if self._final is None or self.trailer is None:
            return
        if self._digest.count != self.trailer.count or self._digest.hexdigest() != self.trailer.sha256:
            raise IncompleteStream(f"stream digest mismatch: got {self._digest.count} events, trailer says "
                                   f"{self.trailer.count}")

    @property
    def complete(self) -> bool:
        """The final event is rendered and the trailer confirmed every event."""
        return self._final is not None and self.trailer is not None

    @property
    def final(self) -> StreamEvent | None:
        return self._final

    def on_stream_end(self) -> None:
        self.control.close()
        if not self.complete:
            missing = "no trailer" if self.trailer is None else f"events from {self._next} missing"
            raise IncompleteStream(f"the response stream ended before the stream was complete ({missing})")
