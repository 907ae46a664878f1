"""Upstream kinds: how ``--upstream KIND=URL`` turns into an ASGI app. Registered through the plugin hook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError

@dataclass(frozen=True, slots=True)
class UpstreamKind:
    name: str
    """The KIND in ``--upstream KIND=URL``, e.g. ``tgi`` or ``triton``."""
    create_app: Callable[[str, StreamConfig], Callable[..., Any]]
    """Build the gateway app for an upstream URL: an ASGI app (``transports.asgi.ASGIApp``, which the core may
    not import)."""
    description: str = ""


def parse_upstream(spec: str) -> tuple[str, str]:
    """Split ``KIND=URL``; a clear error for anything else."""
    kind, sep, url = spec.partition("=")
    if not sep or not kind or not url:
        raise ConfigError(f"--upstream expects KIND=URL (e.g. tgi=http://127.0.0.1:8080), got {spec!r}")
    if "://" not in url:
        raise ConfigError(f"--upstream URL must include a scheme (http://, grpc://), got {url!r}")
    return kind.strip().lower(), url.strip()
