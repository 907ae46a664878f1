"""One request's Eloquent delivery on the server (sans-I/O): the SSE body in, datagrams and control records
out. The transport feeds it the app's body bytes, the client's datagrams and the clock.

Each SSE message's data field becomes one event payload; the end of the body becomes the final END event (an
app exception: an ERROR event). The trailer (count, digest, final event) goes on the reliable stream at once;
if the client's acks have not covered the stream ``fallback_after`` seconds later, the missing events follow
on the reliable stream too and the stream ends there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.codecs.openai import OpenAICodec
from eloquent_plugins.core.errors import LimitExceeded
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.core.sse_reader import SSEParser, one_data_line
from eloquent_plugins.core.wire import AckPacket, decode_packet
from eloquent_plugins.core.control import StreamDigest, Trailer, encode_fallback, encode_trailer

ACK_SLACK = 16
"""Acks a client may send beyond one per datagram it was sent (flood guard)."""
_OPENAI = OpenAICodec()


class ResponseState(Enum):
    """One response's delivery lifecycle (docs/PROTOCOL.md, section 8)."""

    STREAMING = "streaming"
    """The app's body is still coming: events are pushed and sent as datagrams."""
    TRAILED = "trailed"
    """The body ended and the trailer went on the reliable stream; datagrams (tail probes) go on until every
    event is acked, or ``fallback_after`` seconds pass."""
    ACKED = "acked"
    """Every event, the final one included, was acked after the trailer: nothing more goes out."""
    FALLEN_BACK = "fallen_back"
    """The unacked events were written on the reliable stream: no more datagrams."""


class EloquentResponseStream:
    def __init__(self, stream_id: int, config: SenderConfig, *, now: float, fallback_after: float = 1.0,
                 ack_timeout: float = 30.0, supersede: bool = True, tail_repeats: int = 1,
                 tail_gap: float = 0.01, codec: Codec | None = None, confirm_path: bool = False) -> None:
        """``codec`` shapes the in-band error of ``fail`` (the route's codec; OpenAI's when None).
        ``confirm_path``: the transport calls ``path_delivered`` once its peer acknowledged a packet sent after the
        trailer, and the fallback clock starts there, not at the trailer (docs/PROTOCOL.md, section 8)."""
        self.stream_id = stream_id
        self.codec: Codec = codec if codec is not None else _OPENAI
        self.sender = EloquentSender(stream_id, config, now=now)
        self.supersede = supersede
        self.fallback_after = fallback_after
        self.ack_timeout = ack_timeout
        limits = config.limits
        self._parser = SSEParser(max_message_bytes=limits.max_event_bytes + 4096)
        self._digest = StreamDigest()
        self._log: deque[StreamEvent] = deque()
        self.state = ResponseState.STREAMING
        self._confirm_path = confirm_path
        self._fallback_from: float | None = None
        """When the fallback clock started (TRAILED): the trailer, or with ``confirm_path`` the moment the path was
        seen delivering after it; None while it has not."""
        self._tail_gap = tail_gap
        self._tail_repeats = tail_repeats
        self._tail_due: list[float] = []
        self._last_progress = now
        self._acked = 0
        self.datagrams_sent = 0
        self.acks = 0
        self.generated: list[float] = []

    # ---- app side ----------------------------------------------------------------------------------------
    def feed_body(self, chunk: bytes, now: float,
                  transform: Callable[[int, bytes], bytes] | None = None) -> int:
        """Cut the body into SSE messages and push each data field as an event; returns how many.
        ``transform(index, payload)`` may replace each payload first (the per-event plugin hooks)."""
        parser = self._parser
        # The common chunk, one ASCII ``data:`` line and its blank line (an engine's token): its payload is the
        # line's bytes; the parser would decode them, build a message and encode them again (render latency:
        # this runs before the token's packet leaves, docs/results/e2e-vs-sim.md).
        if parser.idle and one_data_line(chunk) and chunk.isascii():
            payload = chunk[6:-2]
            if transform is not None:
                payload = transform(self.sender.next_index, payload)
            self._push(payload, now, EventKind.DATA)
            return 1
        messages = parser.feed(chunk)
        for message in messages:
            payload = message.data.encode("utf-8")
            if transform is not None:
                payload = transform(self.sender.next_index, payload)
            self._push(payload, now, EventKind.DATA)
        return len(messages)

    def _push(self, payload: bytes, now: float, kind: EventKind) -> StreamEvent:
        if len(payload) > self.sender.config.limits.max_event_bytes:
            raise LimitExceeded(f"event of {len(payload)} bytes above max_event_bytes")
        if not self._log:
            self._last_progress = now  # the ack clock starts when there is something to ack
        event = self.sender.push(payload, now, kind)
        self._digest.update(payload)
        self._log.append(event)
        if kind is EventKind.DATA:
            self.generated.append(now)
        return event

    def finish(self, now: float) -> bytes:
        """The body ended: push END and return the trailer record for the reliable stream."""
        return self._close(self._push(b"", now, EventKind.END), now)

    def fail(self, message: str, now: float) -> bytes:
        """The app failed after the response started: an in-band ERROR event in the route codec's shape."""
        payload = self.codec.error_payload(message, error_type="InternalServerError", status=500)
        return self._close(self._push(payload, now, EventKind.ERROR), now)

    def _close(self, final: StreamEvent, now: float) -> bytes:
        self.state = ResponseState.TRAILED
        self._fallback_from = None if self._confirm_path else now
        # Tail protection: the last packet has no successor to carry its events, so the final run goes out
        # again ``tail_gap`` apart (a few ms decorrelates it from a loss burst) unless acked by then.
        self._tail_due = [now + self._tail_gap * k for k in range(1, self._tail_repeats + 1)]
        return encode_trailer(Trailer(self._digest.count, self._digest.hexdigest(), final))

    @property
    def ended(self) -> bool:
        return self.state is not ResponseState.STREAMING

    @property
    def awaiting_path(self) -> bool:
        """Trailed, and the fallback clock waits for the transport's ``path_delivered``."""
        return self.state is ResponseState.TRAILED and self._fallback_from is None

    def path_delivered(self, now: float) -> None:
        """The peer acknowledged a packet sent after the trailer: the path delivers again, so from now on events
        still unacked after ``fallback_after`` are the datagrams' failure, not the path's. While the path is down
        or its queue holds seconds, the fallback record would only wait behind the same window, in several
        packets and in order, where each probe carries the whole run in one (docs/results/real-links.md, 10)."""
        if self.awaiting_path:
            self._fallback_from = now

    @property
    def fallback_sent(self) -> bool:
        return self.state is ResponseState.FALLEN_BACK

    # ---- client side -------------------------------------------------------------------------------------
    def receive_datagram(self, data: bytes, now: float) -> None:
        """An ack from the client. Raises ProtocolError for garbage, lies and floods."""
        packet = decode_packet(data, self.sender.config.limits)
        self.acks += 1
        if self.acks > self.datagrams_sent + ACK_SLACK:
            raise LimitExceeded(f"stream {self.stream_id}: {self.acks} acks for {self.datagrams_sent} datagrams")
        if not isinstance(packet, AckPacket):
            self.sender.receive_datagram(data, now)  # raises the sender's ProtocolViolation
            return
        self.sender.receive_ack(packet, now)
        if self.sender.acked > self._acked:
            self._acked = self.sender.acked
            self._last_progress = now
            while self._log and self._log[0].index < self._acked:
                self._log.popleft()
        if self.state is ResponseState.TRAILED and self.sender.done:
            self.state = ResponseState.ACKED

    # ---- output ------------------------------------------------------------------------------------------
    def datagrams_to_send(self, now: float) -> list[bytes]:
        if self.state is ResponseState.FALLEN_BACK:
            return []
        if self._tail_due and now >= self._tail_due[0]:
            while self._tail_due and now >= self._tail_due[0]:
                self._tail_due.pop(0)
            self.sender.probe()
        datagrams = self.sender.datagrams_to_send(now)
        self.datagrams_sent += len(datagrams)
        return datagrams

    @property
    def _fallback_at(self) -> float | None:
        """When the fallback record is due (TRAILED, its clock started); None otherwise."""
        start = self._fallback_from
        if self.state is not ResponseState.TRAILED or start is None:
            return None
        return start + self.fallback_after

    def fallback_due(self, now: float) -> bool:
        due = self._fallback_at
        return due is not None and now >= due

    def fallback_record(self) -> bytes:
        """The unacked events for the reliable stream; after this the stream needs no more datagrams."""
        self.state = ResponseState.FALLEN_BACK
        return encode_fallback(list(self._log))

    def stalled(self, now: float) -> bool:
        """Events have waited ``ack_timeout`` without any ack progress: the client is gone."""
        return (bool(self._log) and self.state is not ResponseState.FALLEN_BACK
                and now - self._last_progress > self.ack_timeout)

    def next_deadline(self) -> float | None:
        if self.state is ResponseState.FALLEN_BACK:
            return None
        best = self.sender.next_deadline()
        for deadline in (self._tail_due[0] if self._tail_due and not self.sender.done else None,
                         self._fallback_at,
                         self._last_progress + self.ack_timeout if self._log else None):
            if deadline is not None and (best is None or deadline < best):
                best = deadline
        return best

    @property
    def finished(self) -> bool:
        """Nothing more will go out: everything acked after the trailer, or the fallback was written."""
        return self.state in (ResponseState.ACKED, ResponseState.FALLEN_BACK)
