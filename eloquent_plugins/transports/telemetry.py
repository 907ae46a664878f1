"""OpenTelemetry: one span per stream, whatever carries it (``pip install 'eloquent-plugins[otel]'``).

The span ``eloquent.stream`` starts with the stream and ends with it; it carries the stream's transport, route,
codec and correlation id, an event per client connection (the first, and each resume), and at the end its reason,
event count, resumes and stall figures (time to first event, largest gap between events, mean gap). A resume
served by a replica that did not produce the stream gets its own span ``eloquent.resume`` with the same
``eloquent.stream_id``.

Spans go wherever the process's tracer provider sends them. Nothing is configured here unless asked:
``configure_from_env()`` (called by ``eloquent serve``) installs the SDK's provider when ``OTEL_TRACES_EXPORTER``
is ``console`` or ``otlp`` and no provider is set yet. Without ``opentelemetry-api`` every call here is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

try:  # optional dependency: the [otel] extra
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the installation
    _trace = None

log = logging.getLogger("eloquent_plugins.transports.telemetry")

TRACER_NAME = "eloquent_plugins"
STREAM_SPAN = "eloquent.stream"
RESUME_SPAN = "eloquent.resume"


def tracer() -> Any:
    """The package's tracer, or None without ``opentelemetry-api``."""
    return _trace.get_tracer(TRACER_NAME) if _trace is not None else None


class StreamSpan:
    """The span of one stream; every method is cheap and safe to call when tracing is off (``span`` None)."""

    __slots__ = ("span", "resumes")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.resumes = 0

    @classmethod
    def start(cls, tracer_: Any, *, stream_id: str, transport: str, route: str, codec: str,
              resumable: bool) -> StreamSpan:
        if tracer_ is None:
            return cls(None)
        span = tracer_.start_span(STREAM_SPAN, attributes={
            "eloquent.stream_id": stream_id, "eloquent.transport": transport, "http.route": route,
            "eloquent.codec": codec, "eloquent.resumable": resumable})
        span.add_event("connection", {"eloquent.resume_after": -1})
        return cls(span)

    def resumed(self, after: int, transport: str) -> None:
        """A client reconnected and reads the events after ``after`` (over ``transport``)."""
        self.resumes += 1
        if self.span is not None:
            self.span.add_event("resume", {"eloquent.resume_after": after, "eloquent.transport": transport})

    def end(self, reason: str, *, events: int, ttft: float | None, max_gap: float, tpot: float | None) -> None:
        span = self.span
        if span is None:
            return
        attributes: dict[str, Any] = {"eloquent.end_reason": reason, "eloquent.events": events,
                                      "eloquent.resumes": self.resumes, "eloquent.max_gap_s": max_gap}
        if ttft is not None:
            attributes["eloquent.ttft_s"] = ttft
        if tpot is not None:
            attributes["eloquent.tpot_s"] = tpot
        span.set_attributes(attributes)
        span.end()
        self.span = None


def migration_event(span: Any, *, at: int, outcome: str, engine: str, reason: str = "") -> None:
    """A stream continued elsewhere (``transports.sse.migrate``, the gateway's failover): an event on its span
    (``StreamSpan.span`` or a resume span; None when tracing is off)."""
    if span is not None:
        span.add_event("migration", {"eloquent.migration_at": at, "eloquent.migration_outcome": outcome,
                                     "eloquent.migration_engine": engine, "eloquent.migration_reason": reason})


def resume_span(tracer_: Any, *, stream_id: str, after: int, transport: str) -> Any:
    """A resume on a replica that has no span of the stream: its own short span (None when tracing is off)."""
    if tracer_ is None:
        return None
    return tracer_.start_span(RESUME_SPAN, attributes={
        "eloquent.stream_id": stream_id, "eloquent.resume_after": after, "eloquent.transport": transport})


def configure_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's tracer provider with the exporter ``OTEL_TRACES_EXPORTER`` names (``console``, or
    ``otlp``: needs ``opentelemetry-exporter-otlp``, which reads ``OTEL_EXPORTER_OTLP_ENDPOINT``). Does nothing
    (False) when the variable is unset or ``none``, or a provider is already installed (e.g. by
    ``opentelemetry-instrument``). One warning line when it cannot."""
    env = os.environ if env is None else env
    name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not name or name == "none":
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER=%s but opentelemetry-sdk is not installed: pip install "
                    "'eloquent-plugins[otel]'; no spans are exported", name)
        return False
    assert _trace is not None
    if type(_trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return False  # someone configured tracing already: theirs wins
    if name == "console":
        exporter: Any = ConsoleSpanExporter()
    elif name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http; no spans are "
                        "exported")
            return False
        exporter = OTLPSpanExporter()
    else:
        log.warning("OTEL_TRACES_EXPORTER=%s is not one eloquent serve sets up (console, otlp); no spans are "
                    "exported", name)
        return False
    service = env.get("OTEL_SERVICE_NAME", "eloquent")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _trace.set_tracer_provider(provider)
    return True
