"""The Redis store's key layout and the bounds both of its sides share: a leaf below ``redis_store`` (the store
and the readers on other replicas) and ``redis_mirror`` (the producer's copy task).

Keys, for a stream ``token`` under ``prefix`` (default ``eloquent``): ``{prefix}:m:{token}`` the stream's meta
JSON; ``{prefix}:s:{token}`` a Redis stream whose entry ``<index>-1`` holds event ``index``'s frame (field
``f``) and whose last entry, ``<n>-1`` with field ``end``, marks the end; ``{prefix}:h:{token}`` the producer's
heartbeat (or the claim of the replica continuing the stream); ``{prefix}:q:{token}`` the recorded request (to
continue the stream elsewhere); ``{prefix}:c:{token}`` how many times it was continued; ``{prefix}:l:{token}`` a
sorted set of reader leases (score: lease end, Unix time; a reader that leaves sets it to the time it left).
"""

from __future__ import annotations

import asyncio

LIVE_TTL_MIN = 60.0
"""A live stream's keys expire this long (at least) after the producer last refreshed them: a crashed producer
leaves no stream behind forever."""
HEARTBEAT_TTL = 15
"""Seconds a live stream's heartbeat key outlives the producer's last refresh (every HEARTBEAT_TTL / 3 s). A
reader that finds it gone while the stream has no end knows the producing replica died: it ends the body
without completing it instead of waiting for the keys to expire."""
READ_BATCH = 1000
"""Entries per XREAD/XRANGE and per mirror pipeline: the ceiling on what one reader buffers or one write holds."""
REPLY_TIMEOUT = 10.0
"""Seconds any Redis reply may take (past an XREAD's own block time) before it counts as a failure."""
RETRY_FIRST, RETRY_MAX = 0.05, 2.0
"""Backoff between retries after a Redis failure: doubles from the first delay up to the max."""
MIRROR_RETRY_FOR = 60.0
"""Seconds of consecutive failures after which the mirror gives up (one error line; remote readers get a cut)."""
READ_RETRY_FOR = 10.0
"""Seconds of consecutive failures after which a remote reader's body is cut."""


def redis_key(prefix: str, kind: str, token: str) -> str:
    """The key of one part (``kind``: ``m``, ``s``, ``h``, ``q``, ``c``, ``l``) of stream ``token``."""
    return f"{prefix}:{kind}:{token}"


def live_ttl(ttl: float) -> int:
    """Seconds a live stream's keys are kept after the last refresh: the finished-stream TTL, at least
    ``LIVE_TTL_MIN``."""
    return int(max(ttl, LIVE_TTL_MIN)) + 1


def transient(exc: BaseException) -> bool:
    """A failure worth retrying: the connection dropped or timed out (Redis itself may be fine)."""
    from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

    return isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError))


def entry_id(index: int) -> str:
    return f"{index}-1"


def after_id(cursor: int) -> str:
    """The XREAD id that returns entries with index >= cursor."""
    return "0-0" if cursor <= 0 else f"{cursor - 1}-1"


def entry_index(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])
