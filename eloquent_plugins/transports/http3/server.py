"""The HTTP/3 front end: hosts any ASGI app over aioquic, and delivers the SSE responses of requests that ask
for it (``eloquent-transport: datagram``) as Eloquent packets in HTTP/3 datagrams (RFC 9297, quarter stream
id prefix) tied to the request, driven by one ``EloquentResponseStream`` (the core sender) per request.

This module starts and stops the listener and holds what every connection shares (the app, the settings, the
codec router, benchmark timings). The rest: ``connection`` (one client connection's events), ``request`` (one
request's ASGI bridge and response), ``scheduler`` (which datagrams leave when), ``guards`` (admission and
abuse limits), and ``eloquent_plugins.h3glue`` (every access to aioquic internals).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Self

from aioquic.quic.configuration import QuicConfiguration

from eloquent_plugins.core.codecs import BUILTIN_CODECS, Codec
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import codecs
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.core.quic_lb import QuicLbConfig
from eloquent_plugins.h3glue import ALPN, RETRY_MODES, AdmissionStats, GuardedQuicServer, server_sockname
from eloquent_plugins.transports.cors import OriginPolicy, parse_origins
from eloquent_plugins.transports.http3.certs import dev_certificate, dev_pair, renewal_due, resolve_certificate
from eloquent_plugins.transports.drain import DrainState
from eloquent_plugins.transports.http3.connection import Http3Connection
from eloquent_plugins.transports.http3.lifespan import Lifespan
from eloquent_plugins.transports.http3.webtransport import DEFAULT_PATH


@dataclass(frozen=True, slots=True)
class FrontEndOptions:
    """Transport details beyond ``StreamConfig`` (defaults suit loopback demos and real paths alike)."""

    idle_timeout: float = 60.0
    """QUIC idle timeout; must exceed any outage a stream should survive."""
    fallback_after: float = 1.0
    """Seconds after the trailer before still-unacked events go on the reliable stream."""
    record_timings: bool = False
    """Keep each SSE event's generation time per request (benchmarks read them back in-process)."""
    timings_kept: int = 1024
    sender_redundancy: str | int | None = None
    """``SenderConfig.redundancy`` of Eloquent-scheme streams (``bench e2e --redundancy``); None: the default."""
    congestion_control: str = "reno"
    pacing: bool = False
    """aioquic's pacer (see ``h3glue.NoPacer`` for why it is off by default for token streams)."""
    codec_router: CodecRouter | None = None
    """Which codec shapes the JSON errors of each route; None: the plugin manager's codecs (the built-in ones
    without a manager) on the default routes, as the SSE middleware does."""
    retry: str = "auto"
    """Stateless Retry (address validation, one extra round trip): "auto" when ``retry_threshold`` handshakes
    are under way or one address has ``max_handshakes_per_address``, "always", or "off" (past a cap: dropped)."""
    retry_threshold: int = 64
    max_handshakes: int = 512
    """Connections still in the handshake, in all; past it new ones are dropped (old ones are kept)."""
    max_handshakes_per_address: int = 16
    """Handshakes not yet address-validated from one IP address; past it a Retry ("auto") or a drop ("off")."""
    handshake_timeout: float = 10.0
    """A connection whose handshake is not complete by then is dropped, nothing sent (not kept ``idle_timeout``)."""
    webtransport_path: str | None = DEFAULT_PATH
    """Where browsers open WebTransport sessions (docs/BROWSER.md); None or "" turns WebTransport off."""
    cors_origins: tuple[str, ...] = ()
    """Page origins besides the same-origin ones that may open WebTransport sessions (``--cors-origin``, ``*``:
    any); another origin's session gets 403 (browsers apply no CORS to WebTransport)."""
    page_ports: tuple[int, ...] = ()
    """TCP ports on the same host whose pages count as same-origin (the port pages are served from, when the
    HTTP/3 port differs or the browser reaches this port through a relay)."""
    server_id: bytes | None = None
    """``--server-id``: every connection id issued carries it in the QUIC-LB layout (``core.quic_lb``), so a
    balancer that routes by connection id keeps a connection on this replica; None: aioquic's random ids."""

    @property
    def quic_lb(self) -> QuicLbConfig | None:
        return QuicLbConfig(self.server_id) if self.server_id else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> FrontEndOptions:
        """Defaults, then ``ELOQUENT_QUIC_<FIELD>`` variables for the QUIC fields (``ELOQUENT_QUIC_RETRY``,
        ``ELOQUENT_QUIC_HANDSHAKE_TIMEOUT``, ``ELOQUENT_QUIC_IDLE_TIMEOUT``, ...), then ``overrides``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in ENV_FIELDS or (raw := env.get(f"ELOQUENT_QUIC_{f.name.upper()}")) is None:
                continue
            kind = ENV_FIELDS[f.name]
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"ELOQUENT_QUIC_{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def origin_policy(self) -> OriginPolicy:
        return OriginPolicy(parse_origins(self.cors_origins), tuple(self.page_ports))

    def check(self) -> None:
        if not (self.idle_timeout > 0 and self.fallback_after > 0 and self.handshake_timeout > 0):
            raise ConfigError("idle_timeout, fallback_after and handshake_timeout must be > 0")
        if self.retry not in RETRY_MODES:
            raise ConfigError(f"retry must be one of {', '.join(RETRY_MODES)}, not {self.retry!r}")
        if min(self.retry_threshold, self.max_handshakes, self.max_handshakes_per_address) < 1:
            raise ConfigError("retry_threshold, max_handshakes and max_handshakes_per_address must be >= 1")
        if self.webtransport_path and not self.webtransport_path.startswith("/"):
            raise ConfigError(f"webtransport_path must start with /, not {self.webtransport_path!r}")


log = logging.getLogger("eloquent_plugins.transports.http3")
RENEWAL_CHECK = 3600.0
"""Seconds between checks of the development certificate's expiry (it is renewed with 2 days left)."""

ENV_FIELDS: dict[str, Callable[[str], Any]] = {
    "idle_timeout": float, "handshake_timeout": float, "retry": str, "retry_threshold": int,
    "max_handshakes": int, "max_handshakes_per_address": int, "webtransport_path": str}
"""FrontEndOptions fields ``from_env`` reads (``ELOQUENT_QUIC_<NAME>``)."""


@dataclass(slots=True)
class ServerState:
    """What every connection of one listener shares."""

    app: Any
    config: StreamConfig
    options: FrontEndOptions
    plugin_manager: Any
    codecs: CodecRouter
    connections: set[Http3Connection] = field(default_factory=set)
    timings: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    sends: OrderedDict[str, tuple[Any, list[tuple[float, bytes, int]]]] = field(default_factory=OrderedDict)
    """With ``record_timings``: per request, its peer and (time, datagram, transmit number) of each datagram."""
    closed_with_error: int = 0
    drain: Any = None
    """The server's ``transports.drain.Drain``: GOAWAY when it begins, every connection closed when it is done."""

    def on_drain(self, state: DrainState) -> None:
        for conn in list(self.connections):
            if state is DrainState.DRAINING:
                conn.goaway()
            elif state is DrainState.DONE:
                conn.close_drained(force=bool(self.drain is not None and self.drain.handed_over))

    def record(self, request_id: str, times: list[float]) -> None:
        if not self.options.record_timings:
            return
        self.timings[request_id] = times
        while len(self.timings) > self.options.timings_kept:
            self.timings.popitem(last=False)


def codec_router(plugin_manager: Any, options: FrontEndOptions) -> CodecRouter:
    if options.codec_router is not None:
        return options.codec_router
    known: Mapping[str, Codec] = (codecs(plugin_manager) if plugin_manager is not None
                                  else {codec.name: codec for codec in BUILTIN_CODECS})
    return CodecRouter(known)


class Http3Server:
    """Handle returned by ``start_http3_server``: ``.port``, ``.host``, ``close()``, timings for benchmarks."""

    def __init__(self, server: GuardedQuicServer, state: ServerState, host: str, port: int,
                 lifespan: Lifespan | None = None) -> None:
        self._server = server
        self._state = state
        self._lifespan = lifespan
        self.host = host
        self.port = port
        self._renewal: asyncio.TimerHandle | None = None
        if state.config.certfile is None and state.config.keyfile is None:
            self._schedule_renewal()

    # ---- the development certificate renews itself (it lives under 14 days, for browsers) ---------------
    def _schedule_renewal(self) -> None:
        self._renewal = asyncio.get_running_loop().call_later(RENEWAL_CHECK, self._renew_if_due)

    def _renew_if_due(self) -> None:
        """New connections get a fresh development certificate once the cached one is near expiry; live ones
        keep theirs."""
        try:
            if renewal_due(dev_pair()):
                dev_certificate()
                self._server.set_configuration(quic_server_configuration(self._state.config, self._state.options))
        except Exception:  # noqa: BLE001 - a failed renewal is retried at the next check; say why
            log.exception("renewing the development certificate failed")
        self._schedule_renewal()

    def generation_times(self, request_id: str) -> list[float] | None:
        """When each SSE event of a finished request left the app (``time.monotonic`` clock); needs
        ``record_timings``. ``request_id`` is the ``eloquent-request-id`` response header."""
        return self._state.timings.get(request_id)

    def datagram_sends(self, request_id: str) -> tuple[Any, list[tuple[float, bytes, int]]] | None:
        """(peer, [(time, datagram, transmit number), ...]) of an Eloquent request; needs ``record_timings``."""
        return self._state.sends.get(request_id)

    @property
    def connections(self) -> int:
        return len(self._state.connections)

    @property
    def connections_closed_with_error(self) -> int:
        return self._state.closed_with_error

    @property
    def admission(self) -> AdmissionStats:
        """What the listener did with new Initials (admitted, retried, shed, expired handshakes, ...)."""
        return self._server.stats

    @property
    def handshaking(self) -> int:
        """Connections still in the handshake now."""
        return self._server.handshaking

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        connections = list(self._state.connections)
        self._server.close()
        for conn in connections:
            await conn.shutdown()
        self._state.connections.clear()
        if self._lifespan is not None:
            await self._lifespan.shutdown()
            self._lifespan = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def quic_server_configuration(config: StreamConfig, options: FrontEndOptions) -> QuicConfiguration:
    pair = resolve_certificate(config.certfile, config.keyfile)
    lb = options.quic_lb
    quic = QuicConfiguration(alpn_protocols=ALPN, is_client=False, max_datagram_frame_size=65536,
                             max_datagram_size=QUIC_MAX_DATAGRAM_SIZE, idle_timeout=options.idle_timeout,
                             congestion_control_algorithm=options.congestion_control,
                             **({"connection_id_length": lb.cid_length} if lb is not None else {}))
    try:
        quic.load_cert_chain(pair.certfile, pair.keyfile)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load TLS certificate {pair.certfile} / key {pair.keyfile}: {exc}") from None
    return quic


async def start_http3_server(app: Callable[..., Any], *, host: str, port: int, config: StreamConfig,
                             plugin_manager: Any = None, options: FrontEndOptions | None = None,
                             lifespan: bool = False, drain: Any = None) -> Http3Server:
    """Serve ``app`` over HTTP/3 on UDP ``host:port`` (0: any free port; read ``.port``).

    ``lifespan=True`` runs the app's ASGI lifespan (startup now, shutdown on ``close()``): set it when no other
    server (uvicorn) runs the same app. ``drain``: the app's ``transports.drain.Drain`` (GOAWAY on every
    connection when it begins, each closed when it is done).
    """
    options = options or FrontEndOptions.from_env()
    options.check()
    state = ServerState(app, config, options, plugin_manager, codec_router(plugin_manager, options), drain=drain)
    if drain is not None:
        drain.add_listener(state.on_drain)
    quic = quic_server_configuration(config, options)
    manager = None
    if lifespan:
        manager = Lifespan(app)
        await manager.startup()
    _, server = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: GuardedQuicServer(configuration=quic, create_protocol=partial(Http3Connection, state=state),
                                  retry=options.retry, retry_threshold=options.retry_threshold,
                                  max_handshakes=options.max_handshakes,
                                  max_handshakes_per_address=options.max_handshakes_per_address,
                                  handshake_timeout=options.handshake_timeout,
                                  new_cid=lb.new_cid if (lb := options.quic_lb) is not None else None),
        local_addr=(host, port))
    assert isinstance(server, GuardedQuicServer)
    bound = server_sockname(server) or (host, port)
    return Http3Server(server, state, host, int(bound[1]), manager)
