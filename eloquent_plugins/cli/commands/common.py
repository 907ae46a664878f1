"""Option names every subcommand shares, so ``serve``, ``demo``, ``bench`` and ``chat`` read the same."""

from __future__ import annotations

import argparse

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.cli import numbers


def add_host_port(parser: argparse.ArgumentParser, *, port: int = 8000) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=numbers.port, default=port, help="TCP port for HTTP/SSE; the HTTP/3 front end "
                        "uses the same number over UDP unless --eloquent-port says otherwise (default: %(default)s)")


def add_keepalive(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keepalive", type=numbers.seconds, default=15.0, metavar="SECONDS",
                        help="seconds without bytes before a keep-alive; 0 turns it off (default: %(default)s)")


def add_stream_transport(parser: argparse.ArgumentParser, *, default: str = "eloquent") -> None:
    parser.add_argument("--stream-transport", choices=("sse", "eloquent"), default=default,
                        help="sse: keep-alive, resume and coalescing on the SSE path only; eloquent: also the "
                        "HTTP/3 datagram front end (default: %(default)s)")


def add_upstream(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", metavar="KIND=URL", default=None,
                        help="model server to front, e.g. tgi=http://127.0.0.1:3000 or triton=grpc://127.0.0.1:8001; "
                        "none means the built-in engine")


def add_all(parser: argparse.ArgumentParser, *, port: int = 8000, transport: str = "eloquent") -> None:
    add_host_port(parser, port=port)
    add_keepalive(parser)
    add_stream_transport(parser, default=transport)
    add_upstream(parser)


def stream_config(args: argparse.Namespace, **overrides: object) -> StreamConfig:
    """Environment (``ELOQUENT_*``) first, then the shared flags that were given."""
    values: dict[str, object] = {}
    for name in ("keepalive", "stream_transport"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    values.update(overrides)
    try:
        return StreamConfig.from_env(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
