"""The HTTP/3 front end: hosts any ASGI app over aioquic, and delivers the SSE responses of requests that ask
for it (``eloquent-transport: datagram``) as Eloquent packets in HTTP/3 datagrams (RFC 9297, quarter stream
id prefix) tied to the request, driven by one ``EloquentResponseStream`` (the core sender) per request.

This module starts and stops the listener. What every connection shares (the app, the settings, the codec
router, benchmark timings) is ``state.ServerState``; the front end's settings are ``options.FrontEndOptions``.
The rest: ``connection`` (one client connection's events), ``request`` (one
request's ASGI bridge and response), ``scheduler`` (which datagrams leave when), ``guards`` (admission and
abuse limits), and ``eloquent_plugins.h3glue`` (every access to aioquic internals; the listener in ``h3glue.listener``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Self

from aioquic.quic.configuration import QuicConfiguration

from eloquent_plugins.core.codecs import BUILTIN_CODECS, Codec
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import codecs
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.h3glue.common import ALPN, bytes_in_flight, server_sockname
from eloquent_plugins.h3glue.intake import BatchedIntake
from eloquent_plugins.h3glue.listener import AdmissionStats, GuardedQuicServer
from eloquent_plugins.transports.body_budget import HeldBodies
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.certs import dev_pair, renewal_due, resolve_certificate, dev_certificate
from eloquent_plugins.transports.http3.connection import Http3Connection
from eloquent_plugins.transports.http3.lifespan import Lifespan
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.state import ServerState

log = logging.getLogger("eloquent_plugins.transports.http3")
UDP_RECEIVE_BUFFER = 4 << 20
"""``SO_RCVBUF`` asked for the listening socket (the kernel caps it at ``net.core.rmem_max``). Its default, 208 KiB,
holds a few hundred small datagrams: a server descheduled for tens of milliseconds on a busy host dropped its
clients' ACKs and requests among a swarm's PINGs and handshakes (issue 28), and each lost ack stalls a datagram
stream until its fallback."""
RENEWAL_CHECK = 3600.0
"""Seconds between checks of the development certificate's expiry (it is renewed with 2 days left)."""


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
    def bytes_in_flight(self) -> int:
        """Bytes every open connection has in flight now (0: each one's handshake and last packets acknowledged)."""
        return sum(bytes_in_flight(conn.quic) for conn in self._state.connections)

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

    @property
    def held(self) -> int:
        """Connections counted against ``max_connections`` now (handshaking or open)."""
        return self._server.caps.count

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
                             lifespan: bool = False, drain: Any = None,
                             bodies: HeldBodies | None = None) -> Http3Server:
    """Serve ``app`` over HTTP/3 on UDP ``host:port`` (0: any free port; read ``.port``).

    ``lifespan=True`` runs the app's ASGI lifespan (startup now, shutdown on ``close()``): set it when no other
    server (uvicorn) runs the same app. ``drain``: the app's ``transports.drain.Drain`` (GOAWAY on every
    connection when it begins, each closed when it is done). ``bodies``: the serving stack's ledger of incomplete
    request bodies (``Stack.bodies``), so both transports count against the same ceilings; None: its own.
    """
    options = options or FrontEndOptions.from_env()
    options.check()
    state = ServerState(app, config, options, plugin_manager, codec_router(plugin_manager, options), drain=drain,
                        bodies=bodies)
    if drain is not None:
        drain.add_listener(state.on_drain)
    quic = quic_server_configuration(config, options)
    manager = None
    if lifespan:
        manager = Lifespan(app)
        await manager.startup()
    transport, server = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: GuardedQuicServer(configuration=quic, create_protocol=partial(Http3Connection, state=state),
                                  retry=options.retry, retry_threshold=options.retry_threshold,
                                  max_handshakes=options.max_handshakes,
                                  max_handshakes_per_address=options.max_handshakes_per_address,
                                  handshake_timeout=options.handshake_timeout,
                                  max_connections=options.max_connections,
                                  max_connections_per_address=options.max_connections_per_address,
                                  streamless_timeout=options.idle_timeout,
                                  new_cid=lb.new_cid if (lb := options.quic_lb) is not None else None),
        local_addr=(host, port))
    assert isinstance(server, GuardedQuicServer)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # best effort: the kernel may refuse or cap it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)
    bound = server_sockname(server) or (host, port)
    BatchedIntake.install(transport)  # every datagram already queued at each wake-up, not one (h3glue.intake)
    return Http3Server(server, state, host, int(bound[1]), manager)
