"""Replayable loss/delay traces: a small text format shared by the simulator and the relay.

Format (UTF-8 text, one record per line, ``#`` starts a comment, blank lines ignored)::

    # time_ms  loss   delay_ms
    0          0      40
    1200       1      40        # everything sent in [1.2 s, 1.5 s) is dropped
    1500       0.05   80        # from 1.5 s: 5% random loss, 80 ms one-way delay
    repeat 5000                 # optional, last line: the trace loops every 5 s

Each record holds from its ``time_ms`` until the next record's: packets sent then are dropped with probability
``loss`` (0 and 1 replay exactly; anything between draws from the seeded generator) and take ``delay_ms`` one way
(``-`` keeps the path's configured delay). Times start at 0 and strictly increase. After the last record it stays
in force, unless ``repeat PERIOD_MS`` makes the whole trace loop (PERIOD_MS must be after the last record).
Trace loss comes on top of any Gilbert-Elliott loss configured on the same path.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError


class TraceError(ConfigError):
    """A trace file that does not follow the format; the message names the source and line."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    start: float
    """Seconds from the start of the trace."""
    loss: float
    delay: float | None
    """One-way delay in seconds, None to keep the path's own."""


@dataclass(frozen=True, slots=True)
class Trace:
    records: tuple[TraceRecord, ...]
    repeat: float | None = None
    """Loop period in seconds, None to hold the last record forever."""

    def __post_init__(self) -> None:
        if not self.records or self.records[0].start != 0.0:
            raise TraceError("a trace needs at least one record and must start at time 0")

    def at(self, t: float) -> TraceRecord:
        """The record in force at ``t`` seconds after the start."""
        if self.repeat is not None:
            t = math.fmod(max(t, 0.0), self.repeat)
        starts = [r.start for r in self.records]
        return self.records[max(0, bisect.bisect_right(starts, t) - 1)]

    @property
    def min_delay(self) -> float | None:
        delays = [r.delay for r in self.records if r.delay is not None]
        return min(delays) if delays else None


def _number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {what} must be a number, got {text!r}") from None
    return require_finite(f"{where}: {what}", value, error=TraceError)


def parse_trace(text: str, source: str = "<trace>") -> Trace:
    """Parse the format above; raises ``TraceError`` naming ``source`` and the line for any mistake."""
    records: list[TraceRecord] = []
    repeat: float | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{lineno}"
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if repeat is not None:
            raise TraceError(f"{where}: nothing may follow the 'repeat' line")
        fields = line.split()
        if fields[0].lower() == "repeat":
            if len(fields) != 2:
                raise TraceError(f"{where}: expected 'repeat PERIOD_MS', got {line!r}")
            repeat = _number(fields[1], "repeat period", where) / 1000
            if not records or repeat <= records[-1].start:
                raise TraceError(f"{where}: the repeat period must come after the last record")
            continue
        if len(fields) != 3:
            raise TraceError(f"{where}: expected 'time_ms loss delay_ms', got {len(fields)} fields in {line!r}")
        start = _number(fields[0], "time_ms", where) / 1000
        loss = _number(fields[1], "loss", where)
        if loss > 1:
            raise TraceError(f"{where}: loss must be between 0 and 1, got {fields[1]!r}")
        delay = None if fields[2] == "-" else _number(fields[2], "delay_ms", where) / 1000
        if not records and start != 0:
            raise TraceError(f"{where}: the first record must be at time 0, got {fields[0]}")
        if records and start <= records[-1].start:
            raise TraceError(f"{where}: times must strictly increase ({fields[0]} ms after "
                             f"{records[-1].start * 1000:g} ms)")
        records.append(TraceRecord(start, loss, delay))
    if not records:
        raise TraceError(f"{source}: no records")
    return Trace(tuple(records), repeat)


def load_trace(path: str | Path) -> Trace:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc}") from None
    return parse_trace(text, str(path))
