"""Response headers for streams, and the middleware's own plain (non-stream) responses.

Stream headers keep proxies from buffering or closing, and drop hop-by-hop fields: ``Connection`` and friends are
connection-specific (they make an HTTP/2 or HTTP/3 message malformed), so the middleware removes them instead of
adding them as sse-starlette does. Error bodies take the shape of the route's codec, so a route never answers in
two formats.
"""

from __future__ import annotations

from collections.abc import Iterable

from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.protocol import STREAM_HEADER
from eloquent_plugins.transports.asgi import Send

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
                        b"upgrade", b"content-length"})
_STREAM_HEADER = STREAM_HEADER.encode()
_REPLACED = (b"x-accel-buffering", _STREAM_HEADER)


def is_event_stream(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True for ``text/event-stream`` bodies we can read (not compressed by an inner middleware)."""
    sse = False
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-type":
            sse = value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
        elif lname == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return False
    return sse


def stream_headers(headers: Iterable[tuple[bytes, bytes]], *, token: str | None) -> Headers:
    out: Headers = []
    cache_control = b"no-cache"
    for name, value in headers:
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in _REPLACED:
            continue
        if lname == b"cache-control":
            if b"no-store" in value.lower():
                cache_control = value
            continue
        out.append((lname, value))
    out.append((b"cache-control", cache_control))
    out.append((b"x-accel-buffering", b"no"))
    if token is not None:
        out.append((_STREAM_HEADER, token.encode()))
    return out


def json_error(router: CodecRouter, path: str, status: int, message: str, code: str | int, *,
               type_: str = "invalid_request_error") -> tuple[int, Headers, bytes]:
    """A plain HTTP error from this package itself (a resume it cannot serve, a refused stream, a timeout), its
    JSON body in the shape of the route at ``path`` (``CodecRouter.error_body``).

    ``code`` is the answer's machine-readable reason (``stream_not_found``, ...): OpenAI's ``code`` field;
    other shapes carry none (TGI: ``{"error", "error_type"}``, Triton: ``{"error"}``).
    """
    body = router.error_body(path, message, error_type=type_, status=status, code=code)
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store")], body


async def respond(send: Send, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole response in two ASGI messages."""
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})
    await send({"type": "http.response.body", "body": body, "more_body": False})
