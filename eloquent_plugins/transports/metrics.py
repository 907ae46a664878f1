"""Prometheus metrics of the SSE path, cheap enough to update on every event.

Per-event figures are plain integer/float attributes and a bisect into fixed buckets; prometheus_client only
reads them at scrape time through a custom collector. Each middleware owns its ``CollectorRegistry`` unless it is
given the host app's (no global mutable state by default).

Every stream is counted once, by the middleware, whatever carries it: ``transport`` is ``sse`` (HTTP/1.1),
``h3-stream`` (SSE on an HTTP/3 request stream), ``datagram`` (Eloquent packets in HTTP/3 datagrams) or
``webtransport``; the HTTP/3 front end names it in the request's scope (``TRANSPORT_EXTENSION``).

Names: ``eloquent_*`` (``PREFIX``), the latency histograms labelled by ``transport``. The same figures are also
served under the names of before, ``eloquent_sse_*`` (``LEGACY_PREFIX``; histograms over every transport,
unlabelled), so existing dashboards keep working: deprecated, to go in a later release (docs/SSE.md, "Metrics").
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
METRICS_PATH = "/eloquent/metrics"
"""Where the middleware always serves its metrics, even when the app (TGI, vLLM, an upstream) owns ``/metrics``."""
TRANSPORT_EXTENSION = "eloquent.transport"
"""``scope["extensions"]`` key: how the front end carries this request's stream (see ``transport_label``)."""
TRANSPORTS = ("sse", "h3-stream", "datagram", "webtransport")

log = logging.getLogger("eloquent_plugins.transports.metrics")


def transport_label(scope: Mapping[str, Any]) -> str:
    """The ``transport`` label of a stream served for ``scope``: the front end's word, else by HTTP version."""
    named = (scope.get("extensions") or {}).get(TRANSPORT_EXTENSION)
    if named:
        return str(named)
    return "h3-stream" if scope.get("http_version") == "3" else "sse"


def h3_transport(transport: str, *, datagrams: bool) -> str:
    """The label of an HTTP/3 request's stream: ``webtransport`` (a session's stream), ``datagram`` (it asked for
    Eloquent delivery and the peer takes datagrams) or ``h3-stream``."""
    return "webtransport" if transport == "webtransport" else "datagram" if datagrams else "h3-stream"


QUIC_COUNTERS = (
    # (AdmissionStats field, metric name, help)
    ("admitted", "quic_connections_admitted", "QUIC connections created by the HTTP/3 front end's listener."),
    ("refused", "quic_connections_refused", "New QUIC connections refused (CONNECTION_REFUSED 0x2): the address "
     "held max_connections_per_address, or the listener max_connections, and none of them was idle."),
    ("evicted", "quic_connections_evicted", "Idle QUIC connections (no request) closed with H3_EXCESSIVE_LOAD "
     "(0x107) to make room for a new one under a connection cap."),
    ("idle_closed", "quic_connections_idle_closed", "QUIC connections closed (H3_NO_ERROR) after carrying no "
     "request for the idle timeout, PINGs or not."),
    ("retried", "quic_retries", "New QUIC connections answered with a stateless Retry (address validation)."),
    ("shed", "quic_handshakes_shed", "New QUIC connections dropped silently at a handshake cap."),
    ("expired", "quic_handshakes_expired", "QUIC handshakes dropped for not completing within handshake_timeout."),
    ("undecryptable", "quic_initials_undecryptable", "QUIC Initials dropped before any state: they did not "
     "decrypt."),
)
"""The listener's ``AdmissionStats`` as Prometheus counters (``eloquent_quic_*_total``)."""


def quic_families(prefix: str, front_end: Any) -> Iterator[Metric]:
    """The HTTP/3 front end's admission counters and the QUIC connections it holds now."""
    stats = front_end.admission
    for field, name, doc in QUIC_COUNTERS:
        family = CounterMetricFamily(f"{prefix}_{name}", doc)
        family.add_metric([], getattr(stats, field))
        yield family
    yield GaugeMetricFamily(f"{prefix}_quic_connections", "QUIC connections the HTTP/3 front end holds now "
                            "(handshaking or open), counted against max_connections.", value=front_end.held)


PREFIX = "eloquent"
LEGACY_PREFIX = "eloquent_sse"
"""The names of before issue 26 (every stream was ``eloquent_sse_*``, datagram ones too): kept as aliases."""
GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0)


class Histogram:
    """A lock-free histogram for one event loop: ``observe`` is a bisect and two additions (the SSE direct write,
    ``sse.event_path.EventPath.write``, does them inline per event: keep the three fields' meaning)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(float(bound)), running))
        running += self.counts[-1]
        out.append(("+Inf", running))
        return out

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        return HistogramMetricFamily(name, documentation, buckets=self.buckets(), sum_value=self.sum)

    @classmethod
    def merged(cls, parts: Sequence[Histogram], bounds: Sequence[float]) -> Histogram:
        """One histogram of several with the same bounds (the unlabelled legacy families, at scrape time)."""
        total = cls(bounds)
        for part in parts:
            total.counts = [a + b for a, b in zip(total.counts, part.counts, strict=True)]
            total.sum += part.sum
        return total


class Latency:
    """The latency histograms of one transport's streams (a producer observes its own, no lookup per event)."""

    __slots__ = ("gap", "tpot", "ttft")

    def __init__(self) -> None:
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.tpot = Histogram(LATENCY_BUCKETS)
        self.gap = Histogram(GAP_BUCKETS)


_HISTOGRAMS = (
    ("ttft", "time_to_first_token_seconds", "Request start to the first event of a stream", LATENCY_BUCKETS),
    ("tpot", "time_per_output_token_seconds", "Mean gap between events of one stream", LATENCY_BUCKETS),
    ("gap", "inter_event_gap_seconds", "Time between consecutive events from the engine", GAP_BUCKETS),
)


class StreamMetrics:
    """Counters and histograms for one middleware; ``render()`` gives the Prometheus text exposition."""

    def __init__(self, registry: CollectorRegistry | None = None, *, prefix: str = PREFIX,
                 legacy_prefix: str | None = LEGACY_PREFIX) -> None:
        self.prefix = prefix
        self.legacy_prefix = legacy_prefix
        """Also serve every family under this prefix (None: not), histograms unlabelled."""
        self.latency: dict[str, Latency] = {}
        """The latency histograms, by transport (``transport_label``)."""
        self.started: dict[str, int] = {}
        """Streams started, by transport (``transport_label``)."""
        self.streams_ended: dict[str, int] = {}
        self.active_streams = 0
        self.active_connections = 0
        self.events = 0
        self.events_merged = 0
        self.bytes_sent = 0
        self.padding_bytes = 0
        self.writes = 0
        self.keepalives = 0
        self.resumes: dict[str, int] = {}
        self.migrations: dict[str, int] = {}
        """Streams whose producer was gone, by what happened here: ``migrated`` (continued on this replica),
        ``failover`` (continued on the gateway's next upstream), ``refused`` (could not be continued: ended
        uncompleted), ``elsewhere`` (another replica took it over)."""
        self.aborts = 0
        self.errors = 0
        self.send_timeouts = 0
        self.streams_refused = 0
        self.clients_cut = 0
        self.budget_refusals = 0
        self.history_shed_bytes = 0
        self.cut_streams_shed = 0
        """Streams whose client was cut and had not resumed, dropped (engine request aborted) for the budget."""
        self.held: Callable[[], int] | None = None
        """Bytes all stream logs hold now (``StreamBudget.held``), read at scrape time."""
        self.evicted: Callable[[], int] | None = None
        """Finished streams the store dropped before their TTL (memory store), read at scrape time."""
        self.unsent: Callable[[], int] | None = None
        """Bytes the server buffers for connected clients (``StreamBudget.unsent``), read at scrape time."""
        self.drain: Any = None
        """The app's ``transports.drain.Drain`` (``Drain.attach``): readiness and drained streams, at scrape time."""
        self.bodies: Any = None
        """The ledger of incomplete request bodies (``transports.body_budget.HeldBodies``), read at scrape time."""
        self.quic: Any = None
        """The HTTP/3 front end serving this app (``Http3Server``; ``eloquent serve`` sets it): its listener's
        admission counters and the connections it holds, at scrape time."""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        try:
            self.registry.register(self)
        except ValueError as exc:  # the host's registry has these names already (a second middleware)
            log.warning("stream metrics not added to the given registry (%s); served at %s only", exc, METRICS_PATH)
            self.registry = CollectorRegistry(auto_describe=True)
            self.registry.register(self)

    @property
    def streams_started(self) -> int:
        """Streams started, every transport."""
        return sum(self.started.values())

    def latency_for(self, transport: str) -> Latency:
        latency = self.latency.get(transport)
        if latency is None:
            latency = self.latency[transport] = Latency()
        return latency

    def start(self, transport: str) -> None:
        self.started[transport] = self.started.get(transport, 0) + 1

    def resume(self, outcome: str) -> None:
        self.resumes[outcome] = self.resumes.get(outcome, 0) + 1

    def migration(self, outcome: str) -> None:
        self.migrations[outcome] = self.migrations.get(outcome, 0) + 1

    def ended(self, reason: str) -> None:
        self.streams_ended[reason] = self.streams_ended.get(reason, 0) + 1

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        yield from self._histograms()
        yield from self._families(self.prefix)
        if self.legacy_prefix is not None:
            yield from self._families(self.legacy_prefix)
        if self.quic is not None:  # new names only: no legacy alias
            yield from quic_families(self.prefix, self.quic)

    def _histograms(self) -> Iterator[Metric]:
        for attr, name, doc, bounds in _HISTOGRAMS:
            family = HistogramMetricFamily(f"{self.prefix}_{name}", f"{doc}, by transport.", labels=["transport"])
            parts = []
            for transport, latency in sorted(self.latency.items()):
                histogram = getattr(latency, attr)
                parts.append(histogram)
                family.add_metric([transport], histogram.buckets(), histogram.sum)
            yield family
            if self.legacy_prefix is not None:
                yield Histogram.merged(parts, bounds).family(f"{self.legacy_prefix}_{name}",
                                                             f"{doc}, every transport (deprecated name).")

    def _families(self, p: str) -> Iterator[Metric]:
        started = CounterMetricFamily(f"{p}_streams_started", "Streams started, by transport (sse, h3-stream, "
                                      "datagram, webtransport).", labels=["transport"])
        for transport, count in sorted(self.started.items()):
            started.add_metric([transport], count)
        yield started
        ended = CounterMetricFamily(f"{p}_streams_ended", "Streams ended, by reason.", labels=["reason"])
        for reason, count in sorted(self.streams_ended.items()):
            ended.add_metric([reason], count)
        yield ended
        for name, doc, value in (
            ("events", "Events that entered stream logs.", self.events),
            ("events_merged", "Events merged into a neighbour (merge_deltas).", self.events_merged),
            ("bytes_sent", "Body bytes written to clients, keep-alives included.", self.bytes_sent),
            ("padding_bytes", "SSE comment bytes added by --padding (on top of bytes_sent).", self.padding_bytes),
            ("writes", "Body writes to clients (coalescing makes this lower than events).", self.writes),
            ("keepalives_sent", "Keep-alive frames sent on idle streams.", self.keepalives),
            ("engine_aborts", "Engine requests aborted because their client left and did not resume.", self.aborts),
            ("engine_errors", "Engine failures after the response started (sent as in-band errors).", self.errors),
            ("send_timeouts", "Connections cut because the client accepted no bytes for send_timeout.",
             self.send_timeouts),
            ("streams_refused", "Streams refused (429) because their caller held max_streams_per_client.",
             self.streams_refused),
            ("clients_cut", "Connections cut because more than max_queued_bytes waited for a client that does not "
             "read, or the memory budget needed them (the client may resume).", self.clients_cut),
            ("budget_refusals", "Streams refused (503) because the stream logs held max_held_bytes.",
             self.budget_refusals),
            ("history_shed_bytes", "Bytes of live streams' written history dropped to stay within max_held_bytes "
             "(a resume from before them gets 410).", self.history_shed_bytes),
            ("streams_evicted", "Finished streams dropped before their TTL to stay within the store's and the "
             "memory budget's bounds.", self.evicted() if self.evicted is not None else 0),
            ("cut_streams_shed", "Streams whose client was cut (it did not read) and had not resumed, dropped to "
             "stay within max_held_bytes: engine request aborted at once, a resume gets 410.",
             self.cut_streams_shed),
        ):
            family = CounterMetricFamily(f"{p}_{name}", doc)
            family.add_metric([], value)
            yield family
        resumes = CounterMetricFamily(f"{p}_resumes", "Resume requests, by outcome.", labels=["outcome"])
        for outcome, count in sorted(self.resumes.items()):
            resumes.add_metric([outcome], count)
        yield resumes
        migrations = CounterMetricFamily(f"{p}_migrations", "Streams whose producer was gone, by outcome "
                                         "(migrated, failover, refused, elsewhere).", labels=["outcome"])
        for outcome, count in sorted(self.migrations.items()):
            migrations.add_metric([outcome], count)
        yield migrations
        yield GaugeMetricFamily(f"{p}_active_streams", "Streams whose engine request is running here.",
                                value=self.active_streams)
        yield GaugeMetricFamily(f"{p}_active_connections", "Client connections being served.",
                                value=self.active_connections)
        yield GaugeMetricFamily(f"{p}_bytes_held", "Bytes the stream logs hold now: replay history, events queued "
                                "for clients, finished streams kept for resume, incomplete request bodies.",
                                value=self.held() if self.held is not None else 0)
        yield GaugeMetricFamily(f"{p}_bytes_unsent", "Bytes the server buffers for connected clients, written and "
                                "not yet taken by the kernel (part of the memory budget's count).",
                                value=self.unsent() if self.unsent is not None else 0)

        bodies = self.bodies
        if bodies is not None:
            yield GaugeMetricFamily(f"{p}_request_bytes_held", "Bytes held for incomplete request bodies and "
                                    "WebTransport request heads, a reserve per request included (part of bytes_held).",
                                    value=bodies.held)
            refused = CounterMetricFamily(f"{p}_request_bodies_refused", "Incomplete requests refused, by reason: "
                                          "too_large (max_request_bytes), connection / address (their ceilings), "
                                          "budget (the share of max_held_bytes), too_slow (under body_min_rate), "
                                          "stalled (body_timeout).", labels=["reason"])
            for reason, count in bodies.refused.items():
                refused.add_metric([reason], count)
            yield refused
        drain = self.drain
        if drain is not None:
            yield GaugeMetricFamily(f"{p}_ready", "1 while this replica takes new streams, 0 once it drains.",
                                    value=0 if drain.draining else 1)
            drained = CounterMetricFamily(f"{p}_drain_streams", "Streams in flight when a drain began, by how they "
                                          "ended: completed (before the deadline) or handed_over (at it: the "
                                          "store was told the producer is gone, the client was cut to resume "
                                          "elsewhere).", labels=["outcome"])
            drained.add_metric(["completed"], drain.completed)
            drained.add_metric(["handed_over"], drain.handed_over)
            yield drained
            refused = CounterMetricFamily(f"{p}_drain_refused", "New requests refused (503) while draining.")
            refused.add_metric([], drain.refused)
            yield refused

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
