"""Per-gateway cache of what the upstream said about a model (exists? config?), with a TTL.

Why: the gateway checks the model before it answers with headers (so an unknown model is a real
404), and the gRPC upstream needs the model config to turn JSON into tensors; neither should cost
a round trip per request. Failures are not cached, so a model loaded later is seen at once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ModelCache(Generic[T]):
    def __init__(self, fetch: Callable[[str, str], Awaitable[T]], *, ttl_s: float = 30.0) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._entries: dict[tuple[str, str], tuple[float, T]] = {}

    async def get(self, model: str, version: str) -> T:
        key = (model, version)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and now - entry[0] < self._ttl_s:
            return entry[1]
        value = await self._fetch(model, version)
        self._entries[key] = (now, value)
        return value
