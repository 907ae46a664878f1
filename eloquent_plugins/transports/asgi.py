"""The ASGI types, once, for every transport and adapter (the ASGI spec's names)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HOOKS_EXTENSION = "eloquent.hooks"
"""Scope extension of a server that fires the stream hooks itself (the HTTP/3 front end): a dict with
``transport``, the label its hooks would give the stream, and ``claimed``. An app that fires them for the stream
(``EloquentMiddleware``) sets ``claimed`` and uses that label; the server then leaves the hooks to it, so every
hook runs once per stream (a per-event transform applied twice would change the text)."""
PACING_EXTENSION = "eloquent.send_tick"
"""Scope extension of a server that paces this request's stream itself (the HTTP/3 front end's datagram senders
with ``--send-tick``): the tick, in seconds. An app that would pace its own writes (``EloquentMiddleware``) writes at
once instead: paced twice, each event would wait up to two ticks."""


def paced_by_server(scope: Scope) -> bool:
    """Whether the server paces this request's stream to a tick (``PACING_EXTENSION``)."""
    return bool((scope.get("extensions") or {}).get(PACING_EXTENSION))
