"""Stream tokens, event ids and caller identity for resumable SSE.

An event id is ``<token>:<index>``. The token is 128 random bits (``secrets``), so ids cannot be guessed; a
resume must also come from the caller that started the stream (the identity hash stored with it).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

Scope = MutableMapping[str, Any]
IdentityFunction = Callable[[Scope], "str | bytes | None"]

RESUME_QUERY_PARAM = "last_event_id"
STREAM_HEADER = "x-eloquent-stream"
DEFAULT_IDENTITY_HEADERS = (b"authorization", b"x-api-key", b"api-key")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def new_token() -> str:
    return secrets.token_urlsafe(16)


def new_stream_id() -> str:
    """The correlation id in logs and hooks; not a secret (the token is)."""
    return "s-" + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class ResumePoint:
    token: str
    after: int
    """Index of the last event the client has; -1 when it has none (resume from the start)."""


class BadEventId(ValueError):
    """A Last-Event-ID that is not ``<token>:<index>`` or ``<token>``."""


def parse_event_id(value: str) -> ResumePoint:
    token, sep, index = value.strip().rpartition(":")
    if not sep:
        token, index = value.strip(), "-1"
    if not (16 <= len(token) <= 64) or not set(token) <= _TOKEN_CHARS:
        raise BadEventId("Last-Event-ID is not an id this server issued")
    if not (index.isascii() and (index.isdigit() or index == "-1")) or len(index) > 18:
        raise BadEventId("Last-Event-ID has a malformed event index")
    return ResumePoint(token, int(index))


def resume_request(scope: Scope) -> str | None:
    """The raw Last-Event-ID of a request: the header, else the ``last_event_id`` query parameter."""
    for name, value in scope["headers"]:
        if name == b"last-event-id":
            return value.decode("latin-1")
    query: bytes = scope.get("query_string", b"")
    if query and b"last_event_id=" in query:
        for key, value in parse_qsl(query.decode("latin-1")):
            if key == RESUME_QUERY_PARAM:
                return value
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
