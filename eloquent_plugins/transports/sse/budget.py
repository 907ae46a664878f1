"""The memory budget of one middleware's streams (``StreamConfig.max_held_bytes``).

What is counted: the frames every live stream log holds (replay history and events queued for clients) plus the
finished streams the store keeps in this process for resume (``ResumeStore.held_bytes``). Sockets' kernel
buffers are not ours to count; uvicorn's own write buffer is bounded by its flow control.

When the total passes the budget, ``enforce`` frees memory in this order, stopping as soon as it is under:

1. finished streams, oldest finished first (``ResumeStore.shed``): a resume of one then gets ``404``;
2. the written history of live streams, biggest log first: events every local reader has been handed (never
   events some connected client has not got, never the log of a stream whose client left: that one is waiting
   for a resume). A resume from before them gets ``410 events_expired``, never a gap;
3. the connections with the most bytes queued (clients that do not read) are cut; they may resume, and their
   engine requests are aborted ``resume_grace`` after, unless they do.

While the total is at the budget after that, a new stream is refused with ``503`` and ``Retry-After``
(``admit``). Checked when a stream starts and every ``TICK`` seconds while streams are live, so the overshoot is
what the engines produce in one tick.
"""

from __future__ import annotations

import asyncio
import logging
import math

from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import ResumeStore
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.connection import Connection

log = logging.getLogger("eloquent_plugins.transports.sse")

TICK = 0.1
"""Seconds between two checks of the budget while streams are live."""
LOW_WATER = 0.9
"""Shedding frees down to this fraction of the budget, so that it does not run again at the next event."""
CUT_FLOOR = 16 << 10
"""Step 3 cuts only clients with at least this much queued: one that is a few events behind is not the problem."""


class _Live:
    __slots__ = ("resumable", "readers")

    def __init__(self, resumable: bool) -> None:
        self.resumable = resumable
        self.readers: list[Connection] = []


class StreamBudget:
    """The bytes held by one middleware's stream logs, against ``limit`` (0: unlimited, only counted)."""

    def __init__(self, limit: int, store: ResumeStore | None, metrics: StreamMetrics, *,
                 retry_after: float = 1.0) -> None:
        self.limit = limit
        self.store = store
        self.metrics = metrics
        self.retry_after = str(max(1, math.ceil(retry_after)))
        """``Retry-After`` of a refusal: about when clients that left are given up and their memory freed."""
        self.live: dict[StreamLog, _Live] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._over = False
        """Over the budget at the last look (one warning per episode, not per tick)."""
        metrics.held = self.held
        if store is not None:
            metrics.evicted = lambda: getattr(store, "evicted", 0)

    def held(self) -> int:
        """Bytes held now: live logs plus the finished streams the store keeps here."""
        total = sum(log_.nbytes for log_ in self.live)
        return total + (self.store.held_bytes() if self.store is not None else 0)

    # -- registration (the exchange and resume connections) ------------------------------------------------------

    def add_stream(self, stream_log: StreamLog, *, resumable: bool) -> None:
        self.live[stream_log] = _Live(resumable)
        if self.limit and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="eloquent-sse-budget")

    def remove_stream(self, stream_log: StreamLog) -> None:
        self.live.pop(stream_log, None)

    def add_reader(self, stream_log: StreamLog, conn: Connection) -> None:
        """A connection reading a live log here: its cursor bounds what step 2 may drop."""
        entry = self.live.get(stream_log)
        if entry is not None:
            entry.readers.append(conn)

    def reading(self, stream_log: StreamLog) -> bool:
        """Some connection here still reads this live log."""
        entry = self.live.get(stream_log)
        return entry is not None and any(not c.gone for c in entry.readers)

    def remove_reader(self, stream_log: StreamLog, conn: Connection) -> None:
        entry = self.live.get(stream_log)
        if entry is not None and conn in entry.readers:
            entry.readers.remove(conn)

    # -- policy --------------------------------------------------------------------------------------------------

    def admit(self) -> bool:
        """May a new stream start? Sheds first when the budget is reached; False while it stays reached."""
        if not self.limit:
            return True
        if self.held() < self.limit:
            return True
        self.enforce()
        if self.held() < self.limit:
            return True
        self.metrics.budget_refusals += 1
        return False

    def enforce(self) -> int:
        """Shed (see the module docstring) while over the budget; returns the bytes held afterwards."""
        held = self.held()
        if not self.limit or held < self.limit:
            if self._over and held < self.limit * LOW_WATER:
                self._over = False
                log.warning("memory budget: back under %d bytes (%d held)", self.limit, held)
            return held
        if not self._over:
            self._over = True
            log.warning("memory budget reached: %d bytes held, budget %d: shedding, new streams get 503", held,
                        self.limit)
        target = int(self.limit * LOW_WATER)
        if self.store is not None:
            held -= self.store.shed(held - target)
        if held > target:
            held -= self._shed_history(held - target)
        if held >= self.limit:
            self._cut_readers(held - target)
        return held

    def _shed_history(self, need: int) -> int:
        freed = 0
        for stream_log in sorted(self.live, key=lambda x: x.nbytes, reverse=True):
            if freed >= need:
                break
            entry = self.live[stream_log]
            readers = [c.cursor for c in entry.readers if not c.gone]
            if readers:
                keep = min(readers)
            elif entry.resumable:
                continue  # its client left: these events are what a resume needs
            else:
                keep = stream_log.next_index  # nobody can ever read them again
            freed += stream_log.discard_before(keep)
        self.metrics.history_shed_bytes += freed
        return freed

    def _cut_readers(self, need: int) -> None:
        conns = [c for entry in self.live.values() for c in entry.readers if not c.gone and c.queued >= CUT_FLOOR]
        conns.sort(key=lambda c: c.queued, reverse=True)
        queued = 0
        for conn in conns:
            if queued >= need:
                break
            queued += conn.queued
            conn.overflow()

    async def _tick(self) -> None:
        while self.live:
            await asyncio.sleep(TICK)
            self.enforce()
