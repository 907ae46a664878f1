"""Build the served ASGI app: the built-in engine or a registered upstream gateway, wrapped by the middleware."""

from __future__ import annotations

from typing import Any

import pluggy

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.upstream import parse_upstream, upstream_kind


def build_app(config: StreamConfig, pm: pluggy.PluginManager, *, upstream: str | None = None,
              engine_options: dict[str, Any] | None = None, drain: Any = None) -> Any:
    """The app ``eloquent serve`` hosts on both transports (SSE over HTTP/1.1, Eloquent over HTTP/3).

    Outermost is the request-body deadline (``config.body_timeout``): a body that stalls gets a 408 and the app
    is told the client left, so the engine never starts a request it has no complete body for. ``drain``: the
    server's ``transports.drain.Drain`` (readiness, refusals, the hand-over at its deadline)."""
    from eloquent_plugins.transports.browser import BrowserRoutes
    from eloquent_plugins.transports.request_timeouts import BodyTimeoutMiddleware
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    if upstream:
        kind, url = parse_upstream(upstream)
        inner = upstream_kind(pm, kind).create_app(url, config)
    else:
        from eloquent_plugins.engine import EngineConfig, create_engine_app

        inner = create_engine_app(EngineConfig(**(engine_options or {})))
    app = BodyTimeoutMiddleware(EloquentMiddleware(inner, config, plugin_manager=pm, drain=drain), config.body_timeout)
    return BrowserRoutes(app, certfile=config.certfile)  # /chat, /eloquent/client.js, /eloquent/cert-hash
