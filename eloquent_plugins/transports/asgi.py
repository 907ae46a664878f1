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
