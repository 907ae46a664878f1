"""Turning the app's SSE body into the stream log: one ``StreamEvent`` per engine event, each given an id.

The common case (one ``data: ...\\n\\n`` event per body chunk, as vLLM and Starlette apps write) is handled by a
few C-level byte checks; anything else (several events per chunk, split events, ``event:`` fields, CRLF) goes
through the full incremental parser. Comments from the app are dropped: the middleware sends its own
keep-alives. The id line, the log append and the timing figures are the stream's ``event_path.EventPath``, which
also logs the common case itself, inline, while a client is caught up (``EventPath.write``): the per-event path
is then one coroutine, and this class is not on it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.sse_reader import SSEParser, one_data_line
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.event_path import EventPath

if TYPE_CHECKING:
    from collections.abc import Callable

_BLANK_ENDINGS = (b"\n\n", b"\r\n\r\n", b"\r\r")


class Producer:
    __slots__ = ("log", "hooks", "codec", "metrics", "path", "_parser", "clean", "_observe", "_id", "plain",
                 "latency")

    def __init__(self, log: StreamLog, *, token: str | None, hooks: StreamHooks, codec: Codec,
                 metrics: StreamMetrics, started: float, clock: Callable[[], float] = time.monotonic,
                 transport: str = "sse") -> None:
        self.log = log
        """A new, empty log: event n of the stream is the log's index n (``log.next_index`` is the next id)."""
        self.hooks = hooks
        self.codec = codec
        self.metrics = metrics
        self._id = token is not None
        self.latency = metrics.latency_for(transport)
        """This stream's transport's histograms (``StreamMetrics.latency``)."""
        self.path = EventPath(log, token=token, metrics=metrics, latency=self.latency, started=started, clock=clock)
        """Where every event goes: its id line, the log append, the timing figures (and the direct write)."""
        self._parser: SSEParser | None = None
        self.clean = True
        """The app's body so far ended on an event boundary (no partial event in the parser)."""
        self._observe = hooks.active
        self.plain = False
        """Set at the first event when no plugin sees events and the stream has ids: with ``clean``, what lets the
        event path log a one-line ``data:`` chunk itself (``EventPath.inline``)."""

    @property
    def events(self) -> int:
        return self.log.next_index

    @property
    def max_gap(self) -> float:
        """The largest gap between two events so far (seconds): the stream's worst stall at the source."""
        return self.path.max_gap

    def figures(self) -> dict[str, Any]:
        """What the stream's span records at its end: events, time to first event, largest and mean gap."""
        path, events = self.path, self.log.next_index
        first = path.first
        return {"events": events, "ttft": None if first is None else first - path.started,
                "max_gap": path.max_gap,
                "tpot": (path.last - first) / (events - 1) if first is not None and events > 1 else None}

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
        self.path.inline = self.plain and self.clean

    def _event(self, payload: bytes | None, event: str | None, frame: bytes | None) -> None:
        """Log one event. ``payload`` None: ``frame`` is one ``data: PAYLOAD\\n\\n`` line, sliced only if a plugin
        wants the payload (per event: the common case builds nothing but the id line)."""
        if self._observe:
            if payload is None:
                payload = frame[6:-2]  # type: ignore[index]
            out = self.hooks.event(StreamEvent(self.log.next_index, payload))
            if out.payload is not payload:
                payload, frame = out.payload, None
        if frame is None:
            frame = format_event(payload, event=event)  # type: ignore[arg-type]
        path = self.path
        if path.first is None:
            self.plain = self._id and not self._observe
            path.inline = self.plain and self.clean
        path.add(frame)

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
        events, first = self.log.next_index, self.path.first
        if first is not None and events > 1:
            self.latency.tpot.observe((self.path.last - first) / (events - 1))
        self.log.close(reason)
