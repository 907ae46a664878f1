"""What the client holds on a server's word, bounded (issue 28): error bodies read before the caller sees them,
the Alt-Svc endpoints it will follow, and the core's protocol errors turned into ``ClientError`` subclasses.

Why its own module: a hostile (or broken) server decides how long a body is and what ``Alt-Svc`` says; each
ceiling here is one small function the request paths call, so the rule is written once.
"""

from __future__ import annotations

from collections.abc import Collection

import httpx

from eloquent_client.errors import ClientError
from eloquent_client.paths import MAX_ALT_SVC_AGE
from eloquent_plugins.core.errors import EloquentError, LimitExceeded, ProtocolError

MAX_ERROR_BODY = 64 << 10
"""Bytes of a non-200 (or non-SSE) body kept for ``HTTPStatusError``; the rest is not read (the response is
closed). Error bodies are JSON a few hundred bytes long: this leaves room for any honest one."""


class ServerLimitExceeded(ClientError, LimitExceeded):
    """The server sent more than a limit allows (an SSE message over 4 MiB, out-of-order events past
    ``max_buffered_bytes``): a ``ClientError`` and still the core's ``LimitExceeded``. Not a ``StreamBroken``: a
    resume would meet the same bytes again."""


class ServerProtocolError(ClientError, ProtocolError):
    """The server broke the protocol (a malformed control record, a datagram it should never have sent)."""


def client_error(exc: EloquentError) -> ClientError:
    """``exc`` as a ``ClientError`` (core errors become the subclasses above, the cause kept)."""
    if isinstance(exc, ClientError):
        return exc
    kind: type[ClientError] = ServerLimitExceeded if isinstance(exc, LimitExceeded) else ServerProtocolError
    converted = kind(str(exc))
    converted.__cause__ = exc
    return converted


async def read_capped(response: httpx.Response, limit: int = MAX_ERROR_BODY) -> bytes:
    """At most ``limit`` bytes of ``response``'s body; a longer (or endless) body is cut there, not read on."""
    out = bytearray()
    async for chunk in response.aiter_bytes():
        out += chunk
        if len(out) >= limit:
            break
    return bytes(out[:limit])


def alt_svc_port(learned: int | None, origin_port: int, allowed: Collection[int] | None,
                 verify: bool | str) -> int | None:
    """The advertised HTTP/3 port the client may use, or None: only a port the caller allowed (``allowed``; None:
    the origin's own port only), and another port than the origin's never with ``verify=False`` (nothing proves
    the service there is the origin's, and the request carries the caller's credentials)."""
    if learned is None:
        return None
    if learned == origin_port:
        return learned
    if verify is False or learned not in (allowed or ()):
        return None
    return learned


__all__ = ["MAX_ALT_SVC_AGE", "MAX_ERROR_BODY", "ServerLimitExceeded", "ServerProtocolError", "alt_svc_port",
           "client_error", "read_capped"]
