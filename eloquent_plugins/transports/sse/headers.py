"""Response headers for streams: keep proxies from buffering or closing, and drop hop-by-hop fields.

``Connection`` and friends are connection-specific (they make an HTTP/2 or HTTP/3 message malformed), so the
middleware removes them instead of adding them as sse-starlette does.
"""

from __future__ import annotations

from collections.abc import Iterable

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
                        b"upgrade", b"content-length"})


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
        if lname in HOP_BY_HOP or lname in (b"x-accel-buffering", b"x-eloquent-stream"):
            continue
        if lname == b"cache-control":
            if b"no-store" in value.lower():
                cache_control = value
            continue
        out.append((lname, value))
    out.append((b"cache-control", cache_control))
    out.append((b"x-accel-buffering", b"no"))
    if token is not None:
        out.append((b"x-eloquent-stream", token.encode()))
    return out


def json_error(status: int, message: str, code: str, *,
               type_: str = "invalid_request_error") -> tuple[int, Headers, bytes]:
    """A plain HTTP error in the OpenAI shape, for resume requests that cannot be served."""
    import json

    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store")], body
