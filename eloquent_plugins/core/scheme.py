"""Which delivery a request gets from the HTTP/3 front end, chosen per request by header.

``eloquent``: datagrams, every packet carries the whole unacked run. ``duplicate``: datagrams, each packet
carries only new events and is sent twice (the packet-duplication baseline, same state machine).
``stream``: the ordinary HTTP/3 response on the reliable request stream (the retransmission baseline).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from enum import Enum

from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import DATAGRAM, SCHEME_HEADER, TRANSPORT_HEADER
from eloquent_plugins.core.sender import SenderConfig


class UnknownScheme(EloquentError, ValueError):
    """A request's ``eloquent-scheme`` names no scheme (the front end answers 400 ``invalid_eloquent_scheme``).
    Still a ValueError for callers written before the typed errors."""


class Scheme(str, Enum):
    ELOQUENT = "eloquent"
    DUPLICATE = "duplicate"
    STREAM = "stream"


def scheme_for(headers: Iterable[tuple[bytes, bytes]]) -> Scheme:
    """The scheme a request asks for: ``stream`` unless ``eloquent-transport: datagram`` is present, then the
    ``eloquent-scheme`` header (default ``eloquent``). An unknown scheme name raises ``UnknownScheme``."""
    transport = None
    name = None
    for key, value in headers:
        if key == TRANSPORT_HEADER:
            transport = value.strip().lower()
        elif key == SCHEME_HEADER:
            name = value.strip().lower().decode("latin-1")
    if name is not None:
        try:
            scheme = Scheme(name)
        except ValueError:
            raise UnknownScheme(f"unknown eloquent-scheme {name!r} (eloquent, duplicate or stream)") from None
        if transport != DATAGRAM and scheme is not Scheme.STREAM:
            return Scheme.STREAM
        return scheme
    return Scheme.ELOQUENT if transport == DATAGRAM else Scheme.STREAM


def sender_config_for(scheme: Scheme, *, limits: Limits, keepalive: KeepAlivePolicy) -> SenderConfig:
    """The core sender settings behind a datagram scheme, with the connection's ``limits`` and ``keepalive``."""
    base = SenderConfig(limits=limits, keepalive=keepalive)
    if scheme is Scheme.DUPLICATE:
        return replace(base, carry_unacked=False, copies=2)
    return base
