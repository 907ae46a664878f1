"""What the client remembers about paths, as browsers do: the HTTP/3 port an origin advertised (``Alt-Svc``, RFC
7838) and the UDP paths found blocked (a handshake that never heard back), so ``transport="auto"`` does not start
a handshake beside every request while UDP is blocked. A blocked path is tried again soon, backing off: after
``UDP_RETRY_FIRST`` seconds, then twice as long each time it is still blocked, up to ``udp_retry_after``."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

MAX_ALT_SVC_AGE = 86400.0
"""The longest an ``Alt-Svc`` entry is kept, whatever its ``ma`` (RFC 7838's default; ``bounds`` re-exports it)."""
DEFAULT_UDP_RETRY_AFTER = 60.0
"""The longest a blocked UDP path is skipped before it is tried again (the backoff's ceiling)."""
UDP_RETRY_FIRST = 2.0
"""Seconds a path found blocked for the first time is skipped; each further failure doubles it."""

_H3 = re.compile(r'(?:^|,)\s*h3\s*=\s*"([^"]*)"([^,]*)')
_MA = re.compile(r";\s*ma\s*=\s*([0-9]+)", re.ASCII)


@dataclass(frozen=True, slots=True)
class AltService:
    host: str
    """Empty: the same host as the origin."""
    port: int
    max_age: float


def parse_alt_svc(value: str) -> AltService | None:
    """The ``h3`` alternative of an ``Alt-Svc`` value (``h3=":8443"; ma=3600``), or None (none offered, ``clear``,
    or malformed)."""
    match = _H3.search(value)
    if match is None:
        return None
    host, sep, port = match.group(1).rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    ma = _MA.search(match.group(2))
    return AltService(host.strip("[]"), int(port), float(ma.group(1)) if ma else 86400.0)


class PathMemory:
    """Thread-safe (the sync client and transports run their own loop thread); one shared by default."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alt: dict[str, tuple[AltService, float]] = {}
        self._broken: dict[tuple[str, int], float] = {}
        self._failures: dict[tuple[str, int], int] = {}
        """Times each path was found blocked since it last worked (the backoff's exponent)."""

    def h3_port(self, origin: str, now: float | None = None) -> int | None:
        """The UDP port ``origin`` (``scheme://host:port``) advertised and that has not expired."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entry = self._alt.get(origin)
            if entry is None or entry[1] <= now:
                self._alt.pop(origin, None)
                return None
            return entry[0].port

    def learn(self, origin: str, alt_svc: str | None, now: float | None = None) -> None:
        if not alt_svc:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            if alt_svc.strip().lower() == "clear":
                self._alt.pop(origin, None)
                return
            service = parse_alt_svc(alt_svc)
            if service is not None and not service.host:  # another host would need its own certificate check
                self._alt[origin] = (service, now + min(service.max_age, MAX_ALT_SVC_AGE))  # 400-digit ma: a day

    def mark_broken(self, host: str, port: int, retry_after: float = DEFAULT_UDP_RETRY_AFTER,
                    now: float | None = None) -> float:
        """Skip the path ``UDP_RETRY_FIRST`` seconds, doubled for each failure in a row, at most ``retry_after``;
        returns that wait."""
        now = time.monotonic() if now is None else now
        with self._lock:
            failures = self._failures.get((host, port), 0)
            self._failures[(host, port)] = failures + 1
            wait = min(retry_after, UDP_RETRY_FIRST * 2.0 ** min(failures, 30))
            self._broken[(host, port)] = now + wait
            return wait

    def is_broken(self, host: str, port: int, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            until = self._broken.get((host, port))
            if until is not None and until <= now:
                del self._broken[(host, port)]
                return False
            return until is not None

    def mark_working(self, host: str, port: int) -> None:
        with self._lock:
            self._broken.pop((host, port), None)
            self._failures.pop((host, port), None)

    def clear(self) -> None:
        with self._lock:
            self._alt.clear()
            self._broken.clear()
            self._failures.clear()


SHARED = PathMemory()
"""The process-wide memory every client uses unless given its own (``path_memory=``)."""

__all__ = ["DEFAULT_UDP_RETRY_AFTER", "SHARED", "UDP_RETRY_FIRST", "AltService", "PathMemory", "parse_alt_svc"]
