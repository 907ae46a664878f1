"""TGI adapter: a gateway in front of Hugging Face text-generation-inference with TGI's own routes and schemas.

``eloquent_tgi.gateway.create_tgi_gateway(url, config)`` builds the ASGI app; ``eloquent_tgi.plugin`` registers it
as the ``tgi`` upstream kind for ``eloquent serve --upstream tgi=URL``. Keep-alive, event ids, resume, coalescing
and HTTP/3 come from hosting the gateway in the serving stack (``transports.stack.wrap``), not from the gateway
itself.
"""

from __future__ import annotations

__all__ = ["create_tgi_gateway"]


def __getattr__(name: str) -> object:
    # Lazy: loading the plugin entry point stays cheap until a TGI upstream is actually created.
    if name == "create_tgi_gateway":
        from eloquent_tgi.gateway import create_tgi_gateway

        return create_tgi_gateway
    raise AttributeError(name)
