"""A trace-driven bottleneck: Mahimahi's capacity traces, and the queue drained at their delivery opportunities.

A Mahimahi trace is one integer per line, a time in milliseconds; each line is one opportunity for 1500 bytes to
leave the bottleneck queue (the same time repeated: several in that millisecond). The trace repeats with a period
of its last time, as ``mm-link`` replays it. The trace holds capacity only; losses come from the queue: drop-tail
(a byte or packet limit) and optionally CoDel.

``TraceQueue.offer(now, size)`` answers when the packet leaves the queue, or None if it is dropped. Without CoDel
the departure is known on arrival: packets leave in order, each opportunity serves up to 1500 bytes of the queue's
head (a packet larger than what is left of an opportunity finishes at a later one, small packets share one, and
an opportunity that finds the queue empty is lost, as in ``mm-link``). Sans-I/O: the simulator (virtual clock) and
the UDP relay (real clock) drive the same class, one instance per direction shared by every flow crossing it.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError

OPPORTUNITY_BYTES = 1500
"""What one delivery opportunity carries (Mahimahi's MTU)."""
TRACES_ENV = "ELOQUENT_TRACES_DIR"
"""Where the named traces are read from, when set; else the nearest ``shared/traces/mahimahi`` above the cwd."""
TRACE_NAMES = ("Verizon-LTE-short", "TMobile-LTE-short", "ATT-LTE-driving-2016", "Verizon-EVDO-driving",
               "TMobile-UMTS-driving")
"""The five public traces of ``../shared/traces/mahimahi`` (read from there at run time, never copied)."""


class CapacityTraceError(ConfigError):
    """A capacity trace that cannot be read or does not follow Mahimahi's format."""


@dataclass(frozen=True, slots=True)
class CapacityTrace:
    """Delivery opportunities in seconds from the start, sorted, repeating every ``period`` seconds."""

    times: tuple[float, ...]
    period: float
    name: str = "<trace>"

    def __post_init__(self) -> None:
        if not self.times:
            raise CapacityTraceError(f"{self.name}: no delivery opportunities")
        if self.period <= 0 or self.times[-1] > self.period:
            raise CapacityTraceError(f"{self.name}: the period must be > 0 and cover the last opportunity")

    @property
    def mean_rate(self) -> float:
        """Average capacity in bits per second."""
        return len(self.times) * OPPORTUNITY_BYTES * 8 / self.period

    def opportunity(self, k: int) -> float:
        """The time of the ``k``-th opportunity (k >= 0), the trace repeated."""
        n = len(self.times)
        cycle, i = divmod(k, n)
        return cycle * self.period + self.times[i]

    def first_at_or_after(self, t: float) -> int:
        """The index of the first opportunity at or after ``t``."""
        n = len(self.times)
        cycle = max(0, math.floor(t / self.period))
        i = bisect.bisect_left(self.times, t - cycle * self.period)
        if i == n:
            cycle, i = cycle + 1, 0
        return cycle * n + i


def parse_mahimahi(text: str, name: str = "<trace>") -> CapacityTrace:
    """One non-negative integer millisecond per line, non-decreasing; blank lines ignored."""
    times: list[float] = []
    last = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if not line.isascii() or not line.isdigit():
            raise CapacityTraceError(f"{name}:{lineno}: expected a time in whole milliseconds, got {line!r}")
        ms = int(line)
        if ms < last:
            raise CapacityTraceError(f"{name}:{lineno}: times must not decrease ({ms} after {last})")
        last = ms
        times.append(ms / 1000)
    if not times:
        raise CapacityTraceError(f"{name}: no delivery opportunities")
    if times[-1] <= 0:
        raise CapacityTraceError(f"{name}: the last time must be > 0 ms (it is the trace's period)")
    return CapacityTrace(tuple(times), times[-1], name)


def load_mahimahi(path: str | Path) -> CapacityTrace:
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CapacityTraceError(f"cannot read capacity trace {str(path)!r}: {exc}") from None
    return parse_mahimahi(text, Path(path).name)


def traces_dir() -> Path:
    """``$ELOQUENT_TRACES_DIR``, else the first ``shared/traces/mahimahi`` in the cwd or a folder above it."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        candidate = folder / "shared" / "traces" / "mahimahi"
        if candidate.is_dir():
            return candidate
    raise CapacityTraceError(f"no shared/traces/mahimahi above {here}; set {TRACES_ENV} to the traces' folder")


def trace_paths(name: str) -> tuple[Path, Path]:
    """The ``.down`` and ``.up`` files of a named trace (or of a path without its suffix)."""
    base = Path(name) if ("/" in name or os.sep in name) else traces_dir() / name
    down, up = base.with_name(base.name + ".down"), base.with_name(base.name + ".up")
    for p in (down, up):
        if not p.is_file():
            raise CapacityTraceError(f"capacity trace {str(p)!r} not found (known: {', '.join(TRACE_NAMES)})")
    return down, up


@dataclass(frozen=True, slots=True)
class CapacityLink:
    """One direction's trace-driven bottleneck: the trace, the queue's limit, optional CoDel."""

    trace: CapacityTrace
    queue_bytes: int | None = None
    """Drop-tail limit in bytes (the packets waiting, the one being served included); None: no byte limit."""
    queue_packets: int | None = None
    """Drop-tail limit in packets; None: no packet limit. Both None: an unbounded queue."""
    codel: bool = False
    """CoDel (RFC 8289: target 5 ms, interval 100 ms) on top of the drop-tail limit, decided on each packet's
    sojourn time, which without other drops is known on arrival (the drop is made then, not at the head)."""
    offset: float = 0.0
    """Where in the trace time 0 falls (seconds), so streams can sample different parts of one trace."""

    def __post_init__(self) -> None:
        for what, value in (("queue_bytes", self.queue_bytes), ("queue_packets", self.queue_packets)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")
        require_finite("trace offset (seconds)", self.offset)


CODEL_TARGET = 0.005
CODEL_INTERVAL = 0.100


class _CoDel:
    """RFC 8289's control law on sojourn times: once the sojourn has stayed above ``target`` for ``interval``,
    drop, then drop again after interval / sqrt(count) while it stays above."""

    __slots__ = ("first_above", "dropping", "drop_next", "count", "last_count")

    def __init__(self) -> None:
        self.first_above: float | None = None
        self.dropping = False
        self.drop_next = 0.0
        self.count = 0
        self.last_count = 0

    def should_drop(self, now: float, sojourn: float, backlog: int) -> bool:
        if sojourn < CODEL_TARGET or backlog <= OPPORTUNITY_BYTES:
            self.first_above = None
            if self.dropping:
                self.dropping = False
            return False
        if self.first_above is None:
            self.first_above = now + CODEL_INTERVAL
            return False
        if self.dropping:
            if now >= self.drop_next:
                self.count += 1
                self.drop_next += CODEL_INTERVAL / math.sqrt(self.count)
                return True
            return False
        if now >= self.first_above:
            self.dropping = True
            delta = self.count - self.last_count
            self.count = delta if delta > 1 and now - self.drop_next < 16 * CODEL_INTERVAL else 1
            self.last_count = self.count
            self.drop_next = now + CODEL_INTERVAL / math.sqrt(self.count)
            return True
        return False


@dataclass(slots=True)
class QueueStats:
    packets: int = 0
    """Offered."""
    bytes: int = 0
    delivered: int = 0
    delivered_bytes: int = 0
    tail_drops: int = 0
    codel_drops: int = 0


class TraceQueue:
    """The queue's state: the opportunity the next packet starts at, the bytes of it already used, and the
    packets still waiting (their departure and size), for the drop-tail limit."""

    __slots__ = ("link", "stats", "_k", "_used", "_waiting", "_backlog", "_codel", "tail", "_tail_cap")

    def __init__(self, link: CapacityLink, *, record_tail: int = 0) -> None:
        self.link = link
        self.stats = QueueStats()
        self.tail: list[tuple[float, float]] = []
        """With ``record_tail`` (at most that many entries): (arrival, departure) of every accepted packet, the
        queue's tail over time, from which ``floor`` tells when a packet alone could have left."""
        self._tail_cap = record_tail
        self._k = -1
        """Index of the opportunity serving the queue's tail; -1: none yet."""
        self._used = 0
        """Bytes of opportunity ``_k`` already taken."""
        self._waiting: deque[tuple[float, int]] = deque()
        self._backlog = 0
        self._codel = _CoDel() if link.codel else None

    def _at(self, k: int) -> float:
        return self.link.trace.opportunity(k) - self.link.offset

    def _drain(self, now: float) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            self._backlog -= waiting.popleft()[1]

    def backlog(self, now: float) -> tuple[int, int]:
        """Bytes and packets waiting at ``now`` (the one being served included)."""
        self._drain(now)
        return self._backlog, len(self._waiting)

    def room(self, now: float, size: int) -> bool:
        """Whether a ``size``-byte packet offered at ``now`` would fit under the drop-tail limit."""
        backlog, count = self.backlog(now)
        link = self.link
        return not ((link.queue_bytes is not None and backlog + size > link.queue_bytes)
                    or (link.queue_packets is not None and count + 1 > link.queue_packets))

    def next_departure(self) -> float | None:
        """When the head of the queue leaves (None: empty): the earliest moment ``room`` can change."""
        return self._waiting[0][0] if self._waiting else None

    def _departure(self, now: float, size: int) -> tuple[int, int, float]:
        k, used = self._k, self._used
        if k < 0 or self._at(k) < now:
            # The queue went idle: the packet starts at the first opportunity from now on; missed ones are lost.
            k, used = self.link.trace.first_at_or_after(now + self.link.offset), 0
        remaining = size
        while remaining > OPPORTUNITY_BYTES - used:
            remaining -= OPPORTUNITY_BYTES - used
            k, used = k + 1, 0
        used += remaining
        return k, used, self._at(k)

    def offer(self, now: float, size: int) -> float | None:
        """A ``size``-byte packet arrives at ``now``: when it leaves the queue, or None if it is dropped."""
        stats = self.stats
        stats.packets += 1
        stats.bytes += size
        if not self.room(now, size):
            stats.tail_drops += 1
            return None
        k, used, departure = self._departure(now, size)
        if self._codel is not None and self._codel.should_drop(now, departure - now, self._backlog + size):
            stats.codel_drops += 1
            return None
        self._k, self._used = k, used
        self._waiting.append((departure, size))
        self._backlog += size
        if len(self.tail) < self._tail_cap:
            self.tail.append((now, departure))
        stats.delivered += 1
        stats.delivered_bytes += size
        return departure

    def floor(self, t: float, arrivals: list[float] | None = None) -> float:
        """When a packet arriving at ``t`` could leave at the earliest: behind the packets accepted before it (the
        recorded tail), at the first opportunity from ``t`` on. The reference a stream's lateness is measured
        against on a real link: what the link and the traffic on it cost, not the scheme's recovery.
        ``arrivals``: ``[a for a, _ in tail]``, precomputed when called for many ``t``."""
        first = self._at(self.link.trace.first_at_or_after(t + self.link.offset))
        keys = arrivals if arrivals is not None else [a for a, _ in self.tail]
        i = bisect.bisect_right(keys, t) - 1
        return max(first, self.tail[i][1]) if i >= 0 else first

    @property
    def drops(self) -> int:
        return self.stats.tail_drops + self.stats.codel_drops
