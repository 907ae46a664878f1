"""``eloquent serve``: SSE (HTTP/1.1, uvicorn) and, with ``--stream-transport eloquent``, HTTP/3 on UDP."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging

from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.commands.common import add_all, stream_config

log = logging.getLogger("eloquent.serve")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve the built-in engine or front an upstream model server")
    add_all(parser)
    parser.add_argument("--eloquent-port", type=numbers.port, default=None, metavar="UDP_PORT",
                        help="UDP port of the HTTP/3 front end (default: same number as --port)")
    parser.add_argument("--certfile", default=None, help="TLS certificate for HTTP/3 (default: a development "
                        "certificate generated on first use)")
    parser.add_argument("--keyfile", default=None, help="TLS private key for HTTP/3")
    parser.add_argument("--resume-store", default=None, metavar="URL",
                        help="memory:// (default) or redis://host:port/db to share resumable streams across replicas")
    parser.add_argument("--no-resume", action="store_true", help="turn off event ids and resume")
    parser.add_argument("--header-timeout", type=numbers.seconds, default=None, metavar="SECONDS",
                        help="HTTP/1.1: close a connection whose request line and headers are not in within this "
                        "many seconds (408); 0 turns it off (default: ELOQUENT_HEADER_TIMEOUT or 30)")
    parser.add_argument("--body-timeout", type=numbers.seconds, default=None, metavar="SECONDS",
                        help="answer 408 and stop the request when its body stalls this long, HTTP/1.1 and HTTP/3; "
                        "0 turns it off (default: ELOQUENT_BODY_TIMEOUT or 30)")
    parser.add_argument("--max-streams-per-client", type=numbers.count, default=None, metavar="N",
                        help="live SSE streams one caller (credentials, else client IP) may hold; above it 429; "
                        "0 = unlimited (default: ELOQUENT_MAX_STREAMS_PER_CLIENT or 0)")
    parser.add_argument("--tpot", type=numbers.seconds, default=0.03, help="built-in engine: seconds per output token")
    parser.add_argument("--ttft", type=numbers.seconds, default=0.2,
                        help="built-in engine: seconds before the first token")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {"eloquent_port": args.eloquent_port, "certfile": args.certfile,
                                    "keyfile": args.keyfile, "resume_store": args.resume_store,
                                    "header_timeout": args.header_timeout, "body_timeout": args.body_timeout,
                                    "max_streams_per_client": args.max_streams_per_client}
    if args.no_resume:
        overrides["resume"] = False
    config = stream_config(args, **overrides)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(serve(args, config))


async def serve(args: argparse.Namespace, config) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from eloquent_plugins.cli.app_factory import build_app
    from eloquent_plugins.transports.request_timeouts import header_timeout_protocol

    pm = create_plugin_manager()
    app = build_app(config, pm, upstream=args.upstream, engine_options={"tpot": args.tpot, "ttft": args.ttft})
    # http=: uvicorn's h11 protocol plus a header-read deadline (uvicorn has none); keep-alive idle stays uvicorn's.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           lifespan="auto", timeout_graceful_shutdown=5,
                                           http=header_timeout_protocol(config.header_timeout)))
    h3 = None
    if config.stream_transport == "eloquent":
        from eloquent_plugins.transports.http3.server import start_http3_server

        udp_port = config.eloquent_port if config.eloquent_port is not None else args.port
        h3 = await start_http3_server(app, host=args.host, port=udp_port, config=config, plugin_manager=pm)
        log.info("HTTP/3 (Eloquent datagrams) on udp://%s:%s", args.host, h3.port)
    # Everything built so far (modules, the app, the engine's corpus) lives as long as the process: move it out of
    # the collector's sight, so a full collection under load scans only the streams' own objects (shorter pauses).
    gc.collect()
    gc.freeze()
    try:
        await server.serve()
    finally:
        if h3 is not None:
            await h3.close()
    return 0
