"""What a gateway adapter hands the shared upstream relay, and what it writes those with.

A leaf of ``proxy.py`` and ``failover.py``: both relays (one upstream, several) read the same ``Dialect`` and the
same bounded error body, so they live here rather than in either (where the other would import its owner back).
The adapters (TGI, OpenAI-compatible) write their dialects with the JSON helpers below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import httpx
from starlette.responses import Response

__all__ = ["Chooser", "Dialect", "ErrorResponse", "MAX_ERROR_BODY", "dump_json", "error_text", "json_object",
           "read_limited"]

MAX_ERROR_BODY = 64 * 1024
"""The most of an upstream's rejection body that is read (and passed to ``Dialect.rejected``)."""


class Dialect(Protocol):
    """One stream's schema knowledge: which payloads end it, and the error events in the route's own shape."""

    def observe(self, payload: bytes) -> None:
        """Every relayed payload, in order (to learn whether the stream completed)."""

    def error(self, message: str, error_type: str, status: int) -> list[bytes]:
        """Payloads for a failure the upstream could not report (unreachable, broken, silent)."""

    def rejected(self, status: int, body: bytes) -> list[bytes]:
        """Payloads for an upstream that answered a non-200 after our 200 went out."""

    def unfinished(self) -> list[bytes]:
        """Payloads to add when the upstream body ended cleanly: none if the stream was complete."""


ErrorResponse = Callable[[str, str, int], Response]
"""``(message, error_type, status)`` -> a plain (non-stream) error response in the upstream's own shape."""
Chooser = Callable[[dict[str, Any]], Dialect | None]
"""A streaming route's test of a JSON request body: the stream's dialect, or None to proxy it unchanged."""


async def read_limited(response: httpx.Response) -> bytes:
    """An upstream's (error) body, at most ``MAX_ERROR_BODY`` bytes of it: an endless one is cut, not buffered."""
    out = bytearray()
    async for chunk in response.aiter_bytes():
        out += chunk
        if len(out) >= MAX_ERROR_BODY:
            break
    return bytes(out[:MAX_ERROR_BODY])


def dump_json(value: Any) -> bytes:
    """Compact JSON, non-ASCII as is: how the servers write their events."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None (not JSON, or not an object)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def error_text(obj: dict[str, Any] | None, body: bytes) -> str:
    """The message of an upstream error body: ``error.message``, ``error``, ``message``, else the text."""
    if obj is not None:
        err = obj.get("error")
        if isinstance(err, dict):
            err = err.get("message")
        if err is None and obj.get("object") == "error":
            err = obj.get("message")
        if err is not None:
            return str(err)
    return body.decode("utf-8", errors="replace").strip()
