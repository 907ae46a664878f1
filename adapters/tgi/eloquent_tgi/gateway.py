"""A gateway that serves TGI's HTTP API and relays a TGI server, one upstream event per SSE message.

Why a gateway and not a patch: TGI is a Rust router with no plugin hooks, so the only place to add keep-alive,
event ids, resume and the HTTP/3 transport is a process in front of it. This module only translates: streaming
routes (``/generate_stream``, ``/`` with ``"stream": true``, ``/v1/chat/completions`` and ``/v1/completions`` with
``"stream": true``) answer ``200 text/event-stream`` at once and forward each upstream event's payload byte for
byte, framed the way the upstream framed it (``data:`` with or without the space); every other route
(``/generate``, ``/info``, ``/health``, ``/tokenize``, ``/metrics``, ...) is proxied unchanged. Wrap the app in
``EloquentMiddleware`` for the stream improvements; ``/metrics`` being TGI's, the middleware's stream metrics are
at ``/eloquent/metrics`` (never proxied).

Failures the upstream cannot report itself (unreachable, a rejected request after our 200 went out, a body that
ends early) become in-band error events in TGI's own shapes: ``{"error", "error_type"}`` on the generate routes
(what the ``text-generation`` client turns into its typed exceptions) and ``{"error": {"message",
"http_status_code"}}`` followed by ``[DONE]`` on the OpenAI routes. A client that goes away cancels the relay,
which closes the upstream request, so TGI frees the batch slot. The relay itself (and the request target passed
on unchanged) is ``eloquent_plugins.transports.proxy``, shared with the OpenAI-compatible gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.codecs.tgi import tgi_chat_error, tgi_error
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.dialect import dump_json, error_text, json_object
from eloquent_plugins.transports.proxy import create_gateway_app, gateway_relay

__all__ = ["TGIGatewayError", "create_tgi_gateway"]

DONE = b"[DONE]"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
"""TGI's stream headers (no charset on the content type, as axum writes it); ``x-accel-buffering`` for nginx."""


class TGIGatewayError(ConfigError):
    """The gateway was configured with something it cannot use (e.g. a non-HTTP upstream URL)."""


# --------------------------------------------------------------------------------------------- dialects


@dataclass(slots=True)
class _GenerateDialect:
    """``/generate_stream`` and ``/``: the stream is complete once an event carries ``generated_text``."""

    last: bytes = b""
    codec = "tgi"
    """The format a continuation is planned in (``core.continuation``: ``inputs`` + the text so far)."""

    def observe(self, payload: bytes) -> None:
        self.last = payload

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        del status  # TGI's stream errors carry no status: they all arrive under the 200
        return [dump_json(tgi_error(message, error_type))]

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        obj = json_object(body)
        if obj is not None and "error" in obj and "error_type" in obj:
            return [body.strip()]  # already TGI's error shape: forward it unchanged
        message = error_text(obj, body) or f"upstream answered HTTP {status}"
        return self.error(message, "validation" if status in (400, 413, 415, 422) else "generation", status)

    def unfinished(self) -> list[bytes]:
        obj = json_object(self.last)
        if obj is not None and ("error" in obj or obj.get("generated_text") is not None):
            return []
        # TGI's own text for a backend stream that stops without its End message; the type is the one the
        # text-generation client maps to IncompleteGenerationError.
        return self.error("Incomplete generation stream", "incomplete_generation", 500)


@dataclass(slots=True)
class _OpenAIDialect:
    """``/v1/chat/completions`` and ``/v1/completions``: the stream is complete at ``[DONE]``."""

    done: bool = False
    codec = "openai"

    def observe(self, payload: bytes) -> None:
        if payload.strip() == DONE:
            self.done = True

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        del error_type  # TGI's OpenAI error events carry a status code, not a type
        self.done = True
        return [dump_json(tgi_chat_error(message, status)), DONE]

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        obj = json_object(body)
        return self.error(error_text(obj, body) or f"upstream answered HTTP {status}", "", status)

    def unfinished(self) -> list[bytes]:
        return [] if self.done else self.error("Incomplete generation stream", "incomplete_generation", 500)


def _generate_stream(obj: dict[str, Any]) -> _GenerateDialect | None:
    return _GenerateDialect()


def _compat(obj: dict[str, Any]) -> _GenerateDialect | None:
    return _GenerateDialect() if obj.get("stream") is True else None


def _openai(obj: dict[str, Any]) -> _OpenAIDialect | None:
    return _OpenAIDialect() if obj.get("stream") is True else None


def _error_response(message: str, error_type: str, status: int) -> Response:
    """TGI's own error body for the answers the gateway gives itself (413, an unreachable upstream)."""
    return JSONResponse(tgi_error(message, error_type), status_code=status)


def create_tgi_gateway(upstream_url: str, config: StreamConfig | None = None, *,
                       timeout: httpx.Timeout | None = None, stream_idle_timeout: float | None = 60.0,
                       transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The TGI-compatible gateway app for the TGI server at ``upstream_url`` (``http://host:port``; several,
    comma-separated, make a failover list: ``transports.failover``).

    ``timeout`` is for the upstream: by default connecting may take 10 s and reading has no limit, because a
    non-streaming TGI request may queue and generate for minutes. A stream that stays silent for
    ``stream_idle_timeout`` seconds (TGI sends a keep-alive every 15 s) is ended with an ``incomplete_generation``
    event; None waits forever. ``transport`` lets tests and embedders route the upstream traffic.
    """
    relay = gateway_relay(upstream_url, "TGI", TGIGatewayError, _error_response, config or StreamConfig(),
                          timeout=timeout, stream_idle_timeout=stream_idle_timeout, transport=transport,
                          stream_headers=SSE_HEADERS)
    app = create_gateway_app(relay, [
        ("/generate_stream", _generate_stream),
        ("/", _compat),
        ("/v1/chat/completions", _openai),
        ("/v1/completions", _openai),
    ])
    app.state.tgi_upstream = relay.base_url
    return app
