"""``CorsMiddleware``: let browser pages on other origins stream from this server (``--cors-origin``).

Why our own and not Starlette's: the point is the stream-id header. A page on another origin can read a response
header only if ``Access-Control-Expose-Headers`` names it, and without ``x-eloquent-stream`` a browser client
cannot resume (it never learns the stream id). Pure ASGI, no dependencies, so ``eloquent serve`` and the adapters
can put it outermost. Preflights (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin are
answered here, never reaching the app; other requests pass through and get the headers on their response start.
"""

from __future__ import annotations

from collections.abc import Iterable

from eloquent_plugins.core.protocol import DELIVERY_HEADER, STREAM_HEADER
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Scope, Send

EXPOSED = (STREAM_HEADER, DELIVERY_HEADER, "retry-after")
"""Response headers a cross-origin page may read: the stream id (resume), the delivery, Retry-After (429/503)."""
METHODS = "GET, POST, OPTIONS"
MAX_AGE = 600
"""Seconds a browser may cache a preflight answer."""


def parse_origins(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"*"``, ``"https://a.example,https://b.example"`` or a list of those; trailing slashes dropped."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else [p for item in text for p in item.split(",")]
    return tuple(p.strip().rstrip("/") for p in parts if p.strip())


class CorsMiddleware:
    """Cross-origin headers for ``origins`` (``("*",)``: any origin; empty: the middleware does nothing)."""

    def __init__(self, app: ASGIApp, origins: str | Iterable[str], *, expose: Iterable[str] = EXPOSED) -> None:
        self.app = app
        self.origins = parse_origins(origins)
        self.any = "*" in self.origins
        self.expose = ", ".join(expose).encode()

    def allowed(self, origin: bytes | None) -> bytes | None:
        """The ``Access-Control-Allow-Origin`` value for this request, None when the origin is not allowed."""
        if origin is None or not self.origins:
            return None
        if self.any:
            return b"*"
        return origin if origin.decode("latin-1").rstrip("/") in self.origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {bytes(k).lower(): bytes(v) for k, v in scope.get("headers", ())}
        allow = self.allowed(headers.get(b"origin"))
        if allow is None:
            await self.app(scope, receive, send)
            return
        vary = [] if self.any else [(b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            requested = headers.get(b"access-control-request-headers")
            answer = [(b"access-control-allow-origin", allow), (b"access-control-allow-methods", METHODS.encode()),
                      (b"access-control-max-age", str(MAX_AGE).encode()), (b"content-length", b"0"), *vary]
            if requested:
                answer.append((b"access-control-allow-headers", requested))
            await send({"type": "http.response.start", "status": 204, "headers": answer})
            await send({"type": "http.response.body", "body": b""})
            return
        added = [(b"access-control-allow-origin", allow), (b"access-control-expose-headers", self.expose), *vary]

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ())
                        if not bytes(k).lower().startswith(b"access-control-")]
                message = {**message, "headers": [*kept, *added]}
            await send(message)

        await self.app(scope, receive, with_cors)


__all__ = ["EXPOSED", "CorsMiddleware", "parse_origins"]
