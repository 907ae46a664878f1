"""What a peer can make the server hold before its request is whole: one ledger for every byte, and a pace rule.

A request body still arriving (HTTP/1.1 through ``request_timeouts.BodyTimeoutMiddleware``; HTTP/3 and WebTransport
request streams in the front end, ``http3/request.py``) and a WebTransport request head that has not ended
(``http3/webtransport.py``) stay in this process for as long as the peer keeps them open. Issue 28 measured it: one
QUIC connection with 120 bodies each stopped one byte short held +120 MiB, the same over 120 TCP connections
+123 MiB, 960 WebTransport heads that never end +86 MiB, each kept alive by a byte every 29 s. Two rules bound it:

* ``HeldBodies``, the ledger: every such byte, plus ``BODY_RESERVE`` per held request for what the server keeps
  beside its bytes, counted per connection, per source address and in all. Past ``max_body_bytes_per_connection``
  or ``max_body_bytes_per_address`` the request is refused (``413`` when this one body alone would pass the
  ceiling, else ``429``: other bodies hold the room); past ``BODY_SHARE`` of ``max_held_bytes`` in all, ``503``.
  A body that comes whole in one piece (the common case: it arrives with its head) is never refused for what
  others hold: the ceilings are checked from its first chunk that leaves it incomplete, against what it holds and
  the rest of its declared length (so one that cannot fit is refused then, not at its end).
* ``BodyClock``, the pace: no byte for ``body_timeout`` seconds is a stall (``408``, as before); and once
  ``body_rate_grace`` seconds are over, the body must keep up ``body_min_rate`` bytes/s, where bytes sent ahead
  of that pace count for at most ``body_timeout`` seconds (``408``). A byte every 29 s then no longer keeps a body
  alive: after a burst, it ends ``body_timeout`` seconds later whatever trickles in.

Why these bytes count in ``max_held_bytes`` (``sse/budget.py``, ``StreamBudget.held``) rather than in a budget of
their own: the operator sets one figure for what peers may make the process hold, and a second, parallel budget
would let the two together pass it. Why a share of it (``BODY_SHARE``) and not all of it: incomplete bodies are
the cheapest thing for a peer to hold (no engine work, no reading), so they must never be able to push the
streams that are being served out of the budget; streams may still use the whole of it while no body is held.
The per-connection and per-address ceilings keep one peer from taking even that share. Behind a reverse proxy
every request comes from the proxy's address: raise ``max_body_bytes_per_address`` there, or set it to 0.

Pure bookkeeping (no I/O, no clock of its own): the transports call it with their loop's time.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from eloquent_plugins.core.errors import ConfigError

log = logging.getLogger("eloquent_plugins.transports.body_budget")

BODY_RESERVE = 16 << 10
"""Bytes counted per held request beside its body bytes: the request's objects, the app's task waiting for the rest,
the stream state of the transport. An estimate, checked under ``eloquent serve`` (``tests/transports/
test_hostile_bodies.py``): the RSS grew by 1.2-1.5x the ledger's peak (HTTP/3: 6.0 MiB counted, +7.5 MiB; 960
WebTransport heads: 8.0 MiB, +9.8 to +11.7 MiB), the rest being the refused requests' leftovers and the allocator's."""
CHUNK_OVERHEAD = 64
"""Memory a received chunk takes beyond its bytes until the app joins them: the ``bytes`` object's header, the
ASGI message and the app's list slot (QUIC delivers ~1.2 KB chunks, so this is ~5% of a body)."""
BODY_SHARE = 0.25
"""The fraction of ``max_held_bytes`` all held bodies and heads may take together (the module docstring says why)."""
RETRY_AFTER = 1
"""``Retry-After`` seconds of a ``429``/``503`` refusal: bodies in flight are in (or refused) well within it."""
REASONS = ("too_large", "connection", "address", "budget", "too_slow", "stalled")
"""Why a held body was refused: the ``reason`` label of ``eloquent_request_bodies_refused_total``."""


@dataclass(frozen=True, slots=True)
class BodyRefusal:
    """The answer to a request whose body (or WebTransport head) may not be held any longer."""

    status: int
    message: str
    code: str | int
    """OpenAI's ``error.code``: a name, or the status for timeouts."""
    error_type: str
    reason: str
    """One of ``REASONS``."""
    retry_after: int | None = None


class BodySettings(Protocol):
    """The settings these rules read (``StreamConfig`` has them; this module does not import it: the config checks
    its values here)."""

    @property
    def body_timeout(self) -> float: ...
    @property
    def body_min_rate(self) -> int: ...
    @property
    def body_rate_grace(self) -> float: ...
    @property
    def max_request_bytes(self) -> int: ...
    @property
    def max_body_bytes_per_connection(self) -> int: ...
    @property
    def max_body_bytes_per_address(self) -> int: ...
    @property
    def max_held_bytes(self) -> int: ...


def ceiling(config: BodySettings, name: str) -> int:
    """The ceiling ``name`` in effect: never below what one whole body the server accepts takes (twice
    ``max_request_bytes`` and a reserve, room for its chunks' overhead), so that raising ``max_request_bytes``
    alone never makes every large request a 429; 0 stays off."""
    value = int(getattr(config, name))
    return max(value, 2 * config.max_request_bytes + BODY_RESERVE) if value else 0


def check_settings(config: BodySettings) -> None:
    """Refuse settings that cannot work together (``StreamConfig`` calls this)."""
    if config.body_min_rate and not max(config.body_timeout, config.body_rate_grace) > 0:
        raise ConfigError("body_min_rate needs body_rate_grace or body_timeout > 0: a body needs some time to "
                          "reach its pace")


class HeldBodies:
    """The ledger of one server (both transports share it): bytes held for incomplete requests, by connection,
    by source address and in all, against their ceilings (0: no ceiling, only counted)."""

    def __init__(self, *, per_connection: int = 0, per_address: int = 0, total: int = 0,
                 reserve: int = BODY_RESERVE) -> None:
        self.per_connection = per_connection
        self.per_address = per_address
        self.total = total
        self.reserve = reserve
        self.held = 0
        """Bytes held now, reserves included (part of ``StreamBudget.held``)."""
        self.bodies = 0
        """Requests holding bytes now."""
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._connections: dict[Hashable, int] = {}
        self._addresses: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: BodySettings) -> HeldBodies:
        for name in ("max_body_bytes_per_connection", "max_body_bytes_per_address"):
            if ceiling(config, name) != getattr(config, name):
                log.warning("%s raised to %d: one whole body of max_request_bytes (%d) must fit under it", name,
                            ceiling(config, name), config.max_request_bytes)
        return cls(per_connection=ceiling(config, "max_body_bytes_per_connection"),
                   per_address=ceiling(config, "max_body_bytes_per_address"),
                   total=int(config.max_held_bytes * BODY_SHARE))

    def open(self, connection: Hashable, address: str | None) -> HeldBody:
        """A request that may hold bytes; nothing is counted until its first ``hold``."""
        return HeldBody(self, connection, address)

    def count(self, reason: str) -> None:
        """Count a refusal (one of ``REASONS``); a stall, the pace or ``max_request_bytes`` are decided elsewhere."""
        self.refused[reason] += 1

    def held_by(self, connection: Hashable) -> int:
        return self._connections.get(connection, 0)

    def held_from(self, address: str) -> int:
        return self._addresses.get(address, 0)

    def _refusal(self, body: HeldBody, size: int) -> BodyRefusal | None:
        own = body.held + size
        if self.per_connection and self._connections.get(body.connection, 0) + size > self.per_connection:
            return _over(own, self.per_connection, "connection", "on one connection")
        if (self.per_address and body.address is not None
                and self._addresses.get(body.address, 0) + size > self.per_address):
            return _over(own, self.per_address, "address", "from one address")
        if self.total and self.held + size > self.total:
            return BodyRefusal(503, "the server holds as many incomplete request bodies as it may (memory budget); "
                               "retry shortly", "server_overloaded", "server_overloaded", "budget", RETRY_AFTER)
        return None

    def _add(self, body: HeldBody, size: int) -> None:
        self.held += size
        self._connections[body.connection] = self._connections.get(body.connection, 0) + size
        if body.address is not None:
            self._addresses[body.address] = self._addresses.get(body.address, 0) + size

    def _remove(self, body: HeldBody) -> None:
        size = body.held
        self.held -= size
        self.bodies -= 1
        _take(self._connections, body.connection, size)
        if body.address is not None:
            _take(self._addresses, body.address, size)


def _take(book: dict, key: Hashable, size: int) -> None:  # type: ignore[type-arg]
    left = book.get(key, 0) - size
    if left > 0:
        book[key] = left
    else:
        book.pop(key, None)  # no entry left behind per connection or address that held once


def _over(own: int, ceiling: int, reason: str, where: str) -> BodyRefusal:
    if own > ceiling:  # this body alone would pass it: waiting cannot help
        return BodyRefusal(413, f"request body exceeds the {ceiling} bytes a request may hold {where} while it "
                           "arrives", "request_too_large", "invalid_request_error", reason)
    return BodyRefusal(429, f"too many request bytes in flight {where}: at most {ceiling} bytes of incomplete "
                       "request bodies at once; retry when those are in", "rate_limit_exceeded", "requests", reason,
                       RETRY_AFTER)


class HeldBody:
    """What one incomplete request holds in the ledger; ``release`` it on every way out (idempotent)."""

    __slots__ = ("address", "connection", "held", "ledger", "released")

    def __init__(self, ledger: HeldBodies, connection: Hashable, address: str | None) -> None:
        self.ledger, self.connection, self.address = ledger, connection, address
        self.held = 0
        self.released = False

    def hold(self, size: int, *, expected: int = 0, check: bool = True) -> BodyRefusal | None:
        """Count ``size`` more bytes arriving in one chunk (the first call also the reserve; ``hold(0)`` only
        that); ``expected``: bytes the request declared still to come (the rest of its ``content-length``), checked
        against the ceilings but not counted, so that a body that cannot fit is refused at its first chunk, not at
        its last. A refusal, counted, when a ceiling would be passed: nothing more is counted, the caller refuses
        the request and releases it. ``check`` False counts without refusing: a request head whose body may well
        come whole in the same packet (a body that does is never held, so never refused for others' bytes)."""
        if self.released:
            return None
        add = size + CHUNK_OVERHEAD if size else 0
        if not self.held:
            add += self.ledger.reserve
        ledger = self.ledger
        refusal = ledger._refusal(self, add + expected) if check else None
        if refusal is not None:
            ledger.count(refusal.reason)
            return refusal
        if not self.held:
            ledger.bodies += 1
        self.held += add
        ledger._add(self, add)
        return None

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.held:
                self.ledger._remove(self)
                self.held = 0


class BodyClock:
    """When a body (or a WebTransport head) still arriving has had its time: ``deadline`` moves as bytes arrive,
    one lazily re-armed timer per request."""

    __slots__ = ("credit", "due", "last_at", "min_rate", "timeout")

    def __init__(self, timeout: float, min_rate: float, grace: float, now: float) -> None:
        self.timeout = timeout
        self.min_rate = min_rate
        self.credit = max(timeout, grace)
        """Seconds ahead of the pace a body may bank: bytes sent early excuse a pause of at most this long."""
        self.last_at = now
        self.due = now + grace if min_rate > 0 else None
        """The pace's deadline: the grace, plus 1/min_rate s per byte, never more than ``credit`` past a chunk."""

    @classmethod
    def from_config(cls, config: BodySettings, now: float) -> BodyClock:
        return cls(config.body_timeout, config.body_min_rate, config.body_rate_grace, now)

    def arrived(self, size: int, now: float) -> None:
        if size:
            self.last_at = now
            if self.due is not None:
                self.due = min(self.due + size / self.min_rate, now + self.credit)

    def deadline(self) -> float | None:
        """When the body counts as stalled or too slow if nothing moves it (None: neither rule is on)."""
        stall = self.last_at + self.timeout if self.timeout > 0 else None
        if self.due is None:
            return stall
        return self.due if stall is None else min(stall, self.due)

    def refusal(self, now: float) -> BodyRefusal:
        """The ``408`` of a body whose deadline passed: a stall, or under the pace."""
        if self.timeout > 0 and now >= self.last_at + self.timeout:
            return BodyRefusal(408, f"request body not received: no data for {self.timeout:g} s", 408,
                               "request_timeout", "stalled")
        return BodyRefusal(408, f"request body too slow: under {self.min_rate:g} bytes/s", 408, "request_timeout",
                           "too_slow")
