"""Reaching the client's connection from the ASGI layer: the ``eloquent.socket`` scope extension.

Why: an asyncio server writes what the app ``send``s into the transport's buffer and hands it to the kernel as
the client reads. A client that never reads leaves that buffer full (uvicorn pauses the app's ``send`` above
asyncio's 64 KiB high-water mark, but what is already buffered stays), and a plain ``transport.close()`` waits
for it to drain, which such a client never allows: after the middleware cut it, the buffer, the protocol and its
request objects stayed in memory until the client itself hung up (measured: ~69 KiB of buffer plus ~30 KiB of
objects per never-reading connection, held for as long as the socket stayed open). ASGI has no way to say
"drop this connection now", nor to ask how many sent bytes the server still holds, so a server that can tell
puts two callables in ``scope["extensions"]["eloquent.socket"]``:

* ``abort()``: close the connection at once, dropping the bytes not yet handed to the kernel
  (``asyncio.Transport.abort``); the app then sees ``http.disconnect``.
* ``unsent()``: bytes the server holds for this connection, written by the app and not yet taken by the kernel
  (``asyncio.WriteTransport.get_write_buffer_size``).

``eloquent serve`` sets it (``request_timeouts.HeaderTimeoutH11Protocol``). Under a server that does not (vLLM's
or any other uvicorn, hypercorn, the HTTP/3 front end) nothing changes: a cut connection ends when the app does,
and the memory budget counts a suspended ``send`` as ``STALLED_SEND_BYTES`` instead of the exact figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SOCKET_EXTENSION = "eloquent.socket"
"""``scope["extensions"]`` key: ``{"abort": () -> None, "unsent": () -> int}`` (see the module docstring)."""
WRITE_HIGH_WATER = 16 << 10
"""The write high-water mark ``eloquent serve`` gives each connection's transport (asyncio's default: 64 KiB).
Above it uvicorn suspends the app's ``send``, so what a client that does not read leaves in the server's buffer
is this plus one write; the rest waits in the stream log, where ``max_queued_bytes`` and the memory budget see
it. A client that reads is not slowed: the kernel's send buffer (``socket_send_buffer``) takes its bytes first."""
STALLED_SEND_BYTES = 64 << 10
"""What the memory budget counts for a connection whose ``send`` is suspended when the server cannot say how
much it holds: asyncio's default write high-water mark, above which uvicorn (h11 and httptools) suspends it."""


@dataclass(frozen=True, slots=True)
class SocketControl:
    """The client's connection, as far as the server lets the app reach it."""

    abort: Callable[[], None]
    """Close now, dropping unsent bytes."""
    unsent: Callable[[], int]
    """Bytes written by the app that the kernel has not taken yet."""


def socket_control(scope: Mapping[str, Any]) -> SocketControl | None:
    """The request's ``eloquent.socket`` extension, or None when its server does not offer one (or a malformed
    one: then the middleware behaves as under any other server)."""
    ext = (scope.get("extensions") or {}).get(SOCKET_EXTENSION)
    if not isinstance(ext, Mapping):
        return None
    abort, unsent = ext.get("abort"), ext.get("unsent")
    if not callable(abort) or not callable(unsent):
        return None
    return SocketControl(abort, unsent)


def socket_extension(transport: Any) -> dict[str, Callable[..., Any]]:
    """The extension's value for an asyncio transport (what a server puts in each request's scope)."""

    def unsent() -> int:
        # A closed TLS transport has no SSL protocol left to ask (asyncio's ``get_write_buffer_size`` then raises
        # AttributeError): it holds nothing any more. Asked from the memory budget's accounting, for every live
        # stream, so a raise here failed new requests (500) and stopped the budget's tick.
        try:
            return int(transport.get_write_buffer_size())
        except (AttributeError, RuntimeError):
            return 0

    return {"abort": transport.abort, "unsent": unsent}
