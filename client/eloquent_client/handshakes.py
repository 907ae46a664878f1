"""``auto``'s QUIC handshake on a lossy path: a fresh one started beside a slow one.

A lost Initial costs aioquic a doubling retransmission timer (0.2, 0.4, 0.8, 1.6 s, ...), so one unlucky burst
can hold a handshake for seconds; a fresh connection (its own socket, its own Initial) does not wait for that
timer. The first up wins, the others are given up; no handshake hearing back at all is what a blocked path is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from eloquent_client.errors import ConnectError, TLSVerificationError
from eloquent_client.http3 import Http3ClientConnection

HANDSHAKES = 3
HANDSHAKE_AGAIN = 0.5
"""A fresh handshake is started beside the others every this many seconds while none is up, ``HANDSHAKES`` in
all."""


async def handshakes(connect: Callable[[float], Awaitable[Http3ClientConnection]],
                     timeout: float) -> Http3ClientConnection:
    """``connect(timeout)`` up to ``HANDSHAKES`` times, staggered, all within ``timeout``. Raises the last
    ``ConnectError`` (``answered`` if any of them heard back), or a ``TLSVerificationError`` at once."""
    deadline = time.monotonic() + timeout
    running: set[asyncio.Future[Http3ClientConnection]] = set()
    answered = False
    error: ConnectError | None = None
    started = 0
    try:
        while True:
            if started < HANDSHAKES and time.monotonic() < deadline:
                running.add(asyncio.ensure_future(connect(max(deadline - time.monotonic(), 0.01))))
                started += 1
            if not running:
                assert error is not None
                error.answered = answered
                raise error
            done, running = await asyncio.wait(running, timeout=HANDSHAKE_AGAIN, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = task.exception()
                if failure is None:
                    return task.result()
                if isinstance(failure, TLSVerificationError) or not isinstance(failure, ConnectError):
                    raise failure
                answered = answered or failure.answered
                error = failure
    finally:
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(BaseException):
                late = await task  # one that came up as another won: closed, not leaked
                await late.close()


__all__ = ["HANDSHAKES", "HANDSHAKE_AGAIN", "handshakes"]
