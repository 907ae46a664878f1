"""Wire-independent objects of the engine: the tokens it yields and its counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Token:
    """One generated word piece; the last token of a generation has ``finish_reason`` "length" or "stop"."""

    id: int
    text: str
    index: int
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of an engine's request counters (per instance, so tests can observe aborts)."""

    running: int
    completed: int
    aborted: int
    failed: int
