"""A gateway that serves the OpenAI HTTP API and relays any OpenAI-compatible server, one event per SSE message.

Why a gateway: most OpenAI-compatible servers (SGLang, LMDeploy, llama.cpp, Ollama, mistral.rs; vLLM too, when
its ``--middleware`` flag is not an option) have no plugin hooks, and none of them sends anything while a request
waits in its queue, so a proxy with an idle timeout cuts it. The gateway answers a streaming
``/v1/chat/completions`` or ``/v1/completions`` (``"stream": true``) with ``200 text/event-stream`` at once --
``EloquentMiddleware`` in front then keeps the line alive, numbers and stores the events for resume, and carries
them over HTTP/3 -- and forwards each upstream event's payload byte for byte. Every other route (``/v1/models``,
``/v1/embeddings``, non-streaming completions, ``/health``, the upstream's ``/metrics``, ...) is proxied unchanged;
the middleware's stream metrics are at ``/eloquent/metrics`` (never proxied).

The upstream's SSE quirks are tolerated: ``data:`` without the space (kept as is), comment keep-alives (passed on),
a stream with or without ``[DONE]`` (one that ends after every choice has a ``finish_reason`` is complete),
usage-only chunks.
What the upstream cannot report itself -- unreachable, a rejection after our 200 went out, a body that ends before
the generation finished -- becomes an OpenAI error event, ``{"error": {"message", "type", "param", "code"}}``
then ``[DONE]``, which the openai SDK raises as ``APIError``. A client that goes away cancels the relay, which
closes the upstream request, so the engine aborts it and frees the slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import Response

from eloquent_plugins.core.codecs.openai import OpenAICodec
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.dialect import error_text, json_object
from eloquent_plugins.transports.proxy import create_gateway_app, gateway_relay

__all__ = ["OpenAIGatewayError", "STREAM_ROUTES", "create_openai_gateway"]

DONE = b"[DONE]"
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
               "x-accel-buffering": "no"}
"""What vLLM, SGLang and LMDeploy (FastAPI) send; ``x-accel-buffering`` for nginx."""
STREAM_ROUTES = ("/v1/chat/completions", "/v1/completions")
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"[^"]')
"""A chunk that may end a choice (``"finish_reason": null`` or ``""`` on every other chunk does not match); such a
chunk is parsed to learn which choices it ends."""
_ERROR_TYPES = {"validation": "invalid_request_error"}
"""The relay's failure kinds as OpenAI error types; anything else is the server's fault."""
_CODEC = OpenAICodec()


class OpenAIGatewayError(ConfigError):
    """The gateway was configured with something it cannot use (e.g. a non-HTTP upstream URL)."""


def _error_payload(message: str, error_type: str, status: int) -> bytes:
    """The shape of the middleware's own in-band errors on these routes (``core.codecs.openai``)."""
    return _CODEC.error_payload(message, error_type=_ERROR_TYPES.get(error_type, "server_error"), status=status)


def _choices_expected(obj: dict[str, Any]) -> int:
    """How many choices the request asks for: ``n`` per prompt (a completions ``prompt`` may be a list of prompts)."""
    n = obj.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    prompt = obj.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
    return n * prompts


def _finished_indices(payload: bytes) -> set[int]:
    """The choices a chunk ends: those with a non-empty string ``finish_reason``."""
    obj = json_object(payload)
    choices = obj.get("choices") if obj is not None else None
    if not isinstance(choices, list):
        return set()
    return {c.get("index", 0) if isinstance(c.get("index", 0), int) else -1 for c in choices
            if isinstance(c, dict) and isinstance(c.get("finish_reason"), str) and c["finish_reason"]}


@dataclass(slots=True)
class _OpenAIStream:
    """One chat or completions stream: complete at ``[DONE]``, an upstream error event, or -- for servers that
    send no ``[DONE]`` -- once every choice the request asked for has a non-empty ``finish_reason`` (a stream cut
    with one of ``n=2`` choices unfinished, or with ``"finish_reason": ""`` everywhere, is not complete)."""

    expected: int = 1
    done: bool = False
    finished: set[int] = field(default_factory=set)
    codec = "openai"
    """The format a continuation of this stream is planned in (``core.continuation``)."""

    def observe(self, payload: bytes) -> None:
        if self.done:
            return
        if payload.strip() == DONE:
            self.done = True
        elif _FINISHED.search(payload):
            self.finished |= _finished_indices(payload)
        elif b"error" in payload:
            obj = json_object(payload)
            if obj is not None and (obj.get("error") is not None or obj.get("object") == "error"):
                self.done = True  # the upstream reported its own failure: nothing to add

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        self.done = True
        return [_error_payload(message, error_type, status), DONE]

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        obj = json_object(body)
        if obj is not None and isinstance(obj.get("error"), dict):
            self.done = True
            return [body.strip(), DONE]  # already OpenAI's error shape (vLLM, llama.cpp, Ollama): unchanged
        if obj is not None and obj.get("object") == "error":  # the older ErrorResponse (SGLang, LMDeploy)
            self.done = True
            fields = {k: obj.get(k) for k in ("message", "type", "param", "code")}
            return [_CODEC.error_payload(str(fields["message"]), error_type=str(fields["type"] or "server_error"),
                                         status=status, code=fields["code"]), DONE]
        kind = "validation" if 400 <= status < 500 else "generation"
        return self.error(error_text(obj, body) or f"upstream answered HTTP {status}", kind, status)

    def unfinished(self) -> list[bytes]:
        if self.done or all(i in self.finished for i in range(self.expected)):
            return []
        return self.error("upstream stream ended before the generation finished", "incomplete_generation", 502)


def _stream(obj: dict[str, Any]) -> _OpenAIStream | None:
    return _OpenAIStream(_choices_expected(obj)) if obj.get("stream") is True else None


def _error_response(message: str, error_type: str, status: int) -> Response:
    """The answers the gateway gives itself (413, an unreachable upstream), in OpenAI's error shape."""
    return Response(_error_payload(message, error_type, status), status_code=status, media_type="application/json")


def _root_url(url: str) -> None:
    if url.endswith("/v1"):
        raise OpenAIGatewayError(f"give the server's root URL, without /v1 (the gateway serves the same paths as the "
                                 f"server): {url!r}")


def create_openai_gateway(upstream_url: str, config: StreamConfig | None = None, *,
                          timeout: httpx.Timeout | None = None, stream_idle_timeout: float | None = None,
                          transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The gateway app for the OpenAI-compatible server whose root is ``upstream_url`` (``http://host:port``;
    several, comma-separated, make a failover list: ``transports.failover``).

    ``timeout`` is for the upstream: by default connecting may take 10 s and reading has no limit (a request may
    queue and generate for minutes). ``stream_idle_timeout`` ends a stream whose upstream stays silent that long
    with an error event; None (the default) waits forever, because these servers send nothing while a request
    is queued -- a client that leaves still ends it. ``transport`` lets tests and embedders route the traffic.
    """
    relay = gateway_relay(upstream_url, "OpenAI", OpenAIGatewayError, _error_response, config or StreamConfig(),
                          timeout=timeout, stream_idle_timeout=stream_idle_timeout, transport=transport,
                          stream_headers=SSE_HEADERS, check_url=_root_url)
    app = create_gateway_app(relay, [(path, _stream) for path in STREAM_ROUTES])
    app.state.openai_upstream = relay.base_url
    app.state.upstreams = relay.upstreams
    return app
