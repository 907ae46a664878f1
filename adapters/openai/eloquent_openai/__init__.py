"""OpenAI-compatible adapter: a gateway in front of any server that speaks the OpenAI HTTP API (vLLM, SGLang,
LMDeploy, llama.cpp server, Ollama's /v1, mistral.rs, the built-in engine, ...).

``eloquent_openai.gateway.create_openai_gateway(url, config)`` builds the ASGI app; ``eloquent_openai.plugin``
registers it as the ``openai`` upstream kind for ``eloquent serve --upstream openai=URL``. Keep-alive, event ids,
resume, coalescing and HTTP/3 come from hosting the gateway in the serving stack (``transports.stack.wrap``,
which puts ``EloquentMiddleware`` around it), not from the gateway.
"""

from __future__ import annotations

__all__ = ["create_openai_gateway"]


def __getattr__(name: str) -> object:
    # Lazy: loading the plugin entry point stays cheap until an OpenAI upstream is actually created.
    if name == "create_openai_gateway":
        from eloquent_openai.gateway import create_openai_gateway

        return create_openai_gateway
    raise AttributeError(name)
