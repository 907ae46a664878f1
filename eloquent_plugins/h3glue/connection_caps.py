"""What the listener (``h3glue.listener.GuardedQuicServer``) lets peers hold once their handshakes are done: at
most ``max_connections`` QUIC connections in all and ``max_per_address`` from one source address, and none that
carries no stream for ``idle_timeout``, PINGs or not (issue 28: 3,000 connections from one address, kept open by
PINGs, held +281 MiB, 96 KiB each; the handshake caps counted only connections still handshaking).

Why its own idle clock: aioquic restarts a connection's idle timer on every packet it receives
(``QuicConnection.receive_datagram``) and on the first ack-eliciting one it sends after that
(``datagrams_to_send``), as RFC 9000 section 10.1 says, so a PING every few seconds keeps a connection forever. Its
timer stays as it is (it still ends a connection that went silent); this clock counts only the time without a
stream, and ends the connection with a CONNECTION_CLOSE the peer can read (H3_NO_ERROR, "no request for N s")
instead of aioquic's silent drop. Server only, like the listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol

from eloquent_plugins.core.protocol import H3_EXCESSIVE_LOAD, H3_NO_ERROR
from eloquent_plugins.h3glue.common import connection_of, live_client_streams

EVICTION_GRACE = 1.0
"""Seconds a connection must have been idle before a newcomer may take its place: a client whose handshake just
completed has its first request on the way."""
FULL_RECHECK = 0.1
"""Seconds a search that found no idle connection to close stands for the total cap (a burst of Initials at a
full server is refused without walking every connection each time)."""


def carries_streams(protocol: QuicConnectionProtocol) -> bool:
    """The connection carries a request or a session: its protocol's own ``carries_streams`` (the HTTP/3 front
    end's: live requests and WebTransport sessions), else a client stream QUIC has not finished."""
    own = getattr(protocol, "carries_streams", None)
    return bool(own) if own is not None else live_client_streams(connection_of(protocol))


@dataclass(slots=True)
class _Open:
    """A connection past its handshake: its idle clock."""

    key: str
    busy_at: float
    """The last time it was seen carrying a stream (or its handshake completed, or it was first seen idle)."""
    busy: bool = False
    timer: asyncio.TimerHandle | None = None


class ConnectionCaps:
    """The connections a listener holds, by source address: admission against the caps (closing idle ones
    first), and the idle clock of each open one. ``stats`` is the listener's ``AdmissionStats``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stats: Any, *, max_connections: int, max_per_address: int,
                 idle_timeout: float | None, busy: Callable[[QuicConnectionProtocol], bool] = carries_streams
                 ) -> None:
        self.loop = loop
        self.stats = stats
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.idle_timeout = idle_timeout
        self.busy = busy
        self.grace = EVICTION_GRACE
        self._address: dict[QuicConnectionProtocol, str] = {}
        """Every connection counted against the caps (handshaking or open), by its source address."""
        self._per_address: dict[str, int] = {}
        self._open: dict[QuicConnectionProtocol, _Open] = {}
        """The ones past their handshake, with their idle clocks (oldest first)."""
        self._open_at: dict[str, dict[QuicConnectionProtocol, _Open]] = {}
        """``_open`` by source address (a cap's search walks one address's connections, not every one)."""
        self._full_until = 0.0

    @property
    def count(self) -> int:
        return len(self._address)

    def held_by(self, key: str) -> int:
        return self._per_address.get(key, 0)

    # ---- admission -------------------------------------------------------------------------------------------
    def refusal(self, key: str) -> str | None:
        """None when a new connection from ``key`` fits, after closing idle connections to make room (``key``'s
        own for its cap; for the total, ``key``'s or else the one idle longest anywhere), never one that carries a
        stream; else why it does not (the reason phrase of the refusal)."""
        now = self.loop.time()
        while self.held_by(key) >= self.max_per_address:
            if not self._evict(self._victim(now, key)):
                return f"too many connections from this address (at most {self.max_per_address}), none idle"
        while len(self._address) >= self.max_connections:
            if now < self._full_until:
                return f"too many connections (at most {self.max_connections}), none idle"
            if not self._evict(self._victim(now, key) or self._victim(now, None)):
                self._full_until = now + FULL_RECHECK
                return f"too many connections (at most {self.max_connections}), none idle"
        return None

    def admitted(self, protocol: QuicConnectionProtocol, key: str) -> None:
        self._address[protocol] = key
        self._per_address[key] = self._per_address.get(key, 0) + 1

    def opened(self, protocol: QuicConnectionProtocol) -> None:
        """Its handshake completed: its idle clock starts."""
        key = self._address.get(protocol)
        if key is None or protocol in self._open:
            return
        record = self._open[protocol] = _Open(key, self.loop.time())
        self._open_at.setdefault(key, {})[protocol] = record
        self._arm(protocol, record)

    def released(self, protocol: QuicConnectionProtocol) -> None:
        """It ended (or this end closed it): it no longer counts."""
        record = self._open.pop(protocol, None)
        if record is not None:
            if record.timer is not None:
                record.timer.cancel()
            same = self._open_at[record.key]
            del same[protocol]
            if not same:
                del self._open_at[record.key]
        key = self._address.pop(protocol, None)
        if key is None:
            return
        left = self._per_address[key] - 1
        if left:
            self._per_address[key] = left
        else:
            del self._per_address[key]

    def close(self) -> None:
        for record in self._open.values():
            if record.timer is not None:
                record.timer.cancel()
        self._open.clear()
        self._open_at.clear()
        self._address.clear()
        self._per_address.clear()

    # ---- the idle clock --------------------------------------------------------------------------------------
    def observe(self, protocol: QuicConnectionProtocol) -> None:
        """A datagram of ``protocol`` was processed: note whether it carries a stream now."""
        record = self._open.get(protocol)
        if record is not None:
            self._observe(protocol, record, self.loop.time())

    def _observe(self, protocol: QuicConnectionProtocol, record: _Open, now: float) -> None:
        busy = self.busy(protocol)
        if busy or record.busy:  # busy now, or the first sight of it idle: its idle time counts from here
            record.busy_at = now
            record.busy = busy

    def _arm(self, protocol: QuicConnectionProtocol, record: _Open) -> None:
        if self.idle_timeout is not None:
            record.timer = self.loop.call_at(record.busy_at + self.idle_timeout, self._check_idle, protocol)

    def _check_idle(self, protocol: QuicConnectionProtocol) -> None:
        record = self._open.get(protocol)
        if record is None or self.idle_timeout is None:
            return
        now = self.loop.time()
        self._observe(protocol, record, now)
        if not record.busy and now >= record.busy_at + self.idle_timeout:
            self.stats.idle_closed += 1
            self._close(protocol, H3_NO_ERROR, f"no request for {self.idle_timeout:g} s")
            return
        self._arm(protocol, record)

    # ---- closing idle connections ----------------------------------------------------------------------------
    def _victim(self, now: float, key: str | None) -> QuicConnectionProtocol | None:
        """The open connection (of ``key``, or any) idle longest, and for at least ``grace``."""
        best, best_at = None, now - self.grace
        for protocol, record in (self._open if key is None else self._open_at.get(key, {})).items():
            self._observe(protocol, record, now)
            if not record.busy and record.busy_at <= best_at:
                best, best_at = protocol, record.busy_at
        return best

    def _evict(self, victim: QuicConnectionProtocol | None) -> bool:
        if victim is None:
            return False
        self.stats.evicted += 1
        self._close(victim, H3_EXCESSIVE_LOAD, "connection cap reached: an idle connection closed for a new one")
        return True

    def _close(self, protocol: QuicConnectionProtocol, code: int, reason: str) -> None:
        """Close with ``code`` and ``reason`` (sent in CONNECTION_CLOSE); it stops counting at once, though aioquic
        keeps it for its closing period (3 x PTO)."""
        self.released(protocol)
        connection_of(protocol).close(error_code=code, reason_phrase=reason)
        protocol.transmit()
