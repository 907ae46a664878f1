"""Turning the app's SSE body into the stream log: one ``StreamEvent`` per engine event, each given an id.

The common case (one ``data: ...\\n\\n`` event per body chunk, as vLLM and Starlette apps write) is handled by a
few C-level byte checks; anything else (several events per chunk, split events, ``event:`` fields, CRLF) goes
through the full incremental parser. Comments from the app are dropped: the middleware sends its own
keep-alives. While a client is caught up, ``Connection.write_direct`` logs the common case itself, inline (see
``Producer.plain``): the per-event path is then one coroutine.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.protocol import format_event_id
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.sse_reader import SSEParser, one_data_line
from eloquent_plugins.transports.resume.log import StreamLog

if TYPE_CHECKING:
    from collections.abc import Callable

_join = b"".join
_BLANK_ENDINGS = (b"\n\n", b"\r\n\r\n", b"\r\r")
ID_ENDS = tuple(b"%d\n" % index for index in range(4096))
"""The end of event n's id line (``n\\n``) for the first 4096 events (~180 KiB per process, built once): a frame
is then one ``join`` of three bytes objects, 0.1 us less per event than formatting the integer."""


def id_end(index: int) -> bytes:
    return ID_ENDS[index] if index < 4096 else b"%d\n" % index


class Producer:
    __slots__ = ("log", "hooks", "codec", "metrics", "id_prefix", "_parser", "clean", "_first", "last", "_started",
                 "_observe", "clock", "_id", "plain", "gaps", "max_gap", "latency")

    def __init__(self, log: StreamLog, *, token: str | None, hooks: StreamHooks, codec: Codec,
                 metrics: StreamMetrics, started: float, clock: Callable[[], float] = time.monotonic,
                 transport: str = "sse") -> None:
        self.log = log
        """A new, empty log: event n of the stream is the log's index n (``log.next_index`` is the next id)."""
        self.hooks = hooks
        self.codec = codec
        self.metrics = metrics
        self._id = token is not None
        self.id_prefix = b"id: " + format_event_id(token, 0).encode()[:-1] if token is not None else b""
        """Event n's id line is this prefix + ``id_end(n)``: ``format_event_id`` with the index cut off."""
        self._parser: SSEParser | None = None
        self.clean = True
        """The app's body so far ended on an event boundary (no partial event in the parser)."""
        self._first: float | None = None
        self.last = 0.0
        """``clock()`` at the latest event."""
        self._started = started
        self._observe = hooks.active
        self.plain = False
        """Set from the second event on when no plugin sees events and the stream has ids. Then
        ``Connection.write_direct`` logs a one-line ``data:`` chunk for a caught-up client itself, inline
        (``_event``'s common case without its branches): it reads and updates ``last``, ``max_gap``, ``gaps``
        and the metrics here, which are public for that reason."""
        self.latency = metrics.latency_for(transport)
        """This stream's transport's histograms (``StreamMetrics.latency``)."""
        self.gaps = self.latency.gap
        """The gaps between events (``Latency.gap``)."""
        self.clock = clock
        self.max_gap = 0.0
        """The largest gap between two events so far (seconds): the stream's worst stall at the source."""

    @property
    def events(self) -> int:
        return self.log.next_index

    def figures(self) -> dict[str, Any]:
        """What the stream's span records at its end: events, time to first event, largest and mean gap."""
        first, events = self._first, self.log.next_index
        return {"events": events, "ttft": None if first is None else first - self._started,
                "max_gap": self.max_gap,
                "tpot": (self.last - first) / (events - 1) if first is not None and events > 1 else None}

    def feed(self, body: bytes) -> None:
        """One body chunk from the app."""
        if self.clean and one_data_line(body):
            self._event(None, None, body)
            return
        if self.clean and body.startswith(b":") and body.endswith(b"\n\n") and body.count(b"\n") == 2:
            return  # the app's own keep-alive comment
        parser = self._parser
        if parser is None:
            parser = self._parser = SSEParser()
        for message in parser.feed(body):
            event = message.event if message.event != "message" else None
            frame = format_event(message.data, event=event, retry=message.retry) if message.retry is not None else None
            self._event(message.data.encode(), event, frame)
        self.clean = body.endswith(_BLANK_ENDINGS)

    def _event(self, payload: bytes | None, event: str | None, frame: bytes | None) -> None:
        """Log one event. ``payload`` None: ``frame`` is one ``data: PAYLOAD\\n\\n`` line, sliced only if a plugin
        wants the payload (per event: the common case builds nothing but the id line)."""
        index = self.log.next_index
        if self._observe:
            if payload is None:
                payload = frame[6:-2]  # type: ignore[index]
            out = self.hooks.event(StreamEvent(index, payload))
            if out.payload is not payload:
                payload, frame = out.payload, None
        if frame is None:
            frame = format_event(payload, event=event)  # type: ignore[arg-type]
        if self._id:
            frame = _join((self.id_prefix, id_end(index), frame))
        now = self.clock()
        if self._first is None:
            self._first = now
            self.latency.ttft.observe(now - self._started)
            self.plain = self._id and not self._observe
        else:
            gap = now - self.last
            self.gaps.observe(gap)
            if gap > self.max_gap:
                self.max_gap = gap
        self.last = now
        self.metrics.events += 1
        self.log.append(frame)

    def fail(self, error: BaseException, *, message: str | None = None) -> None:
        """An engine failure after the response started: in-band error event(s) in the endpoint's format."""
        text = message if message is not None else (str(error) or type(error).__name__)
        payloads = (self.codec.error_payload(text, error_type=type(error).__name__, status=500),
                    *self.codec.end_payloads())
        self.metrics.errors += 1
        self.hooks.error(error)
        for payload in payloads:
            self._event(payload, None, None)
        self.close("error")

    def close(self, reason: str) -> None:
        if self.log.closed:
            return
        events = self.log.next_index
        if self._first is not None and events > 1:
            self.latency.tpot.observe((self.last - self._first) / (events - 1))
        self.log.close(reason)
