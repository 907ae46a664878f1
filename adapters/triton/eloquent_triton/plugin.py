"""Registers the ``triton`` upstream kind: ``--upstream triton=http://host:8000`` or ``grpc://host:8001``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.transports.upstream import UpstreamKind

if TYPE_CHECKING:
    from eloquent_plugins.transports.config import StreamConfig


def create_app(url: str, config: StreamConfig) -> Any:
    """The gateway for ``url``; request-size limit from the stream config."""
    from eloquent_triton.gateway import create_triton_gateway  # starlette/tritonclient only when the kind is used

    return create_triton_gateway(url, max_request_bytes=config.max_request_bytes)


@hookimpl
def eloquent_register_upstreams() -> list[UpstreamKind]:
    return [
        UpstreamKind(
            name="triton",
            create_app=create_app,
            description="NVIDIA Triton generate_stream over HTTP (http://) or gRPC (grpc://)",
        )
    ]
