"""Timers for the UDP relay that fire within tens of microseconds of their deadline, not up to a millisecond late.

asyncio waits in ``epoll_wait``, whose timeout is whole milliseconds rounded up, so a ``call_at`` deadline fires
0..1 ms late (plus the wake-up). For the relay that lateness is added to every packet it releases: on a path of
one 50 ms hop it was the largest per-token term of the end-to-end stall floor (issue 19; docs/results/e2e-vs-sim.md),
and it is the instrument's, not the network's or the protocol's. Here one thread per relay sleeps on a condition
(sub-millisecond timeouts) until the earliest deadline, then hands the callback to the loop with
``call_soon_threadsafe``, which wakes ``epoll_wait`` at once. Callbacks still run on the loop's thread, and the
loop's own timer stays armed as a backstop.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
import time
from collections.abc import Callable
from typing import Any


class PreciseHandle:
    """Runs its callback once, from whichever fires first: the thread's hand-over or the loop's own timer."""

    __slots__ = ("_when", "_callback", "_args", "_cancelled", "_backup")

    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._when = when
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._backup: asyncio.TimerHandle | None = None

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self._cancelled = True
        if self._backup is not None:
            self._backup.cancel()

    def cancelled(self) -> bool:
        return self._cancelled

    def _run(self) -> None:
        if not self._cancelled:
            self.cancel()  # once
            self._callback(*self._args)


def _run_all(handles: list[PreciseHandle]) -> None:
    for handle in handles:
        handle._run()


class PreciseTimers:
    """``call_at`` like the loop's (same ``time.monotonic`` clock), served by a daemon thread started on first
    use and stopped by ``close``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, PreciseHandle]] = []
        self._cond = threading.Condition()
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def time(self) -> float:
        return self._loop.time()

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> PreciseHandle:
        handle = PreciseHandle(when, callback, args)
        # The loop's timer as well: on a CPU-starved machine the thread waits for the GIL (up to the 5 ms switch
        # interval per hand-over), and a release must never come later than the loop alone would make it.
        handle._backup = self._loop.call_at(when, handle._run)
        with self._cond:
            if self._closed:
                handle.cancel()
                return handle
            heapq.heappush(self._heap, (when, self._seq, handle))
            self._seq += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="eloquent-relay-timers", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                when, _, handle = self._heap[0]
                delay = when - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                now = time.monotonic()
                due: list[PreciseHandle] = []
                while self._heap and self._heap[0][0] <= now:
                    handle = heapq.heappop(self._heap)[2]
                    if not handle.cancelled():
                        due.append(handle)
                if not due:
                    continue
                try:  # every due timer in one hand-over: one GIL round trip, not one per packet
                    self._loop.call_soon_threadsafe(_run_all, due)
                except RuntimeError:  # the loop is closed: nothing left to release to
                    self._closed = True

    def close(self) -> None:
        """Stop the thread; pending callbacks are dropped (their loop timers too)."""
        with self._cond:
            for _, _, handle in self._heap:
                handle.cancel()
            self._closed = True
            self._heap.clear()
            self._cond.notify()
