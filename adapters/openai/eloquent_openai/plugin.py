"""Registers the ``openai`` upstream kind: ``eloquent serve --upstream openai=http://HOST:PORT`` fronts any
OpenAI-compatible server.

Loaded through the ``eloquent_plugins`` entry-point group; the gateway module is imported only when an OpenAI
upstream is actually created.
"""

from __future__ import annotations

from typing import Any

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.transports.upstream import UpstreamKind


def create_app(url: str, config: StreamConfig) -> Any:
    """The bare gateway; the host wraps it in the serving stack (``transports.stack.wrap``) like every other
    upstream."""
    from eloquent_openai.gateway import create_openai_gateway

    return create_openai_gateway(url, config)


OPENAI_UPSTREAM = UpstreamKind(
    name="openai",
    create_app=create_app,
    description="any OpenAI-compatible server (HTTP): streaming /v1/chat/completions and /v1/completions; "
    "every other route (/v1/models, /v1/embeddings, /health, /metrics, ...) proxied",
)


@hookimpl
def eloquent_register_upstreams() -> list[UpstreamKind]:
    return [OPENAI_UPSTREAM]
