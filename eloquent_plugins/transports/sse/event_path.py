"""One produced SSE stream's per-event path: the id line, the log append, the gap histogram and the write.

Why one object: on a busy server each event of a stream finds the code and data of the previous one out of the
caches (issue 16), so what an event costs is what its path touches. This object holds, as its own fields, what
every event needs (the log's frame list, the id prefix, the clock, the histogram's lists, the server's ``send``)
and owns the stream's timing figures (first, last, largest gap). The producer (parsing, plugins) feeds it;
the exchange hands the app's body chunks to ``write``; the connection's own task writes whatever this path does
not (a client behind, a backlog, keep-alives) and owns the cut.

``write`` is the hot path: for a caught-up client and a one-``data:``-line chunk it builds the frame once, appends
it to the log (``StreamLog.append``, inline), observes the gap (``Histogram.observe``, inline) and sends it in the
app's task, with no task switch. ``tests/transports/sse/test_sse_producer.py`` holds it to the general path
(``add`` and ``Producer.feed``): frames, bytes written, gap histogram, ttft, tpot.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable

from eloquent_plugins.core.protocol import format_event_id
from eloquent_plugins.transports.asgi import Send
from eloquent_plugins.transports.metrics import Latency, StreamMetrics
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.connection import MAX_LAG_EVENTS, Connection, ConnState

ID_ENDS = tuple(b"%d\n" % index for index in range(4096))
"""The end of event n's id line (``n\\n``) for the first 4096 events (~180 KiB per process, built once): a frame
is then one ``join`` of three bytes objects, 0.1 us less per event than formatting the integer."""

_DATA = b"data: "
_join = b"".join
_bisect = bisect_left
_OPEN = ConnState.OPEN  # read per event: a global, not an Enum attribute lookup
_CUT = ConnState.TIMED_OUT


class EventPath:
    __slots__ = ("log", "frames", "ids", "id_prefix", "inline", "clock", "started", "first", "last", "max_gap",
                 "latency", "gaps", "counts", "bounds", "metrics", "conn", "feed", "send", "time", "task")

    def __init__(self, log: StreamLog, *, token: str | None, metrics: StreamMetrics, latency: Latency,
                 started: float, clock: Callable[[], float]) -> None:
        self.log = log
        """A new, empty log: event n of the stream is the log's index n (``log.next_index`` is the next id)."""
        self.frames = log.frames
        """The log's own list (``StreamLog`` changes it in place only)."""
        self.ids = token is not None
        self.id_prefix = b"id: " + format_event_id(token, 0).encode()[:-1] if token is not None else b""
        """Event n's id line is this prefix + ``ID_ENDS[n]`` (``b"%d\\n" % n`` past the table): ``format_event_id``
        with the index cut off."""
        self.inline = False
        """``write`` may log a one-line ``data:`` chunk itself: the stream has ids, no plugin sees its events, its
        first event is logged and the app's body so far ended on an event boundary (set by the producer)."""
        self.clock = clock
        self.started = started
        self.first: float | None = None
        """``clock()`` at the first event."""
        self.last = 0.0
        """``clock()`` at the latest event."""
        self.max_gap = 0.0
        """The largest gap between two events so far (seconds): the stream's worst stall at the source."""
        self.latency = latency
        self.gaps = latency.gap
        self.counts = self.gaps.counts
        self.bounds = self.gaps.bounds
        self.metrics = metrics
        self.conn: Connection | None = None
        """The connection ``write`` writes to while its client keeps up (``attach``); None: every chunk is fed."""
        self.feed: Callable[[bytes], None] | None = None
        """The producer's ``feed``: every chunk ``write`` does not log itself."""
        self.send: Send | None = None
        self.time: Callable[[], float] = time_unset
        self.task: asyncio.Task[object] | None = None
        """The app's task, looked up at its first direct write (an ASGI app sends one response body from one task;
        ``asyncio.current_task`` is slow in Python 3.11)."""

    def add(self, frame: bytes) -> None:
        """Log one event whose frame (no id line) is ``frame``: the general path, and the producer's only one."""
        log = self.log
        if self.ids:
            index = log.next_index
            frame = _join((self.id_prefix, ID_ENDS[index] if index < 4096 else b"%d\n" % index, frame))
        now = self.clock()
        if self.first is None:
            self.first = now
            self.latency.ttft.observe(now - self.started)
        else:
            gap = now - self.last
            self.gaps.observe(gap)
            if gap > self.max_gap:
                self.max_gap = gap
        self.last = now
        self.metrics.events += 1
        log.append(frame)

    def attach(self, conn: Connection, feed: Callable[[bytes], None]) -> None:
        """Write through ``conn`` (which reads this path's log) from now on; ``feed`` is the producer's."""
        source = conn.source
        if not isinstance(source, LocalSource) or source.log is not self.log or conn.metrics is not self.metrics:
            raise ValueError("an event path writes through a connection on its own log and metrics")
        self.conn, self.feed, self.send = conn, feed, conn.send
        self.time = asyncio.get_running_loop().time

    def detach(self) -> None:
        """The stream is over: drop the connection and the producer (no reference cycle outlives the request)."""
        self.conn = self.feed = self.send = None

    async def write(self, body: bytes) -> None:
        """One body chunk of the app's stream, in the app's task (``Exchange.app_send`` hands this coroutine back
        as its ``send``): logged, and when the connection is idle and caught up, written here with no task switch;
        otherwise the connection's task writes it, and the app waits while its client is more than
        ``MAX_LAG_EVENTS`` behind (or the client is cut, past ``max_queued``).

        Per event, so it is the only coroutine of ours on the path and calls nothing it can do inline: the common
        case (``inline``, a one-``data:``-line chunk, the connection the log's only listener) is ``add`` and
        ``StreamLog.append`` written out (``bench_cost --opcodes`` counts what is left per event)."""
        conn: Connection = self.conn  # type: ignore[assignment]  # attached before the app's first body chunk
        log = self.log
        metrics = self.metrics
        end = log.next_index
        if conn.waiter is not None and not conn.busy and conn.state is _OPEN and conn.cursor == end:  # caught up
            if (self.inline and len(log.listeners) == 1 and body.startswith(_DATA)
                    and body.find(10) == len(body) - 2 and body[-1] == 10 and 13 not in body):  # one_data_line
                frame = _join((self.id_prefix, ID_ENDS[end] if end < 4096 else b"%d\n" % end, body))
                size = len(frame)
                self.frames.append(frame)
                end = log.next_index = end + 1
                appended = log.appended = log.appended + size
                if end > log.index_cap or appended > log.byte_cap:
                    log.trim()
                now = self.clock()
                gap = now - self.last
                self.counts[_bisect(self.bounds, gap)] += 1  # Histogram.observe, inline
                self.gaps.sum += gap
                if gap > self.max_gap:
                    self.max_gap = gap
                self.last = now
                metrics.events += 1
                conn.busy = True
                conn.offset = appended  # it was the log's byte count: the connection was caught up
            else:
                conn.busy = True
                source: LocalSource = conn.source  # type: ignore[assignment]
                source.held = True  # the append must not wake the connection's task: the write happens here
                try:
                    self.feed(body)  # type: ignore[misc]
                except BaseException:
                    source.held = False
                    conn.busy = False
                    conn.wakeup()  # whatever was appended before the failure goes out from the connection's task
                    raise
                source.held = False
                cursor = end
                end = log.next_index
                if end <= cursor:
                    conn.busy = False
                    if conn.parked:
                        conn.wakeup()
                    return
                if end - cursor == 1:
                    frame = self.frames[-1]
                else:
                    start = cursor - log.base
                    if start < 0:  # trimmed before it was written (a tiny max_stream_events): cut, a resume gets 410
                        conn.busy = False
                        conn.overflow()
                        return
                    frame = _join(self.frames[start:])
                size = len(frame)
                conn.offset += size
        else:
            self.feed(body)  # type: ignore[misc]
            if conn.state is _OPEN:
                if conn.max_queued and log.appended - conn.offset > conn.max_queued:
                    conn.overflow()  # a client that does not read: cut it (it may resume)
                elif log.next_index - conn.cursor > MAX_LAG_EVENTS:
                    while log.next_index - conn.cursor > MAX_LAG_EVENTS // 2 and conn.state is _OPEN:
                        await asyncio.sleep(0.005)
            return
        conn.cursor = end
        conn.sending_since = now = self.time()
        task = self.task
        if task is None:
            task = self.task = asyncio.current_task()
        conn.direct_task = task
        try:
            await self.send({"type": "http.response.body", "body": frame, "more_body": True})  # type: ignore[misc]
        except asyncio.CancelledError:
            if conn.state < _CUT or conn.direct_task is None:
                raise
            conn.direct_task.uncancel()  # our own cut (send timeout, queue), not a cancellation of the app
        except OSError:
            conn.disconnect()
        finally:
            conn.direct_task = None
            conn.sending_since = None
            conn.busy = False
        # The send normally completes without suspending, so the clock read before it is good enough.
        conn.written_at = now
        metrics.bytes_sent += size
        metrics.writes += 1
        if conn.parked:
            # Its task saw this write in progress and waits for it to end. Nothing else needs a wake-up here:
            # whatever else it must see while this write was in progress woke it already (the log's listener on
            # an append or the close, ``wakeup`` on a cut, a disconnect or a keep-alive due).
            conn.wakeup()


def time_unset() -> float:
    """``EventPath.time`` before ``attach``: no direct write happens then."""
    raise RuntimeError("EventPath.write before attach")
