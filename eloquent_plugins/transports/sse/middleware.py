"""``EloquentMiddleware``: robust SSE for any ASGI app (vLLM via ``--middleware``, TGI/Triton gateways, ...).

A pure ASGI middleware. It acts only on ``200 text/event-stream`` responses; everything else passes through byte
for byte, and requests with ``eloquent-transport: datagram`` are not touched at all unless they came over HTTP/3 (the
front end hosting this app delivers their stream as datagrams, indexed as the ids here, so that a client can resume
it by index, over HTTP/3 or SSE). For a stream it:

* starts the response at once and sends an SSE comment after each idle ``keepalive`` interval, with headers that
  stop proxies from buffering (``Cache-Control: no-cache``, ``X-Accel-Buffering: no``) and no hop-by-hop ones;
* gives every event an ``id: <token>:<index>`` and keeps the events in a replay store, so a client that
  reconnects with ``Last-Event-ID`` (header, or ``?last_event_id=`` for POST/fetch clients; empty: no id, a new
  request, as in the SSE spec) gets exactly the
  events after it, then the live tail, without a second engine request. Only the caller that started the stream
  may resume it (``identity``, by default a hash of its Authorization / X-API-Key / Api-Key headers);
* decouples the engine from the client: events queued for a slow client go out in one write (optionally with
  OpenAI text deltas merged); a client that leaves and does not come back within ``resume_grace`` seconds still
  aborts the engine request, because the app is shown the client's ``http.disconnect`` then;
* turns an exception from the app after the 200 into an in-band error event in the route's own format;
* optionally bounds the live streams of one caller (``max_streams_per_client``: credentials, else client
  address): one more gets ``429`` with ``Retry-After: 1`` and the app is shown the client as gone;
* counts everything in Prometheus metrics, logs one correlation id per stream, calls the stream hooks.

This module only dispatches: a new stream is ``exchange.Exchange``, a resume ``resume.serve_resume``, the
per-client bound ``limits.ClientLimits``, and which format a route speaks ``core.codecs.router.CodecRouter``.
Those pieces see this class only through ``host``'s Protocols (what each uses of it), so none imports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pluggy

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.codecs.router import DEFAULT_CODEC_ROUTES, CodecRouter
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.manager import codecs, create_plugin_manager
from eloquent_plugins.core.padding import sse_policy
from eloquent_plugins.core.protocol import DATAGRAM, TRANSPORT_HEADER
from eloquent_plugins.transports.drain import DRAIN_PATH, READY_PATH, Drain
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Scope, Send
from eloquent_plugins.transports.metrics import METRICS_PATH, StreamMetrics
from eloquent_plugins.transports.resume import create_store
from eloquent_plugins.transports.resume.hooks import plugin_store_factories
from eloquent_plugins.transports.resume.base import ResumeStore
from eloquent_plugins.transports.body_budget import HeldBodies
from eloquent_plugins.transports.sse.budget import StreamBudget
from eloquent_plugins.transports.sse.connection import MAX_LAG_EVENTS
from eloquent_plugins.transports.sse.exchange import Exchange
from eloquent_plugins.transports.sse.headers import json_error, respond
from eloquent_plugins.transports.sse.host import LocalStream, Merge
from eloquent_plugins.transports.sse.ids import RESUME_QUERY_KEY, IdentityFunction, resume_request
from eloquent_plugins.transports.sse.limits import ClientLimits
from eloquent_plugins.transports.sse.merge import merge_openai
from eloquent_plugins.transports.sse.resume import serve_resume
from eloquent_plugins.transports.telemetry import tracer

log = logging.getLogger("eloquent_plugins.transports.sse")
DRAIN_ROUTES = (READY_PATH, DRAIN_PATH)
STORE_PROBE_TIMEOUT = 3.0
"""Seconds the start-up check of the resume store may take before the store counts as unreachable."""

__all__ = ["DEFAULT_CODEC_ROUTES", "MAX_LAG_EVENTS", "EloquentMiddleware"]


def _redacted(url: str) -> str:
    """A store URL without its credentials (``redis://:secret@host`` -> ``redis://host``), for logs."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


class EloquentMiddleware:
    def __init__(self, app: ASGIApp, config: StreamConfig | None = None, *,
                 plugin_manager: pluggy.PluginManager | None = None, store: ResumeStore | None = None,
                 identity: IdentityFunction | None = None, codec_routes: Sequence[tuple[str, str]] | None = None,
                 metrics_path: str | None = "/metrics", registry: Any = None, drain: Drain | None = None) -> None:
        """``config`` None reads ``StreamConfig.from_env()`` (vLLM's ``--middleware`` passes no arguments).

        ``store`` overrides the one built from ``config.resume_store``; ``identity(scope)`` names the caller a
        resume must match; ``codec_routes`` maps path regexes to codec names for in-band errors
        (``DEFAULT_CODEC_ROUTES`` when None); ``metrics_path`` serves this middleware's metrics where the app
        has no such route (None: off), and ``/eloquent/metrics`` serves them always (the way to reach them
        where the app or its upstream owns ``/metrics``); ``registry`` is a prometheus ``CollectorRegistry`` to
        register into instead of a private one; ``drain`` is the server's (``eloquent serve`` turns SIGTERM
        into it), else one of its own from ``config.drain_timeout`` (``POST /eloquent/drain`` starts it).
        """
        self.app = app
        self.config = config if config is not None else StreamConfig.from_env()
        self.pm = plugin_manager if plugin_manager is not None else create_plugin_manager()
        self.codecs: dict[str, Codec] = codecs(self.pm)
        self.router = CodecRouter(self.codecs, codec_routes)
        self.metrics = StreamMetrics(registry)
        self.identity = identity
        self.limits = ClientLimits(self.config.max_streams_per_client, identity)
        self.metrics_path = metrics_path
        self.policy = self.config.keepalive_policy
        self.padding = sse_policy(self.config.padding) if self.config.padding != "off" else None
        """``--padding`` for SSE writes (``core.padding``); None when off."""
        if store is None and self.config.resume:
            store = create_store(self.config, plugin_store_factories(self.pm))
        self.store = store if self.config.resume else None
        self.lease_ttl = max(1.0, min(self.config.resume_grace, 10.0))
        self.bodies = HeldBodies.from_config(self.config)
        """Incomplete request bodies and WebTransport heads (``transports/body_budget.py``): the serving stack
        hands this ledger to the body deadline and the HTTP/3 front end; it counts in ``budget``."""
        self.budget = StreamBudget(self.config.max_held_bytes, self.store, self.metrics,
                                   retry_after=max(1.0, self.config.resume_grace), bodies=self.bodies)
        """``max_held_bytes``: what every stream log of this middleware holds, and what happens at the limit."""
        self.exchanges: dict[str, LocalStream] = {}
        """The live resumable streams produced here, by token (a resume here tells its producer it is read)."""
        self.spans: dict[str, Any] = {}
        """The live span of each resumable stream here, by token (a resume adds its connection to it)."""
        self.drain = drain if drain is not None else Drain(self.config.drain_timeout, token=self.config.drain_token)
        """Readiness (``/ready``), refusals while draining, and the hand-over of what still runs at its deadline."""
        self.drain.attach(self.metrics)
        self.tracer = tracer()
        """OpenTelemetry tracer (None without opentelemetry-api): one span per stream (``transports.telemetry``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan" and self.store is not None:
                receive = self._probe_store_at_startup(receive)
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in DRAIN_ROUTES and await self.drain.serve_route(scope, receive, send):
            return
        if path == METRICS_PATH and scope["method"] in ("GET", "HEAD"):
            body, content_type = self.metrics.render()
            await respond(send, 200, [(b"content-type", content_type.encode()),
                                      (b"content-length", str(len(body)).encode())],
                          b"" if scope["method"] == "HEAD" else body)
            return
        resume_raw: str | None = None
        bare = False
        for name, value in scope["headers"]:
            if name == TRANSPORT_HEADER and value.strip().lower() == DATAGRAM and scope.get("http_version") != "3":
                bare = True
                break
            if name == b"last-event-id" and value.strip():  # empty: no id (SSE spec), so not a resume
                resume_raw = value.decode("latin-1")
        if (not bare and self.store is not None and resume_raw is None
                and RESUME_QUERY_KEY in scope.get("query_string", b"")):
            resume_raw = resume_request(scope)
        drain = self.drain
        if drain.state and (resume_raw is None or self.store is None) and drain.refuses(scope):
            status, headers, body = json_error(self.router, path, 503, "this replica is draining (shutting down): "
                                               "retry, another replica takes the request", "draining",
                                               type_="server_draining")
            log.info("refused %s %s: draining", scope.get("method"), path)
            await drain.refuse(send, body, headers)
            return
        drain.enter()
        try:
            if bare:
                await self.app(scope, receive, send)
            elif self.store is not None and resume_raw is not None:
                await serve_resume(self, scope, receive, send, resume_raw)
            elif path == self.metrics_path and scope["method"] in ("GET", "HEAD"):
                await self._serve_metrics(scope, receive, send)
            else:
                await Exchange(self, scope, receive, send).run()
        finally:
            drain.leave()

    def _probe_store_at_startup(self, receive: Receive) -> Receive:
        """At the app's start, look the store up once: an unreachable one (Redis down) is one warning now, not a
        surprise at the first request (each later failure is one line per request)."""
        async def probing() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.check_store()
            return message

        return probing

    async def check_store(self) -> bool:
        """True when the resume store answers a lookup; else one warning line (streams then start without ids)."""
        if self.store is None:
            return True
        try:
            await asyncio.wait_for(self.store.open("eloquent-startup-probe"), STORE_PROBE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any failure means the same to an operator
            log.warning("resume store %s is unreachable (%s): streams start without ids (not resumable) and "
                        "resumes get 503 until it answers", _redacted(self.config.resume_store),
                        f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return False
        return True

    def codec_for(self, path: str) -> Codec:
        """The codec of the route at ``path``: the format of its events and errors."""
        return self.router.for_path(path)

    def merge_for(self, codec: Codec) -> Merge | None:
        return merge_openai if self.config.merge_deltas and codec.name == "openai" else None

    @property
    def client_streams(self) -> dict[str, int]:
        """Live streams per client key (``ids.client_key``) while ``max_streams_per_client`` is set."""
        return self.limits.counts

    async def _serve_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's own route wins; where it answers 404, this middleware's metrics are served."""
        ours = False

        async def capture(message: Message) -> None:
            nonlocal ours
            if message["type"] == "http.response.start" and message.get("status") == 404:
                ours = True
            if not ours:
                await send(message)

        await self.app(scope, receive, capture)
        if ours:
            body, content_type = self.metrics.render()
            await respond(send, 200, [(b"content-type", content_type.encode()),
                                      (b"content-length", str(len(body)).encode())],
                          b"" if scope["method"] == "HEAD" else body)
