"""Protocol constants both ends must agree on, defined once: header names, close codes, the event-id format
and the datagram budget. Stdlib only, so the client, the transports and the simulator can all import it."""

from __future__ import annotations

from dataclasses import dataclass

from eloquent_plugins.core.errors import EloquentError

# -- HTTP header names -------------------------------------------------------------------------------------------
STREAM_HEADER = "x-eloquent-stream"
"""Response: the stream's resume token (SSE and HTTP/3); a reconnect sends ``<token>:<index>`` as Last-Event-ID."""
TRANSPORT_HEADER = b"eloquent-transport"
"""Request: ``datagram`` asks for Eloquent datagrams; response: ``datagram`` confirms the body is control
records (see ``core.control``) and the events travel as HTTP/3 datagrams on this request."""
SCHEME_HEADER = b"eloquent-scheme"
"""Request: ``eloquent`` (default), ``duplicate`` or ``stream`` -- which delivery the front end uses."""
REQUEST_ID_HEADER = b"eloquent-request-id"
"""Response: an id for this request, to look up server-side timings in-process (benchmarks)."""
DATAGRAM = b"datagram"
ALT_SVC_HEADER = b"alt-svc"
"""Response on TCP (RFC 7838): ``h3=":PORT"; ma=SECONDS`` -- where the same origin answers HTTP/3 (UDP)."""
DELIVERY_HEADER = "eloquent-delivery"
"""Set by the client's httpx transports on each response: ``datagram``, ``h3-stream`` or ``sse``."""
RESUME_QUERY_PARAM = "last_event_id"
"""Query parameter that stands in for the Last-Event-ID header (clients that cannot set headers)."""

# -- QUIC application close / reset codes ------------------------------------------------------------------------
# Eloquent protocol errors close with ProtocolError.code (0x1 generic, 0x2 decode, 0x3 limit, 0x4 violation);
# those values are unassigned in the HTTP/3 registry.
H3_NO_ERROR = 0x100
H3_INTERNAL_ERROR = 0x102
H3_EXCESSIVE_LOAD = 0x107
"""RFC 9114 section 8.1: a connection the listener closed to stay within its connection caps."""
H3_REQUEST_CANCELLED = 0x10C
H3_DATAGRAM_ERROR = 0x33

# -- Datagram budget ---------------------------------------------------------------------------------------------
QUIC_MAX_DATAGRAM_SIZE = 1350
"""UDP payload size both ends use (aioquic's default is 1200; loopback and most paths carry 1350)."""
PACKET_OVERHEAD = 64
"""QUIC short header + DATAGRAM frame + HTTP/3 quarter-stream-id + AEAD tag, rounded up: what an Eloquent packet
must leave free inside one UDP payload."""

# -- Event ids ---------------------------------------------------------------------------------------------------
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class BadEventId(EloquentError, ValueError):
    """A Last-Event-ID that is not ``<token>:<index>`` or ``<token>``."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    token: str
    after: int
    """Index of the last event the client has; -1 when it has none (resume from the start)."""


def format_event_id(token: str, index: int) -> str:
    """The id of event ``index`` of stream ``token``: what SSE ``id:`` carries and a reconnect sends back."""
    return f"{token}:{index}"


def parse_event_id(value: str) -> ResumePoint:
    """Read an event id (``<token>:<index>``, or a bare ``<token>`` for "from the start"); ASCII digits only."""
    token, sep, index = value.strip().rpartition(":")
    if not sep:
        token, index = value.strip(), "-1"
    if not (16 <= len(token) <= 64) or not set(token) <= _TOKEN_CHARS:
        raise BadEventId("Last-Event-ID is not an id this server issued")
    if not (index.isascii() and (index.isdigit() or index == "-1")) or len(index) > 18:
        raise BadEventId("Last-Event-ID has a malformed event index")
    return ResumePoint(token, int(index))
