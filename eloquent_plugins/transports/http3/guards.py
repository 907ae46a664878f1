"""Admission and abuse guards of the HTTP/3 front end (sans-I/O): what a connection may ask of it.

A request is refused with a typed JSON error before the app sees it (missing pseudo-headers, unknown scheme,
too many concurrent requests on the connection, a declared body over the limit); a body is counted as it
arrives, held against the server's ledger of incomplete bodies, and must keep arriving at its pace
(``transports/body_budget.py``); datagrams for no live stream are allowed only at a bounded rate.
Errors a peer causes on the wire (garbage, lies, floods) close the connection with ``ProtocolError.code``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import PACKET_OVERHEAD, QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.transports.body_budget import BodyClock, BodyRefusal, HeldBodies, HeldBody
from eloquent_plugins.transports.config import StreamConfig

STREAM_HIGH_WATER = 256 << 10
"""Bytes buffered on a plain response stream before ``send`` waits for the client to read."""
UNROUTABLE_BURST = 256
UNROUTABLE_RATE = 64.0
"""Datagrams for no live Eloquent stream (late acks are normal) a client may send: a token bucket."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """An error response the front end sends instead of (or before) the app's."""

    status: int
    message: str
    code: str | int
    """OpenAI's ``error.code`` (a string name, or the status for timeouts)."""
    error_type: str = "invalid_request_error"
    retry_after: int | None = None
    """Seconds for a ``Retry-After`` header (a refusal that may pass later)."""

    @classmethod
    def of(cls, refusal: BodyRefusal) -> Rejection:
        return cls(refusal.status, refusal.message, refusal.code, refusal.error_type, refusal.retry_after)

    def extra_headers(self) -> list[tuple[bytes, bytes]]:
        """Response fields beside the status and the JSON body's."""
        return [] if self.retry_after is None else [(b"retry-after", str(self.retry_after).encode())]


class TokenBucket:
    __slots__ = ("_at", "_tokens", "capacity", "rate")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity, self.rate, self._tokens, self._at = capacity, rate, capacity, now

    def take(self, now: float) -> bool:
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def unroutable_bucket(now: float) -> TokenBucket:
    return TokenBucket(UNROUTABLE_BURST, UNROUTABLE_RATE, now)


def connection_limits(limits: Limits) -> Limits:
    """The limits a connection's streams run under: the datagram budget cut so one Eloquent packet always fits
    one QUIC packet (a DATAGRAM frame cannot be split; one too large would jam aioquic's queue)."""
    budget = min(limits.max_datagram_size, QUIC_MAX_DATAGRAM_SIZE - PACKET_OVERHEAD)
    return replace(limits, max_datagram_size=budget)


def body_too_large(limit: int) -> Rejection:
    return Rejection(413, f"request body exceeds {limit} bytes", "request_too_large")


def admit(config: StreamConfig, *, method: bytes | None, path: bytes | None, bad_scheme: str | None,
          running: int, content_length: bytes | None) -> Rejection | None:
    """Whether a new request may reach the app; ``running`` counts the connection's requests with a live app."""
    limits = config.limits
    if method is None or path is None:
        return Rejection(400, "missing :method or :path", "invalid_request")
    if bad_scheme is not None:
        return Rejection(400, bad_scheme, "invalid_eloquent_scheme")
    if running >= limits.max_streams:
        return Rejection(503, f"more than {limits.max_streams} concurrent requests on one connection",
                         "too_many_streams")
    if content_length is not None and (not content_length.isdigit()
                                       or int(content_length) > config.max_request_bytes):
        return body_too_large(config.max_request_bytes)
    return None


class BodyGuard:
    """The request body as it arrives: its size against ``max_request_bytes``, what it holds in the server's
    ledger (``HeldBody``: from ``hold`` until it is in, refused or gone) and its pace (``BodyClock``: one lazily
    moved timer per request, not one per chunk)."""

    __slots__ = ("clock", "declared", "done", "held", "ledger", "limit", "received")

    def __init__(self, config: StreamConfig, now: float, ledger: HeldBodies | None = None) -> None:
        self.limit = config.max_request_bytes
        self.ledger = ledger
        """Where refusals are counted (and bodies held, from ``hold``)."""
        self.clock = BodyClock.from_config(config, now)
        self.received = 0
        self.declared = 0
        """The request's ``content-length`` (0: none)."""
        self.held: HeldBody | None = None
        self.done = False
        """The body ended, was refused, or is no longer wanted: later chunks are dropped."""

    @property
    def timeout(self) -> float:
        return self.clock.timeout

    def hold(self, held: HeldBody, declared: int = 0) -> None:
        """The body comes after the head: from now on it holds ``held``. Its reserve counts at once, but the
        ceilings are checked only from its first chunk that leaves it incomplete (with the rest of its ``declared``
        length): a body that comes whole with its head is never refused for what others hold."""
        self.held, self.declared = held, declared
        held.hold(0, check=False)

    def feed(self, size: int, ended: bool, now: float) -> Rejection | None:
        """Count a chunk; a Rejection when the body went over a limit (the guard is then done)."""
        self.received += size
        if self.received > self.limit:
            self.release()
            if self.ledger is not None:
                self.ledger.count("too_large")
            return body_too_large(self.limit)
        self.clock.arrived(size, now)
        if ended:
            self.release()
            return None
        refusal = (self.held.hold(size, expected=max(0, self.declared - self.received)) if self.held is not None
                   else None)
        if refusal is not None:
            self.release()
            return Rejection.of(refusal)
        return None

    def deadline(self) -> float | None:
        """When the body counts as stalled or too slow if no byte moves it (None: no rule on, or the body is in)."""
        return None if self.done else self.clock.deadline()

    def stalled(self, now: float) -> Rejection:
        """The body stopped arriving, or arrives under its pace: it is no longer wanted, and this is the answer."""
        refusal = self.clock.refusal(now)
        if self.ledger is not None:
            self.ledger.count(refusal.reason)
        self.release()
        return Rejection.of(refusal)

    def release(self) -> None:
        """No more of this body is wanted (in, refused, or its request gone): later chunks are dropped, and what it
        held in the ledger is freed."""
        self.done = True
        if self.held is not None:
            self.held.release()
