"""One request's lifecycle in the SSE middleware, as one explicit state (``Exchange.mode``)."""

from __future__ import annotations

from enum import Enum


class Mode(Enum):
    """What this exchange does with the app's messages; decided once, by the response start."""

    UNDECIDED = "undecided"
    SSE = "sse"
    """A stream: the body goes through the producer into the stream log."""
    PASS = "pass"
    """Not a stream: every message passes through untouched."""
    REFUSED = "refused"
    """Over the per-client stream limit (429) or the memory budget (503): the refusal went out, the app's messages
    are dropped."""
    HANDED_OVER = "handed_over"
    """A stream a drain handed over at its deadline: the client was cut and the store copied what the log held,
    so the app's later messages are dropped (an event logged now would reach a reader here, never Redis)."""
