"""``AltSvcMiddleware``: advertise the HTTP/3 front end on every TCP response (RFC 7838 ``Alt-Svc``).

A client that reached the server over TCP learns from ``Alt-Svc: h3=":PORT"; ma=SECONDS`` on which UDP port the
same origin speaks HTTP/3, so ``transport="auto"`` (``eloquent_client``) need not be told the port, and can fall
back to TCP when that port does not answer. Responses to HTTP/3 requests (the front end hosts the same app) get
no header: the client is already there.
"""

from __future__ import annotations

from collections.abc import Awaitable

from eloquent_plugins.core.protocol import ALT_SVC_HEADER
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_AGE = 86400
"""Seconds a client may remember the advertisement (the RFC's default)."""


def alt_svc_value(port: int, max_age: int = DEFAULT_MAX_AGE) -> bytes:
    return f'h3=":{port}"; ma={max_age}'.encode()


class AltSvcMiddleware:
    """Adds ``Alt-Svc`` to the response start of HTTP/1.x requests while ``port`` is set (None: nothing added,
    so a server can build the app before it knows which UDP port the front end got)."""

    def __init__(self, app: ASGIApp, port: int | None, *, max_age: int = DEFAULT_MAX_AGE) -> None:
        self.app = app
        self.port = port
        self.max_age = max_age

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        port = self.port
        if scope["type"] != "http" or port is None or scope.get("http_version") == "3":
            await self.app(scope, receive, send)
            return
        value = alt_svc_value(port, self.max_age)

        def with_alt_svc(message: Message) -> Awaitable[None]:
            # A plain function handing back the server's ``send``: it runs per streamed event, where a coroutine of
            # ours would cost every token (issue 16).
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if bytes(k).lower() != ALT_SVC_HEADER]
                message = {**message, "headers": [*headers, (ALT_SVC_HEADER, value)]}
            return send(message)

        await self.app(scope, receive, with_alt_svc)


__all__ = ["DEFAULT_MAX_AGE", "AltSvcMiddleware", "alt_svc_value"]
