"""The memory budget of one middleware's streams (``StreamConfig.max_held_bytes``).

What is counted, so that the figure is what the process holds for its streams (measured with ``eloquent
serve``, ``tests/transports/test_hostile_load.py``), not only their payload:

* the frames every live stream log holds (replay history and events queued for clients), each with its object
  overhead (``FRAME_OVERHEAD``: a 250-byte event costs ~300 bytes of memory);
* ``STREAM_RESERVE`` per live stream: its connection, tasks and request objects, the app's included;
* what the server still buffers for each connected client, written and not yet taken by the kernel
  (``Connection.unsent``: the server's own figure where it offers the ``eloquent.socket`` extension, as
  ``eloquent serve`` does; otherwise ``STALLED_SEND_BYTES`` for a connection whose send is suspended);
* the finished streams the store keeps in this process for resume (``ResumeStore.held_bytes``);
* incomplete request bodies and WebTransport request heads (``transports/body_budget.py``, ``HeldBodies``: their
  bytes and a reserve per request, on both transports). They are refused past their own ceilings, at most a
  quarter of this budget (why: that module); here they count, so the streams shed and refuse to leave them room.

The kernel's socket buffers are not process memory.

From ``HIGH_WATER`` (75%) of the budget, ``enforce`` frees memory in this order, down to ``LOW_WATER`` (65%):
the margin is for what the process holds beyond the count (the allocator's slack when many streams end at once,
what engines produce in a tick), so that its memory stays under the budget, not only the count.

1. finished streams, oldest finished first (``ResumeStore.shed``): a resume of one then gets ``404``;
2. the written history of live streams, biggest log first: events every local reader has been handed (never
   events some connected client has not got, never the log of a stream whose client left: that one is waiting
   for a resume). A resume from before them gets ``410 events_expired``, never a gap;
3. the logs of streams whose client this middleware cut (it did not read: queue bound, send timeout, step 4)
   and that has not resumed, biggest first: their engine requests are aborted at once (not after
   ``resume_grace``) and a resume gets ``410``, never a gap. A client that left on its own keeps its stream for
   the grace, as does one reading it again (here, or on another replica as far as the store's leases tell).
   While memory is tight, a client cut from then on loses its stream at the cut itself (``client_cut``);
4. only at the budget itself: the connections with the most bytes queued (clients that do not read) are cut (a
   cut aborts the connection where the server allows it, freeing what it buffered); if the total is still at
   the budget, their logs go as in step 3.

While the total is at the budget after that, a new stream is refused with ``503`` and ``Retry-After``
(``admit``). Checked when a stream starts and every ``TICK`` seconds while streams are live, so the overshoot is
what the engines produce in one tick. After many streams ended, ``_release`` hands their memory back to the
system (a garbage collection and glibc's ``malloc_trim``), at most ``COLLECT_SHARE`` of the time.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import math
import time
from collections.abc import Callable

from eloquent_plugins.transports.body_budget import HeldBodies
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import ResumeStore
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.connection import Connection

log = logging.getLogger("eloquent_plugins.transports.sse")

TICK = 0.1
"""Seconds between two checks of the budget while streams are live."""
HIGH_WATER = 0.75
"""Shedding (steps 1-3) starts at this fraction of the budget. The margin above it is for what the process holds
beyond the count: the allocator keeps the high-water mark of what was allocated (memory freed by shedding is
reused, not returned), and engines produce up to a tick's worth before the next look (with 500 never-reading
clients the server's RSS ran 10-20 MiB past the count at 90%, ``tests/transports/test_hostile_load.py``)."""
LOW_WATER = 0.65
"""Shedding frees down to this fraction of the budget, so that it does not run again at the next event."""
CUT_FLOOR = 16 << 10
"""Step 4 cuts only clients with at least this much queued: one that is a few events behind is not the problem."""
FRAME_OVERHEAD = 48
"""Memory a log frame takes beyond its bytes: the ``bytes`` object's header (33), the allocator's 16-byte
rounding, the log list's slot."""
STREAM_RESERVE = 48 << 10
"""Memory a live stream takes besides its log: uvicorn's protocol and h11 state, the middleware's and the app's
tasks and objects (measured under ``eloquent serve`` with the built-in engine: 44-52 KiB per never-reading stream,
``tests/transports/test_hostile_load.py``'s scenario). A stream given up in step 3 stops counting it: it is on its way out."""
TIGHT_FOR = 10.0
"""Seconds memory counts as tight after the budget last had to shed (``client_cut``)."""
RELEASE_AFTER = 0.05
"""``_release`` runs once this fraction of the budget was freed since it last ran: reserves of streams that
ended, server buffers of connections that were aborted."""
COLLECT_SHARE = 0.05
"""At most this share of the time goes to those collections (the next one waits 1/share times the last one's)."""


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere): returns the free pages inside the C heap to the system."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class _Live:
    __slots__ = ("resumable", "readers", "abandon", "reserve", "given_up")

    def __init__(self, resumable: bool, abandon: Callable[[], bool] | None, reserve: int) -> None:
        self.resumable = resumable
        self.readers: list[Connection] = []
        self.abandon = abandon
        """Step 3: give the stream up if its client was cut and has not resumed (aborts the engine request);
        False when it must be kept."""
        self.reserve = reserve
        self.given_up = False
        """Step 3 gave it up: its log is dropped, its reserve no longer counted (the stream is ending)."""


class StreamBudget:
    """The bytes held by one middleware's stream logs, against ``limit`` (0: unlimited, only counted)."""

    def __init__(self, limit: int, store: ResumeStore | None, metrics: StreamMetrics, *,
                 retry_after: float = 1.0, frame_overhead: int = FRAME_OVERHEAD,
                 stream_reserve: int = STREAM_RESERVE, bodies: HeldBodies | None = None) -> None:
        self.limit = limit
        self.bodies = bodies
        """The ledger of incomplete request bodies, counted here too (None: not this budget's)."""
        self.frame_overhead = frame_overhead
        self.stream_reserve = stream_reserve
        self.store = store
        self.metrics = metrics
        self.retry_after = str(max(1, math.ceil(retry_after)))
        """``Retry-After`` of a refusal: about when clients that left are given up and their memory freed."""
        self.live: dict[StreamLog, _Live] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._over = False
        """Over the budget at the last look (one warning per episode, not per tick)."""
        self._freed = 0
        """Bytes freed since ``_release`` last ran: reserves of ended streams, aborted connections' buffers."""
        self._unsent = 0
        """``unsent()`` at the last tick."""
        self._next_release = 0.0
        self._pressed = False
        """The budget had to shed since ``_release`` last ran: only then is a collection worth its pause."""
        self._seen = 0
        """``held()`` at the last ``enforce`` (``client_cut`` decides on it without summing every stream)."""
        self._tight_until = 0.0
        """``time.monotonic()`` until which memory counts as tight: ``TIGHT_FOR`` after the last shedding."""
        self._trim: Callable[[int], int] | None = _malloc_trim() if limit else None
        metrics.held = self.held
        metrics.unsent = self.unsent
        metrics.bodies = bodies
        if store is not None:
            metrics.evicted = lambda: getattr(store, "evicted", 0)

    def held(self) -> int:
        """Bytes held now (see the module docstring): live logs and streams, what the server buffers for their
        connected clients, the finished streams the store keeps here, incomplete request bodies."""
        total = self.unsent() + (self.bodies.held if self.bodies is not None else 0)
        for log_, entry in self.live.items():
            total += log_.nbytes + len(log_.frames) * self.frame_overhead + entry.reserve
        return total + (self.store.held_bytes() if self.store is not None else 0)

    def unsent(self) -> int:
        """Bytes the server buffers for the connected clients of live streams (``Connection.unsent``)."""
        return sum(c.unsent for entry in self.live.values() for c in entry.readers)

    # -- registration (the exchange and resume connections) ------------------------------------------------------

    def add_stream(self, stream_log: StreamLog, *, resumable: bool,
                   abandon: Callable[[], bool] | None = None) -> None:
        """A live stream; ``abandon`` (a resumable one's) aborts it for step 3 and says whether it did."""
        self.live[stream_log] = _Live(resumable, abandon, self.stream_reserve)
        if self.limit and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="eloquent-sse-budget")

    def remove_stream(self, stream_log: StreamLog) -> None:
        if self.live.pop(stream_log, None) is not None:
            self._freed += self.stream_reserve

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
        held = self.held()
        if held < self.limit * HIGH_WATER:
            return True
        if self.enforce() < self.limit:
            return True
        self.metrics.budget_refusals += 1
        return False

    def enforce(self) -> int:
        """Shed (see the module docstring) while over the budget; returns the bytes held afterwards."""
        held = self._seen = self.held()
        if not self.limit or held < self.limit * HIGH_WATER:
            if self._over and held < self.limit * LOW_WATER:
                self._over = False
                log.warning("memory budget: back under %d bytes (%d held)", self.limit, held)
            return held
        self._pressed = True
        self._tight_until = time.monotonic() + TIGHT_FOR
        if not self._over:
            self._over = True
            log.warning("memory budget: %d bytes held, budget %d: shedding (new streams get 503 at the budget)",
                        held, self.limit)
        target = int(self.limit * LOW_WATER)
        if self.store is not None:
            held -= self.store.shed(held - target)
        if held > target:
            held -= self._shed_history(held - target)
        if held > target:
            held -= self._shed_cut(held - target)
        if held >= self.limit:
            self._cut_readers(held - target)
            held = self.held()  # the cut connections' server buffers are gone where they could be aborted
            if held >= self.limit:
                held -= self._shed_cut(held - target)
        self._seen = held
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
            before = stream_log.base
            shed = stream_log.discard_before(keep)
            self.metrics.history_shed_bytes += shed
            freed += shed + (stream_log.base - before) * self.frame_overhead
        return freed

    def client_cut(self, stream_log: StreamLog) -> None:
        """A client of this live stream was cut. While memory is tight (the last look found the total above
        ``LOW_WATER``, or the budget had to shed within ``TIGHT_FOR`` seconds) its stream is given up now, as in
        step 3, not at the next tick: when 500 clients that never read were cut at once, their engines caught up
        on what they had been held back from and the total jumped by a sixth of the budget within one tick
        (``tests/transports/test_hostile_load.py``)."""
        entry = self.live.get(stream_log)
        if entry is None or not self.limit or not self._sheddable(entry):
            return
        if self._seen >= self.limit * LOW_WATER or time.monotonic() < self._tight_until:
            self._give_up(stream_log, entry)

    @staticmethod
    def _sheddable(entry: _Live) -> bool:
        """Step 3's candidates: a client was cut, and no connection reads the stream here now."""
        return (entry.abandon is not None and not entry.given_up and bool(entry.readers)
                and any(c.cut for c in entry.readers) and all(c.gone for c in entry.readers))

    def _give_up(self, stream_log: StreamLog, entry: _Live) -> int:
        """Step 3 for one stream: the bytes freed, 0 when its ``abandon`` says it must be kept."""
        assert entry.abandon is not None
        if not entry.abandon():
            return 0
        frames = len(stream_log.frames)
        freed = stream_log.discard_before(stream_log.next_index) + frames * self.frame_overhead + entry.reserve
        entry.reserve, entry.given_up = 0, True
        self.metrics.cut_streams_shed += 1
        return freed

    def _shed_cut(self, need: int) -> int:
        candidates = [(log_, entry) for log_, entry in self.live.items() if self._sheddable(entry)]
        candidates.sort(key=lambda item: item[0].nbytes, reverse=True)
        freed = 0
        for stream_log, entry in candidates:
            if freed >= need:
                break
            freed += self._give_up(stream_log, entry)
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
        while self.live or self._freed:
            await asyncio.sleep(TICK)
            try:
                self.enforce()
                unsent = self.unsent()
            except Exception:  # noqa: BLE001 - one bad reading must not end the budget's watch for good
                log.exception("memory budget: reading what is held failed; trying again next tick")
                continue
            self._freed += max(0, self._unsent - unsent)
            self._unsent = unsent
            self._release()

    def _release(self) -> None:
        """Give memory that streams and connections left back to the system, once much of it was freed: the
        objects of ended streams sit in reference cycles (asyncio's and anyio's cancellations leave them), which
        Python's collector reaches late under load (measured: ~24 KiB per stream), and the buffers of aborted
        connections stay in the C heap unless it is trimmed (glibc's ``malloc_trim``). Without this the
        process's memory ran ~20 MiB past what the budget counted when 500 clients that never read were cut at
        once, and stayed there (``tests/transports/test_hostile_load.py``). Only after the budget had to shed (a server far
        from its budget never pauses for this), and at most ``COLLECT_SHARE`` of the time."""
        if not self._pressed or self._freed < self.limit * RELEASE_AFTER:
            if not self.live or not self._pressed:
                self._freed = 0  # no memory pressure, or little freed and nothing live: not worth a pause
            return
        now = time.monotonic()
        if now < self._next_release:
            return
        self._freed, self._pressed = 0, self._over
        started = time.process_time()
        gc.collect()
        if self._trim is not None:
            self._trim(0)
        took = time.process_time() - started
        self._next_release = now + took / COLLECT_SHARE
        log.debug("memory budget: released what ended streams left in %.1f ms", took * 1000)
