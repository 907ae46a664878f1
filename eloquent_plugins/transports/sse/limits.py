"""The per-client bound on live streams (``StreamConfig.max_streams_per_client``).

A caller is its identity (credentials, or the middleware's ``identity(scope)``), else its client address (see
``ids.client_key``). A stream holds a slot from its ``200`` until it ends or its client leaves (a resume is not
counted again); one stream more is refused with ``429`` and ``Retry-After: 1``. Counted per process.
"""

from __future__ import annotations

from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.transports.asgi import Scope
from eloquent_plugins.transports.sse.headers import Headers, json_error
from eloquent_plugins.transports.sse.ids import IdentityFunction, client_key


class Slot:
    """One live stream counted against its client; ``release()`` is idempotent."""

    __slots__ = ("_limits", "key")

    def __init__(self, limits: ClientLimits | None, key: str | None) -> None:
        self._limits = limits
        self.key = key

    def release(self) -> None:
        """The stream ended, or its client left."""
        limits, self._limits = self._limits, None
        if limits is not None and self.key is not None:
            limits._release(self.key)


UNCOUNTED = Slot(None, None)
"""The slot of every stream while there is no limit: nothing to count or release."""


class ClientLimits:
    """Live streams per client key while ``max_streams`` is set (0: unlimited, nothing is counted)."""

    def __init__(self, max_streams: int, identity: IdentityFunction | None) -> None:
        self.max_streams = max_streams
        self.identity = identity
        self._counts: dict[str, int] = {}

    @property
    def counts(self) -> dict[str, int]:
        """A copy of the live streams per client key."""
        return dict(self._counts)

    def acquire(self, scope: Scope) -> Slot | None:
        """The new stream's slot, or None when its caller already holds ``max_streams`` live streams."""
        if not self.max_streams:
            return UNCOUNTED
        key = client_key(scope, self.identity)
        count = self._counts.get(key, 0)
        if count >= self.max_streams:
            return None
        self._counts[key] = count + 1
        return Slot(self, key)

    def refusal(self, router: CodecRouter, path: str) -> tuple[int, Headers, bytes]:
        """The ``429`` a refused stream gets, in its route's error shape."""
        status, headers, body = json_error(
            router, path, 429, f"too many concurrent streams: at most {self.max_streams} per client; retry when one "
            "of them has ended", "rate_limit_exceeded", type_="requests")
        return status, [*headers, (b"retry-after", b"1")], body

    def _release(self, key: str) -> None:
        count = self._counts.get(key, 0) - 1
        if count > 0:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)
