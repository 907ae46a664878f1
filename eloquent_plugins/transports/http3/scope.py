"""The ASGI scope of an HTTP/3 request (or of a WebTransport stream's request): what the app sees of it."""

from __future__ import annotations

from typing import Any


def http_scope(method: bytes | None, path: bytes | None, headers: list[tuple[bytes, bytes]], *,
               client: Any, server: Any) -> dict[str, Any]:
    """The ASGI scope of an HTTP/3 request (or a WebTransport stream's request)."""
    raw_path, _, query = (path or b"/").partition(b"?")
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "3",
        "method": (method or b"GET").decode("latin-1"), "scheme": "https",
        "path": raw_path.decode("utf-8", errors="replace"), "raw_path": raw_path, "query_string": query,
        "root_path": "", "headers": headers, "client": client,
        "server": tuple(server[:2]) if server else None, "extensions": {},
    }
