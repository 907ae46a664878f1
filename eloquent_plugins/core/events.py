"""The stream model: an append-only log of engine events, each with a 0-based index, ended by a final event."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class EventKind(IntEnum):
    """DATA events carry the engine's payload; END and ERROR are final and close the log."""

    DATA = 0
    END = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event as the engine produced it: ``payload`` is the engine's own bytes (e.g. an SSE data field)."""

    index: int
    payload: bytes
    kind: EventKind = EventKind.DATA

    @property
    def final(self) -> bool:
        return self.kind is not EventKind.DATA
