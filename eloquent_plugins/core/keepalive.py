"""Idle-based keep-alive policy shared by both transports.

Proxies (nginx 60 s, AWS ALB 60 s, Cloudflare 100 s) kill a response that sends no bytes for a while. Sending
a keep-alive only after ``interval`` seconds *without any bytes* costs nothing on a busy stream and still covers
long queues and prefills, including the wait before the first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError

KeepAliveFrame = Literal["comment", "newline"]

SSE_COMMENT_FRAME = b": keep-alive\n"
"""One comment line and no blank line after it: httpx-sse and the openai SDK (which copies its decoder) keep the
last event id across events and dispatch an event on any blank line once an id was seen, so ``: keep-alive\n\n``
after an event with an ``id:`` reaches them as an empty event (the openai SDK then fails on ``json.loads("")``).
A lone comment line carries bytes for the proxy and dispatches nothing in any parser."""
SSE_NEWLINE_FRAME = b"\n"
"""A bare newline, for clients that cannot take comments; do not combine it with event ids for the clients
above (it is the blank line they dispatch on)."""


@dataclass(frozen=True, slots=True)
class KeepAlivePolicy:
    interval: float = 15.0
    """Seconds of silence before a keep-alive; 0 turns keep-alives off."""
    frame: KeepAliveFrame = "comment"
    """SSE form: a comment line (ignored by every compliant parser) or a bare newline for clients that
    choke on comments."""

    def __post_init__(self) -> None:
        require_finite("keep-alive interval (seconds, 0: off)", self.interval)
        if self.frame not in ("comment", "newline"):
            raise ConfigError(f"keep-alive frame must be 'comment' or 'newline', got {self.frame!r}")

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    @property
    def sse_frame(self) -> bytes:
        return SSE_COMMENT_FRAME if self.frame == "comment" else SSE_NEWLINE_FRAME


class KeepAliveTimer:
    """Sans-I/O idle timer: tell it when bytes went out, ask it when the next keep-alive is due."""

    __slots__ = ("_last_activity", "policy")

    def __init__(self, policy: KeepAlivePolicy, now: float) -> None:
        self.policy = policy
        self._last_activity = now

    def activity(self, now: float) -> None:
        """Any bytes written on the stream reset the idle clock."""
        self._last_activity = now

    def deadline(self) -> float | None:
        return self._last_activity + self.policy.interval if self.policy.enabled else None

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline
