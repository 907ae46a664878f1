"""``eloquent serve`` start-up checks: what an operator gets wrong is one line, never a traceback.

A port in use is an error (exit 2): nothing can be served on it, and a second server by mistake should not look
like it started. An upstream or a Redis that does not answer is one warning and the server serves degraded:
model servers take minutes to load and are often started alongside, and the Redis store already rides out an
outage at run time (streams are served, only not resumable), so start-up order must not matter. (Redis is
probed by the middleware at ASGI start-up; the upstream here.)
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from urllib.parse import urlsplit

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.upstream import parse_upstream

log = logging.getLogger("eloquent.serve")

PROBE_TIMEOUT = 2.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


def listen_error(exc: OSError, proto: str, host: str, port: int) -> ConfigError:
    """The one line for a socket that cannot be bound (``proto``: "tcp" or "udp")."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's strerror repeats the address
    hint = ""
    if exc.errno == errno.EADDRINUSE:
        other = "--port" if proto == "tcp" else "--eloquent-port (or --stream-transport sse)"
        hint = f"; is another server running there? pick another {other}"
    return ConfigError(f"cannot listen on {proto} {host}:{port}: {reason}{hint}")


async def check_tcp_port(host: str, port: int) -> None:
    """Bind and release ``host:port`` the way uvicorn will (``loop.create_server``, SO_REUSEADDR).

    uvicorn reports a busy port with its own log line and exit status 3; checking first makes it our line and
    exit status, before the UDP side is bound."""
    try:
        probe = await asyncio.get_running_loop().create_server(asyncio.Protocol, host=host, port=port)
    except OSError as exc:
        raise listen_error(exc, "tcp", host, port) from None
    probe.close()
    await probe.wait_closed()


async def _probe_upstream(upstream: str) -> None:
    kind, url = parse_upstream(upstream)
    parts = urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return
    if not parts.hostname or port is None:
        return
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), PROBE_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        log.warning("upstream %s=%s does not answer (%s); serving, its requests fail until it does", kind, url,
                    _short(exc))
        return
    writer.close()


def _short(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def warn_unreachable(upstream: str | None) -> None:
    """One warning line for an upstream that does not answer now. (The resume store is probed by the middleware
    at ASGI lifespan start-up, ``EloquentMiddleware.check_store``: one warning line too.)"""
    if upstream:
        await _probe_upstream(upstream)
