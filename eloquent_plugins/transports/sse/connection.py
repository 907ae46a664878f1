"""Writing one stream to one client connection.

Fast path: while the client keeps up, the app's own task writes each new event straight to the client
(``event_path.EventPath.write``), so a caught-up stream costs no task switch per event. Otherwise the
connection's task writes. The two share this object's state (cursor, offset, ``busy``, ``waiter``, the cut),
which is why those fields are public.

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
from collections.abc import Callable, Coroutine
from enum import IntEnum
from typing import Any

from eloquent_plugins.core.keepalive import KeepAlivePolicy, KeepAliveTimer
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.transports.asgi import Message, Send
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import ReplaySource
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
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


_OPEN = ConnState.OPEN  # read per event: a global, not an Enum attribute lookup
_CUT = ConnState.TIMED_OUT


class Connection:
    def __init__(self, send: Send, source: ReplaySource, cursor: int, *, policy: KeepAlivePolicy,
                 send_timeout: float, metrics: StreamMetrics, merge: Merge | None = None, coalesce: bool = True,
                 renew_lease: Callable[[], Coroutine[Any, Any, None]] | None = None, lease_every: float = 1.0,
                 max_queued: int = 0, socket: SocketControl | None = None,
                 padding: PaddingPolicy | None = None, send_tick: float = 0.0) -> None:
        self.send = send if padding is None or not padding.enabled else _padded(send, padding, metrics)
        """The server's ``send``; with ``padding``, one that pads each write with an SSE comment as it goes out
        (``core.padding``): the log never holds padding (a resume, coalescing and the log's byte counts are as
        without it), and the per-event path is the same code either way (nothing is tested per event)."""
        self.send_tick = send_tick
        """``--send-tick``: this connection's task writes only at multiples of it (loop time), so write times follow
        the clock, not the tokens; the direct path is off (its ``waiter`` is never set). 0: write at once."""
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
        self.waiter: asyncio.Future[None] | None = None
        """What this connection's task waits on (new events, or the end of a direct write): set while it waits."""
        self.keepalive_due = False
        self._keepalive = KeepAliveTimer(policy, 0.0)
        self.written_at = 0.0
        """Loop time of the last bytes handed to ``send``: the keep-alive timer is told when it is asked
        (``_idle_timer``), not per write (a call less per event on the direct path)."""
        self.sending_since: float | None = None
        """Loop time the send in progress started (a tick cuts it past ``send_timeout``); None between sends."""
        self._task: asyncio.Task[str] | None = None
        self._next_lease = 0.0
        self._lease_task: asyncio.Task[None] | None = None
        self.parked = False
        """This connection's task waits for a direct write to end (it is woken when it does)."""
        self.busy = False
        """Someone (this connection's task or the producer) is inside ``send``."""
        self.direct_task: asyncio.Task[Any] | None = None
        """The producer's task while it is inside a direct ``send`` (a cut cancels it there)."""
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
        return STALLED_SEND_BYTES if self.sending_since is not None else 0

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
        if self.direct_task is not None:
            self.direct_task.cancel()  # the producer is stuck writing: cut it loose
            self.wakeup()
        elif self._task is not None and self.busy:
            self._task.cancel()
        else:
            self.wakeup()

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
        self.wakeup()

    def _idle_timer(self) -> KeepAliveTimer:
        """The keep-alive timer, told of the last write."""
        timer = self._keepalive
        timer.activity(self.written_at)
        return timer

    def wakeup(self) -> None:
        fut = self.waiter
        if fut is not None:
            self.waiter = None
            if not fut.done():
                fut.set_result(None)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.sending_since is not None:
            if self.send_timeout > 0 and now - self.sending_since > self.send_timeout and self._task is not None:
                self._cut(ConnState.TIMED_OUT)
                return
            if self.max_queued and self.state is _OPEN and self.queued > self.max_queued:
                self._cut(ConnState.OVERFLOWED)
                return
        elif self._idle_timer().due(now):
            self.keepalive_due = True
            self.wakeup()
        if self.renew_lease is not None and now >= self._next_lease and (
                self._lease_task is None or self._lease_task.done()):
            self._next_lease = now + self.lease_every
            self._lease_task = loop.create_task(self.renew_lease())
        self._handle = loop.call_later(self._tick_every, self._tick)

    async def _run(self) -> str:
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.written_at = started  # the idle clock runs from the response start: before the first token too
        self._handle = loop.call_later(self._tick_every, self._tick)
        if self.renew_lease is not None:
            self._next_lease = started + self.lease_every
        source, send, metrics, merge = self.source, self.send, self.metrics, self.merge
        try:
            while True:
                if self.busy:  # the producer is writing to this client directly; it wakes us when done
                    wake = loop.create_future()
                    self.waiter = wake
                    self.parked = True
                    try:
                        await wake
                    finally:
                        self.parked = False
                        self.waiter = None
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
                    self.sending_since = loop.time()
                    self.busy = True
                    try:
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                    finally:
                        self.busy = False
                        self.sending_since = None
                    self.written_at = loop.time()
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
                if self.keepalive_due:
                    self.keepalive_due = False
                    frame = self.policy.sse_frame  # see keepalive.SSE_COMMENT_FRAME for why it is one line
                    self.sending_since = loop.time()
                    self.busy = True
                    try:
                        await send({"type": "http.response.body", "body": frame, "more_body": True})
                    finally:
                        self.busy = False
                        self.sending_since = None
                    self.written_at = loop.time()
                    metrics.keepalives += 1
                    metrics.bytes_sent += len(frame)
                    continue
                if tick:
                    continue  # the next tick takes what came meanwhile
                wake = loop.create_future()
                self.waiter = wake
                deadline = self._idle_timer().deadline()
                timeout = deadline - loop.time() if deadline is not None else 1.0
                await source.wait(self.cursor, max(0.01, timeout), wake)
                self.waiter = None
        except OSError:
            # ASGI 2.4 servers raise on a send to a closed connection.
            return "disconnected"
        except EventsGone:
            # Events this reader had not had yet were dropped here (the memory budget shed them): end the body
            # uncompleted, so the client resumes (from Redis, or gets a 410), never a body with a gap in it.
            return "aborted"
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
