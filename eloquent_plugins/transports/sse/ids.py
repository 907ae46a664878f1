"""The ASGI side of resumable SSE: new stream tokens, the resume request's raw id, and caller identity.

The event-id format itself (``<token>:<index>``) is ``core.protocol``'s. The token is 128 random bits
(``secrets``), so ids cannot be guessed; a resume must also come from the caller that started the stream (the
identity hash stored with it).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from urllib.parse import parse_qsl

from eloquent_plugins.core.protocol import RESUME_QUERY_PARAM
from eloquent_plugins.transports.asgi import Scope

IdentityFunction = Callable[[Scope], "str | bytes | None"]

DEFAULT_IDENTITY_HEADERS = (b"authorization", b"x-api-key", b"api-key")
RESUME_QUERY_KEY = RESUME_QUERY_PARAM.encode() + b"="
"""What a query string holding a resume id contains (a cheap test before parsing it)."""


def new_token() -> str:
    return secrets.token_urlsafe(16)


def new_stream_id() -> str:
    """The correlation id in logs and hooks; not a secret (the token is)."""
    return "s-" + secrets.token_hex(6)


def resume_request(scope: Scope) -> str | None:
    """The raw Last-Event-ID of a request: the header, else the ``last_event_id`` query parameter (parse it
    with ``core.protocol.parse_event_id``); None when there is none.

    An empty value is no id, as in the SSE spec (a browser sends the header only when its last event id is not
    the empty string, and an empty ``id:`` field resets it to "none"): the request is a new one, not a resume.
    The query parameter follows the header's rule; the first one present decides."""
    for name, value in scope["headers"]:
        if name == b"last-event-id":
            return value.decode("latin-1") if value.strip() else None
    query: bytes = scope.get("query_string", b"")
    if query and RESUME_QUERY_KEY in query:
        for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if key == RESUME_QUERY_PARAM:
                return value if value.strip() else None
    return None


def header_identity(scope: Scope) -> bytes:
    """Default identity: the request's credentials (Authorization, X-API-Key, Api-Key headers)."""
    parts = [name + b"\x00" + value for name, value in scope["headers"] if name in DEFAULT_IDENTITY_HEADERS]
    return b"\x01".join(sorted(parts))


def _identity(scope: Scope, identity: IdentityFunction | None) -> bytes:
    raw = header_identity(scope) if identity is None else identity(scope)
    if raw is None:
        return b""
    return raw.encode() if isinstance(raw, str) else raw


def identity_hash(scope: Scope, identity: IdentityFunction | None) -> str:
    return hashlib.sha256(b"eloquent-owner\x00" + _identity(scope, identity)).hexdigest()


def client_key(scope: Scope, identity: IdentityFunction | None) -> str:
    """Who a per-client limit counts against: the caller's identity (credentials, or ``identity(scope)``), and
    for a caller without one the client address (``scope["client"]``: behind a proxy, the proxy's)."""
    raw = _identity(scope, identity)
    if raw:
        return "id:" + hashlib.sha256(b"eloquent-owner\x00" + raw).hexdigest()
    client = scope.get("client")
    return "ip:" + (str(client[0]) if client else "unknown")
