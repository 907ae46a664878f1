"""Build the served ASGI app: the built-in engine or a registered upstream gateway, in the serving stack."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pluggy

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.stack import Stack, wrap
from eloquent_plugins.transports.upstream import parse_upstream, upstream_kind


def inner_app(config: StreamConfig, pm: pluggy.PluginManager, *, upstream: str | None = None,
              engine_options: dict[str, Any] | None = None) -> Any:
    """The app itself: the gateway of ``upstream`` (``KIND=URL``), else the built-in engine."""
    if upstream:
        kind, url = parse_upstream(upstream)
        return upstream_kind(pm, kind).create_app(url, config)
    from eloquent_plugins.engine import EngineConfig, create_engine_app

    return create_engine_app(EngineConfig(**(engine_options or {})))


def build_stack(config: StreamConfig, pm: pluggy.PluginManager, *, upstream: str | None = None,
                engine_options: dict[str, Any] | None = None, drain: Any = None, streams: bool = True,
                cors_origins: str | Iterable[str] | None = None, alt_svc: bool = False) -> Stack:
    """The app ``eloquent serve`` hosts on both transports (SSE over HTTP/1.1, Eloquent over HTTP/3), wrapped as
    ``transports.stack`` says. ``drain``: the server's ``transports.drain.Drain`` (readiness, refusals, the
    hand-over at its deadline); ``streams`` False: the app without the stream layer (``--stream-transport
    none``)."""
    inner = inner_app(config, pm, upstream=upstream, engine_options=engine_options)
    return wrap(inner, config, streams=streams, plugin_manager=pm, drain=drain, cors_origins=cors_origins,
                alt_svc=alt_svc)


def build_app(config: StreamConfig, pm: pluggy.PluginManager, *, upstream: str | None = None,
              engine_options: dict[str, Any] | None = None, drain: Any = None) -> Any:
    """``build_stack(...).app``: the served app, for hosts that need none of its layers afterwards."""
    return build_stack(config, pm, upstream=upstream, engine_options=engine_options, drain=drain).app
