"""``CorsMiddleware``: let browser pages on other origins stream from this server (``--cors-origin``).

Why our own and not Starlette's: the point is the stream-id header. A page on another origin can read a response
header only if ``Access-Control-Expose-Headers`` names it, and without ``x-eloquent-stream`` a browser client
cannot resume (it never learns the stream id). Pure ASGI, no dependencies, so ``eloquent serve`` and the adapters
can put it outermost. Preflights (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin are
answered here, never reaching the app; other requests pass through and get the headers on their response start.

A POST from a page on another origin with a content type a form could send (``text/plain``, form encodings: no
preflight in any browser) is refused here with 415 before the app starts a generation: with CORS configured, a
cross-origin POST must be JSON, so the browser asks first (issue 28). ``OriginPolicy`` is the same rule for the
WebTransport sessions of the HTTP/3 front end, where browsers apply no CORS at all and the server must check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

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


DEFAULT_PORTS = {"https": 443, "http": 80}
SIMPLE_TYPES = (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data", b"")
"""Content types a page may POST cross-origin without a preflight (an absent one counts as text/plain)."""


def host_port(authority: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` (``[v6]:port`` too) lower-cased, or None when the port is not a number."""
    host, port = authority, ""
    if authority.startswith("["):
        end = authority.find("]")
        host, port = authority[:end + 1], authority[end + 2:] if authority[end + 1:end + 2] == ":" else ""
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return host.lower(), int(port) if port else default_port


def origin_site(origin: str) -> tuple[str, int] | None:
    """The host and port of an ``Origin`` value (``scheme://host[:port]``); None for ``null`` or anything else."""
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme.lower() not in DEFAULT_PORTS or not rest or "/" in rest.rstrip("/"):
        return None
    return host_port(rest.rstrip("/"), DEFAULT_PORTS[scheme.lower()])


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """Which pages may use this server: same-origin ones always, and the ``--cors-origin`` list (``*``: any).

    Same-origin means the page's host and port are the server's (``authority``, the Host or ``:authority`` the
    request came to, or one of ``page_ports`` on that host: the TCP port pages are served from when the HTTP/3
    port differs); the scheme is not compared, so a page at ``http://127.0.0.1:8000`` may open a session to
    ``https://127.0.0.1:8000`` (the same server's UDP port). No ``Origin`` at all is a non-browser client."""

    origins: tuple[str, ...] = ()
    page_ports: tuple[int, ...] = ()

    def allows(self, origin: bytes | None, authority: bytes | None) -> bool:
        if origin is None:
            return True
        text = origin.decode("latin-1").strip()
        if "*" in self.origins or text.rstrip("/") in self.origins:
            return True
        return self.same_origin(text, authority)

    def same_origin(self, origin: str, authority: bytes | None, default_port: int = 443) -> bool:
        """``default_port``: the authority's when it names none (443 for HTTP/3; the request scheme's on TCP)."""
        page = origin_site(origin)
        server = host_port(authority.decode("latin-1"), default_port) if authority else None
        if page is None or server is None or page[0] != server[0]:
            return False
        return page[1] == server[1] or page[1] in self.page_ports


def json_content(content_type: bytes | None) -> bool:
    """``application/json`` or any ``+json`` type: what a browser must preflight before sending cross-origin."""
    media = (content_type or b"").split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def simple_post(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """A POST a page could have sent cross-origin without asking first (not JSON: no preflight)."""
    return scope["method"] == "POST" and not json_content(headers.get(b"content-type"))


async def refuse_simple_post(send: Send) -> None:
    body = json.dumps({"error": {"message": "a cross-origin POST must have Content-Type: application/json "
                                            "(so the browser asks first)", "type": "invalid_request_error",
                                 "code": "unsupported_media_type"}}).encode()
    await send({"type": "http.response.start", "status": 415,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


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
        origin = headers.get(b"origin")
        if (self.origins and origin is not None and simple_post(scope, headers)
                and not OriginPolicy().same_origin(origin.decode("latin-1"), headers.get(b"host"),
                                                   DEFAULT_PORTS.get(scope.get("scheme", "http"), 80))):
            await refuse_simple_post(send)  # a form-like cross-origin POST: the generation never starts
            return
        allow = self.allowed(origin)
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


__all__ = ["EXPOSED", "CorsMiddleware", "OriginPolicy", "json_content", "origin_site", "parse_origins"]
