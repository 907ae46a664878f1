"""Registers the ``tgi`` upstream kind, so ``eloquent serve --upstream tgi=http://HOST:PORT`` fronts a TGI server.

Loaded through the ``eloquent_plugins`` entry-point group; the gateway module is imported only when a TGI
upstream is actually created.
"""

from __future__ import annotations

from typing import Any

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.transports.upstream import UpstreamKind


def create_app(url: str, config: StreamConfig) -> Any:
    """The bare TGI gateway; the host wraps it in the serving stack (``transports.stack.wrap``) like every other
    upstream."""
    from eloquent_tgi.gateway import create_tgi_gateway

    return create_tgi_gateway(url, config)


TGI_UPSTREAM = UpstreamKind(
    name="tgi",
    create_app=create_app,
    description="Hugging Face text-generation-inference (HTTP): /generate_stream, /, /generate, "
    "/v1/chat/completions, /info, /health",
)


@hookimpl
def eloquent_register_upstreams() -> list[UpstreamKind]:
    return [TGI_UPSTREAM]
