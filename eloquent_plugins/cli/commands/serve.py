"""``eloquent serve``: SSE (HTTP/1.1, uvicorn) and, with ``--stream-transport eloquent``, HTTP/3 on UDP."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import logging.config

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.commands.common import (
    add_all,
    add_server_settings,
    check_combination,
    free_port_pair,
    stream_config,
)
from eloquent_plugins.cli.flags import add_setting, command
from eloquent_plugins.cli.optional import needs_extra
from eloquent_plugins.cli.preflight import check_tcp_port, listen_error, warn_unreachable
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.access_log import log_config
from eloquent_plugins.transports.drain import Drain
from eloquent_plugins.transports.telemetry import configure_from_env

log = logging.getLogger("eloquent.serve")
QUIC_MAX_CONNECTIONS = 2048
QUIC_MAX_CONNECTIONS_PER_ADDRESS = 128
"""``FrontEndOptions``' defaults, spelled here so that building the parser loads no aioquic (a test compares)."""
AFTER_DRAIN = 2
"""uvicorn's graceful shutdown once the drain is done: every stream finished or was handed over, so this only
bounds requests that are no stream (and idle keep-alive connections)."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve the built-in engine or front an upstream model server")
    add_all(parser)
    add_server_settings(parser)
    add_setting(parser, "--header-timeout", type=numbers.seconds, default=StreamConfig().header_timeout,
                metavar="SECONDS", help="HTTP/1.1: close a connection whose request line and headers are not in "
                "within this many seconds (408); 0 turns it off")
    add_setting(parser, "--tpot", type=numbers.seconds, default=0.03, metavar="SECONDS",
                help="built-in engine: seconds per output token")
    add_setting(parser, "--ttft", type=numbers.seconds, default=0.2, metavar="SECONDS",
                help="built-in engine: seconds before the first token")
    add_setting(parser, "--quic-retry", choices=("auto", "always", "off"), default="auto",
                help="HTTP/3 stateless Retry (address validation): under load, always, or never")
    add_setting(parser, "--quic-max-connections", type=numbers.positive, default=QUIC_MAX_CONNECTIONS,
                metavar="N", help="HTTP/3: QUIC connections held at once; at it, the one idle longest (no request) is "
                "closed (H3_EXCESSIVE_LOAD) for a newcomer, else the newcomer is refused; one carrying a request "
                "never is")
    add_setting(parser, "--quic-max-connections-per-address", type=numbers.positive,
                default=QUIC_MAX_CONNECTIONS_PER_ADDRESS, metavar="N",
                help="HTTP/3: the same, from one IP address (its own idle connections are closed first)")
    add_setting(parser, "--server-id", type=_server_id, default=None, metavar="HEX", shown="random ids",
                help="HTTP/3: put this server id (1-15 octets, hex) in every QUIC connection id issued, in the "
                "QUIC-LB plaintext layout, for balancers that route QUIC by connection id")
    add_setting(parser, "--log-level", choices=("debug", "info", "warning", "error"), default="info",
                help="server log level")
    command(parser, run)


def _server_id(text: str) -> bytes:
    from eloquent_plugins.core.errors import ConfigError
    from eloquent_plugins.core.quic_lb import parse_server_id

    try:
        return parse_server_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    check_combination(args)
    if args.port == 0 and args.stream_transport == "eloquent" and args.eloquent_port is None:
        args.port = free_port_pair(args.host)  # one number for TCP and UDP: clients rely on it
    config = stream_config(args)
    logging.config.dictConfig(log_config(args.log_level))  # one format for ours, uvicorn's and the access lines
    configure_from_env()  # OTEL_TRACES_EXPORTER=console|otlp: spans per stream (transports.telemetry)
    return asyncio.run(serve(args, config))


async def serve(args: argparse.Namespace, config) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from eloquent_plugins.cli.draining import DrainingServer
    from eloquent_plugins.cli.app_factory import build_stack
    from eloquent_plugins.transports.request_timeouts import header_timeout_protocol

    pm = create_plugin_manager()
    drain = Drain(config.drain_timeout, token=config.drain_token)
    with needs_extra(f"--upstream {args.upstream}" if args.upstream else "eloquent serve"):
        # --stream-transport none: the app as it is, without the streaming layer (a baseline)
        stack = build_stack(config, pm, upstream=args.upstream, engine_options={"tpot": args.tpot, "ttft": args.ttft},
                            drain=drain, streams=args.stream_transport != "none", cors_origins=args.cors_origin,
                            alt_svc=config.stream_transport == "eloquent")
    app = stack.app  # both transports host it; TCP responses advertise the HTTP/3 port once it is bound (below)
    await check_tcp_port(args.host, args.port)
    # http=: uvicorn's h11 protocol plus a header-read deadline (uvicorn has none); keep-alive idle stays uvicorn's.
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           log_config=log_config(args.log_level),
                                           lifespan="auto", timeout_graceful_shutdown=AFTER_DRAIN,
                                           # a certificate: HTTPS on TCP from the files HTTP/3 serves (browsers
                                           # honour Alt-Svc only over HTTPS)
                                           ssl_certfile=config.certfile, ssl_keyfile=config.keyfile,
                                           http=header_timeout_protocol(config.header_timeout, config.socket_send_buffer)))
    h3 = None
    if config.stream_transport == "eloquent":
        from eloquent_plugins.transports.cors import parse_origins
        from eloquent_plugins.transports.http3.options import FrontEndOptions
        from eloquent_plugins.transports.http3.server import start_http3_server

        udp_port = config.eloquent_port if config.eloquent_port is not None else args.port
        try:
            h3 = await start_http3_server(app, host=args.host, port=udp_port, config=config, plugin_manager=pm,
                                          options=FrontEndOptions.from_env(
                                              retry=args.quic_retry, cors_origins=parse_origins(args.cors_origin),
                                              page_ports=(args.port,), server_id=args.server_id,
                                              max_connections=args.quic_max_connections,
                                              max_connections_per_address=args.quic_max_connections_per_address),
                                          drain=drain, bodies=stack.bodies)
        except OSError as exc:  # certificate trouble is a ConfigError already: this is the bind
            raise listen_error(exc, "udp", args.host, udp_port) from None
        log.info("HTTP/3 (Eloquent datagrams) on udp://%s:%s", args.host, h3.port)
        if stack.alt_svc is not None:
            stack.alt_svc.port = h3.port
        if stack.streams is not None:
            stack.streams.metrics.quic = h3  # the listener's admission counters on /metrics
    # Everything built so far (modules, the app, the engine's corpus) lives as long as the process: move it out of
    # the collector's sight, so a full collection under load scans only the streams' own objects (shorter pauses).
    await warn_unreachable(args.upstream)
    gc.collect()
    gc.freeze()
    server.watch(drain, before_exit=h3.close if h3 is not None else None)
    try:
        await server.serve()
    finally:
        if h3 is not None:
            await h3.close()
    return 0
