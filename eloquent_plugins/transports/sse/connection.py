# long: its own task and the app's direct write (write_direct) share one connection state (cursor, busy, the cut)
"""Writing one stream to one client connection.

Fast path: while the client keeps up, the producer (the app's own task) writes each new event straight to the
client (``write_direct``), so a caught-up stream costs no task switch per event. Otherwise the
connection's task writes.

The connection reads the stream from its own cursor: whatever is queued goes out in one write (coalescing: a
client that keeps up gets each event as soon as it exists, a slow one gets everything pending at once). A
periodic tick sends the keep-alive when the core's ``KeepAliveTimer`` (the same idle clock the datagram sender
keeps) says one is due, cuts a client that accepts no bytes for ``send_timeout`` seconds or that has more than
``max_queued`` bytes of a local stream waiting for it (it does not read, but the kernel took enough that no send
stalls for long), and renews the connection's lease so the producer (on any replica) knows the stream is still
read. A cut client can resume.
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_left
from collections.abc import Callable, Coroutine
from enum import IntEnum
from typing import Any

from eloquent_plugins.core.keepalive import KeepAlivePolicy, KeepAliveTimer
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.transports.asgi import Message, Send
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import ReplaySource
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.producer import ID_ENDS, Producer
from eloquent_plugins.transports.sse.socket_control import STALLED_SEND_BYTES, SocketControl

Merge = Callable[[list[bytes]], tuple[list[bytes], int]]

MAX_LAG_EVENTS = 1024
"""A connected client this many events behind makes the app's ``send`` wait (bounded memory per stream)."""


class ConnState(IntEnum):
    """Where a connection is; it only moves forward (a cut client that also hung up counts as cut)."""

    OPEN = 0
    GONE = 1
    """The client went away: seen on ``receive``, or a send to it failed."""
    TIMED_OUT = 2
    """The client accepted no bytes for ``send_timeout`` seconds and was cut."""
    OVERFLOWED = 3
    """More than ``max_queued`` bytes waited for the client (or the memory budget needed them): it was cut."""
    DRAINED = 4
    """The server drained and its deadline came: cut, so that the client resumes on another replica."""


_DATA = b"data: "
_join = b"".join
_bisect = bisect_left
_OPEN = ConnState.OPEN  # read per event: a global, not an Enum attribute lookup
_CUT = ConnState.TIMED_OUT


class Connection:
    def __init__(self, send: Send, source: ReplaySource, cursor: int, *, policy: KeepAlivePolicy,
                 send_timeout: float, metrics: StreamMetrics, merge: Merge | None = None, coalesce: bool = True,
                 renew_lease: Callable[[], Coroutine[Any, Any, None]] | None = None, lease_every: float = 1.0,
                 max_queued: int = 0, socket: SocketControl | None = None, producer: Producer | None = None,
                 padding: PaddingPolicy | None = None, send_tick: float = 0.0) -> None:
        self.send = send if padding is None or not padding.enabled else _padded(send, padding, metrics)
        """The server's ``send``; with ``padding``, one that pads each write with an SSE comment as it goes out
        (``core.padding``): the log never holds padding (a resume, coalescing and the log's byte counts are as
        without it), and the per-event path is the same code either way (nothing is tested per event)."""
        self.send_tick = send_tick
        """``--send-tick``: this connection's task writes only at multiples of it (loop time), so write times follow
        the clock, not the tokens; the direct path is off (its ``_wake`` is never set). 0: write at once."""
        self.producer = producer
        """The stream's producer when the app's task writes through this connection (``write_direct``); None for
        a resume connection."""
        self.socket = socket
        """The client's connection when the server lets us reach it (``socket_control``): a cut aborts it."""
        self.source = source
        self.cursor = cursor
        self.max_queued = max_queued if isinstance(source, LocalSource) else 0
        self.offset = source.log.offset(cursor) if isinstance(source, LocalSource) else 0
        """Byte offset in the local log of what has been handed to ``send`` (``StreamLog.appended`` terms)."""
        self.policy = policy
        self.send_timeout = send_timeout
        self.metrics = metrics
        self.merge = merge
        self.coalesce = coalesce
        self.renew_lease = renew_lease
        self.lease_every = lease_every
        self.state = ConnState.OPEN
        self._wake: asyncio.Future[None] | None = None
        self._keepalive_due = False
        self._keepalive = KeepAliveTimer(policy, 0.0)
        self._written_at = 0.0
        """Loop time of the last bytes handed to ``send``: the keep-alive timer is told when it is asked
        (``_idle_timer``), not per write (a call less per event on the direct path)."""
        self._sending_since: float | None = None
        self._task: asyncio.Task[str] | None = None
        self._next_lease = 0.0
        self._lease_task: asyncio.Task[None] | None = None
        self._parked_busy = False
        self.busy = False
        """Someone (this connection's task or the producer) is inside ``send``."""
        self._direct_task: asyncio.Task[Any] | None = None
        """The producer's task while it is inside a direct ``send`` (a cut cancels it there)."""
        self._producer_task: asyncio.Task[Any] | None = None
        self._local_log = source.log if isinstance(source, LocalSource) else None
        """The log ``write_direct`` appends to and writes from; None for a remote source."""
        intervals = [x for x in (policy.interval if policy.enabled else 0.0, send_timeout) if x > 0]
        self._tick_every = min(1.0, min(intervals) / 4) if intervals else 1.0
        if renew_lease is not None:
            self._tick_every = min(self._tick_every, lease_every)

    @property
    def gone(self) -> bool:
        """No more bytes go to this client (it left, or was cut)."""
        return self.state is not _OPEN

    @property
    def timed_out(self) -> bool:
        return self.state is ConnState.TIMED_OUT

    @property
    def cut(self) -> bool:
        """This connection cut the client (send timeout, or too much queued); the client may resume."""
        return self.state >= ConnState.TIMED_OUT

    @property
    def queued(self) -> int:
        """Bytes of the local log waiting for this client (0 for a remote source)."""
        source = self.source
        return source.log.appended - self.offset if isinstance(source, LocalSource) else 0

    @property
    def unsent(self) -> int:
        """Bytes handed to ``send`` that the server still holds for this client (the memory budget counts them):
        the server's figure, else ``STALLED_SEND_BYTES`` while a send is suspended; 0 once the client is gone."""
        if self.state is not _OPEN:
            return 0
        if self.socket is not None:
            return self.socket.unsent()
        return STALLED_SEND_BYTES if self._sending_since is not None else 0

    def overflow(self) -> None:
        """Cut the client: too much is queued for it. Its send in progress, if any, is abandoned."""
        if self.state is _OPEN:
            self._cut(ConnState.OVERFLOWED)

    def drained(self) -> None:
        """Cut the client at the drain deadline (``transports.drain``): its body ends early, it resumes elsewhere."""
        if self.state is _OPEN:
            self._cut(ConnState.DRAINED)

    def _cut(self, state: ConnState) -> None:
        self._end(state)
        if self.socket is not None:
            # Drop what the server still buffers for this client now: a plain close waits for it to drain, which
            # a client that does not read never allows (see ``socket_control``). The client sees the body end
            # early and resumes from the last event it got.
            self.socket.abort()
        if self._direct_task is not None:
            self._direct_task.cancel()  # the producer is stuck writing: cut it loose
            self._wakeup()
        elif self._task is not None and self.busy:
            self._task.cancel()
        else:
            self._wakeup()

    def _end(self, state: ConnState) -> None:
        if state > self.state:
            self.state = state

    def start(self) -> asyncio.Task[str]:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="eloquent-sse-connection")
        return self._task

    def disconnect(self) -> None:
        """The client went away (seen on ``receive``)."""
        self._end(ConnState.GONE)
        self._wakeup()

    async def write_direct(self, body: bytes) -> None:
        """One body chunk of the app's stream, in the app's task (``Exchange.app_send`` hands this coroutine back
        as its ``send``): the producer logs it, and when this connection is idle and caught up it is written here,
        with no task switch per event; otherwise the connection's task writes it, and the app waits while its
        client is more than ``MAX_LAG_EVENTS`` behind (or the client is cut, past ``max_queued``).

        Per event, so it is the only coroutine of ours on the path and calls nothing it can do inline. The common
        case (a plain producer, a one-``data:``-line chunk, this connection the log's only listener) is
        ``Producer._event``, ``StreamLog.append`` and ``Histogram.observe`` written out here (``bench_cost
        --opcodes`` counts what is left per event): on a busy server each call is code and
        data the caches lost since the stream's previous event (issue 16; ``tests/transports/sse/test_sse_producer.py`` holds
        it to the general path's frames and figures). The producer's task is looked up once per connection (an
        ASGI app sends one response body from one task; ``asyncio.current_task`` is slow in Python 3.11)."""
        producer: Producer = self.producer  # type: ignore[assignment]  # set for every connection that gets here
        log: StreamLog = self._local_log  # type: ignore[assignment]
        caught_up = (self._wake is not None and not self.busy and self.state is _OPEN
                     and self.cursor == log.next_index)
        if (caught_up and producer.plain and producer.clean and len(log.listeners) == 1 and body.startswith(_DATA)
                and body.find(10) == len(body) - 2 and body[-1] == 10 and 13 not in body):  # sse_reader.one_data_line
            index = log.next_index
            end = index + 1
            frame = _join((producer.id_prefix, ID_ENDS[index] if index < 4096 else b"%d\n" % index, body))  # id_end
            size = len(frame)
            log.frames.append(frame)
            log.next_index = end
            log.nbytes += size
            log.appended += size
            if end - log.base > log.max_events or log.nbytes > log.max_bytes:
                log.trim()
            now = producer.clock()
            gap = now - producer.last
            gaps = producer.gaps  # Histogram.observe, inline
            gaps.counts[_bisect(gaps.bounds, gap)] += 1
            gaps.sum += gap
            if gap > producer.max_gap:
                producer.max_gap = gap
            producer.last = now
            producer.metrics.events += 1
            self.busy = True
        elif caught_up:
            self.busy = True
            source: LocalSource = self.source  # type: ignore[assignment]
            source.held = True  # the append must not wake this connection's task: the write happens here
            try:
                producer.feed(body)
            except BaseException:
                source.held = False
                self.busy = False
                self._wakeup()  # whatever was appended before the failure goes out from the connection's task
                raise
            source.held = False
            cursor = self.cursor
            end = log.next_index
            if end <= cursor:
                self.busy = False
                if self._parked_busy:
                    self._wakeup()
                return
            if end - cursor == 1:
                frame = log.frames[-1]
            else:
                start = cursor - log.base
                if start < 0:  # trimmed before it was written (a tiny max_stream_events): cut, a resume gets a 410
                    self.busy = False
                    self._cut(ConnState.OVERFLOWED)
                    return
                frame = b"".join(log.frames[start:])
            size = len(frame)
        else:
            producer.feed(body)
            if self.state is _OPEN:
                if self.max_queued and log.appended - self.offset > self.max_queued:
                    self.overflow()  # a client that does not read: cut it (it may resume)
                elif log.next_index - self.cursor > MAX_LAG_EVENTS:
                    while log.next_index - self.cursor > MAX_LAG_EVENTS // 2 and self.state is _OPEN:
                        await asyncio.sleep(0.005)
            return
        self.cursor = end
        self.offset += size
        self._sending_since = now = self._loop.time()
        task = self._producer_task
        if task is None:
            task = self._producer_task = asyncio.current_task(self._loop)
        self._direct_task = task
        try:
            await self.send({"type": "http.response.body", "body": frame, "more_body": True})
        except asyncio.CancelledError:
            if self.state < ConnState.TIMED_OUT or self._direct_task is None:
                raise
            self._direct_task.uncancel()  # our own cut (send timeout, queue), not a cancellation of the app
        except OSError:
            self._end(ConnState.GONE)
        finally:
            self._direct_task = None
            self._sending_since = None
            self.busy = False
        # The send normally completes without suspending, so the clock read before it is good enough.
        self._written_at = now
        metrics = self.metrics
        metrics.bytes_sent += size
        metrics.writes += 1
        if (self.state is not _OPEN or self._keepalive_due or self._parked_busy or log.closed
                or end < log.next_index):
            self._wakeup()

    def _idle_timer(self) -> KeepAliveTimer:
        """The keep-alive timer, told of the last write."""
        timer = self._keepalive
        timer.activity(self._written_at)
        return timer

    def _wakeup(self) -> None:
        fut = self._wake
        if fut is not None:
            self._wake = None
            if not fut.done():
                fut.set_result(None)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._sending_since is not None:
            if self.send_timeout > 0 and now - self._sending_since > self.send_timeout and self._task is not None:
                self._cut(ConnState.TIMED_OUT)
                return
            if self.max_queued and self.state is _OPEN and self.queued > self.max_queued:
                self._cut(ConnState.OVERFLOWED)
                return
        elif self._idle_timer().due(now):
            self._keepalive_due = True
            self._wakeup()
        if self.renew_lease is not None and now >= self._next_lease and (
                self._lease_task is None or self._lease_task.done()):
            self._next_lease = now + self.lease_every
            self._lease_task = loop.create_task(self.renew_lease())
        self._handle = loop.call_later(self._tick_every, self._tick)

    async def _run(self) -> str:
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._written_at = started  # the idle clock runs from the response start: before the first token too
        self._handle = loop.call_later(self._tick_every, self._tick)
        if self.renew_lease is not None:
            self._next_lease = started + self.lease_every
        source, send, metrics, merge = self.source, self.send, self.metrics, self.merge
        try:
            while True:
                if self.busy:  # the producer is writing to this client directly; it wakes us when done
                    wake = loop.create_future()
                    self._wake = wake
                    self._parked_busy = True
                    try:
                        await wake
                    finally:
                        self._parked_busy = False
                        self._wake = None
                    continue
                if self.state >= _CUT:
                    return "disconnected"  # ``finished`` reports why it was cut
                tick = self.send_tick
                if tick:
                    await asyncio.sleep(tick - loop.time() % tick)
                    if self.state >= _CUT:
                        return "disconnected"
                frames = source.take(self.cursor)
                if frames:
                    if not self.coalesce:
                        frames = frames[:1]
                    count = len(frames)
                    if count == 1:
                        body = frames[0]
                        size = len(body)
                    elif merge is not None:
                        size = sum(map(len, frames))  # the log's bytes, not the merged ones
                        frames, merged = merge(frames)
                        metrics.events_merged += merged
                        body = b"".join(frames)
                    else:
                        body = b"".join(frames)
                        size = len(body)
                    self.cursor += count
                    self.offset += size
                    self._sending_since = loop.time()
                    self.busy = True
                    try:
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                    finally:
                        self.busy = False
                        self._sending_since = None
                    self._written_at = loop.time()
                    metrics.bytes_sent += len(body)
                    metrics.writes += 1
                    if self.state is not _OPEN:
                        return "disconnected"
                    continue
                if source.ended(self.cursor):
                    if source.end_reason == "disconnected":
                        # The engine request was aborted: end the body without completing it, so that no client
                        # takes a cut-off stream for a whole one (a resume then gets a 410).
                        return "aborted"
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return "complete"
                if self.state is not _OPEN:
                    return "disconnected"
                if self._keepalive_due:
                    self._keepalive_due = False
                    frame = self.policy.sse_frame  # see keepalive.SSE_COMMENT_FRAME for why it is one line
                    self._sending_since = loop.time()
                    self.busy = True
                    try:
                        await send({"type": "http.response.body", "body": frame, "more_body": True})
                    finally:
                        self.busy = False
                        self._sending_since = None
                    self._written_at = loop.time()
                    metrics.keepalives += 1
                    metrics.bytes_sent += len(frame)
                    continue
                if tick:
                    continue  # the next tick takes what came meanwhile
                wake = loop.create_future()
                self._wake = wake
                deadline = self._idle_timer().deadline()
                timeout = deadline - loop.time() if deadline is not None else 1.0
                await source.wait(self.cursor, max(0.01, timeout), wake)
                self._wake = None
        except OSError:
            # ASGI 2.4 servers raise on a send to a closed connection.
            return "disconnected"
        finally:
            self._handle.cancel()
            if self._lease_task is not None and not self._lease_task.done():
                self._lease_task.cancel()
            source.close()

    async def finished(self) -> str:
        """Wait for the connection to end; ``send_timeout`` when the client stopped reading."""
        assert self._task is not None
        try:
            reason = await asyncio.shield(self._task)
            if self.state >= ConnState.TIMED_OUT:
                return self._cut_reason()
            return reason
        except asyncio.CancelledError:
            if self.state >= ConnState.TIMED_OUT and self._task.done():
                return self._cut_reason()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            raise

    def _cut_reason(self) -> str:
        if self.state is ConnState.TIMED_OUT:
            self.metrics.send_timeouts += 1
            return "send_timeout"
        if self.state is ConnState.DRAINED:
            return "drained"
        self.metrics.clients_cut += 1
        return "queue_full"


def _padded(send: Send, policy: PaddingPolicy, metrics: StreamMetrics) -> Send:
    """``send`` that pads every body write (``PaddingPolicy.sse_writes``: one comment line after the events in the
    same write; ``constant`` also cuts it into its units, one write each); the padding is counted in
    ``metrics.padding_bytes``."""

    async def padded(message: Message) -> None:
        body = message.get("body", b"")
        if not body or message["type"] != "http.response.body":
            await send(message)
            return
        writes = policy.sse_writes(body)
        metrics.padding_bytes += sum(map(len, writes)) - len(body)
        for chunk in writes[:-1]:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": writes[-1], "more_body": message.get("more_body", False)})

    return padded
