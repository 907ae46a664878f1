"""The datagram pump of one HTTP/3 connection: it runs the ``DatagramScheduler``'s plan (which datagrams leave
now, fallbacks, stream ends, stalled streams, probes) and keeps the plan's one deadline timer.

Network events and timers end in ``run``; an app's send ends in ``stream``, which sends that stream's new
datagrams first and runs the rest of the plan after (issue 19). The connection is seen only through
``PumpHost``: the wire, its lifecycle, and its book of requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from eloquent_plugins.core.protocol import H3_REQUEST_CANCELLED
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.h3glue.common import (
    DatagramH3Connection,
    datagram_room,
    has_pending_datagrams,
    packet_numbers,
    peer_max_datagram_frame_size,
    request_probe,
)
from eloquent_plugins.transports.http3.lifecycle import ConnectionState
from eloquent_plugins.transports.http3.scheduler import DatagramScheduler, Plan, StepKind, fits
from eloquent_plugins.transports.http3.state import ServerState

log = logging.getLogger("eloquent_plugins.transports.http3")


class PumpedRequest(Protocol):
    """What the pump reads of a request: its Eloquent stream, its id and peer (timings), and how to end it."""

    @property
    def request_id(self) -> str: ...
    @property
    def scope(self) -> dict[str, Any]: ...
    @property
    def eloquent(self) -> EloquentResponseStream | None: ...
    def disconnect(self) -> None: ...


class DatagramTargets(Protocol):
    """Which stream's quarter id prefixes a stream's datagrams (the WebTransport session's, for its streams)."""

    def datagram_target(self, stream_id: int) -> int: ...


class PumpHost(Protocol):
    """What the pump needs of its connection (``Http3Connection``)."""

    state: ServerState

    @property
    def lifecycle(self) -> ConnectionState: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def quic(self) -> Any: ...
    @property
    def h3(self) -> DatagramH3Connection | None: ...
    @property
    def webtransport(self) -> DatagramTargets | None: ...
    @property
    def requests(self) -> Mapping[int, PumpedRequest]: ...

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> bool: ...
    def reset(self, stream_id: int, code: int) -> None: ...
    def transmit(self) -> None: ...
    def forget_if_idle(self, stream_id: int) -> None: ...


class DatagramPump:
    """Runs one connection's datagram plan (module docstring)."""

    def __init__(self, host: PumpHost, scheduler: DatagramScheduler) -> None:
        self.host = host
        self.scheduler = scheduler
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._deadline_at: float | None = None
        self._soon_handle: asyncio.Handle | None = None
        self._rest_handle: asyncio.TimerHandle | None = None
        """``stream``'s deferred plan (timers and the other streams), after the I/O that is ready."""
        self._send_batch = 0
        """With ``record_timings``: counts the transmits that carry datagrams (which sends share a packet)."""

    def soon(self) -> None:
        host = self.host
        if self._soon_handle is None and not host.terminated:
            self._soon_handle = host.loop.call_soon(self.run)

    def run(self) -> None:
        self._soon_handle = None
        host = self.host
        if not host.lifecycle.live:
            host.transmit()
            return
        quic = host.quic
        now = host.loop.time()
        plan = self._plan(quic, now)
        self._execute(plan)
        host.transmit()
        self._schedule_deadline(now)

    def stream(self, stream_id: int) -> None:
        """The app pushed events on ``stream_id``: their datagrams leave first (``DatagramScheduler.direct``);
        the full plan (timers, the other streams) runs later, once the I/O already waiting has been served: work
        before the send, or between the send and the next read, is render latency (issue 19)."""
        host = self.host
        quic = host.quic
        if not host.lifecycle.live or has_pending_datagrams(quic):
            self.run()
            return
        loop = host.loop
        batch = self.scheduler.direct(stream_id, loop.time(), datagram_room(quic))
        if batch is None:
            self.run()
            return
        if batch:
            self._send_datagrams(batch)
            host.transmit()
        if self._rest_handle is None:
            # On asyncio's loop a timer due now runs after the I/O callbacks of the next turn (``call_soon`` would
            # run before them): acks and other streams' packets already waiting go first, the bookkeeping after.
            # uvloop runs due timers before its poll: there the plan simply comes one turn later.
            self._rest_handle = loop.call_at(loop.time(), self._rest)

    def _rest(self) -> None:
        """The plan after ``stream``'s send: timers, fallbacks, the other streams; a transmit only if it
        produced something (an empty transmit still costs aioquic a packet build)."""
        self._rest_handle = None
        host = self.host
        if not host.lifecycle.live:
            return
        quic = host.quic
        now = host.loop.time()
        plan = self._plan(quic, now)
        if plan.steps or plan.datagrams or plan.probe:
            self._execute(plan)
            host.transmit()
        self._schedule_deadline(now)

    def _plan(self, quic: Any, now: float) -> Plan:
        self.scheduler.note_path(now, *packet_numbers(quic))
        return self.scheduler.plan(now, datagram_room(quic), transport_queue_empty=not has_pending_datagrams(quic))

    def _execute(self, plan: Plan) -> None:
        host = self.host
        if plan.probe:
            request_probe(host.quic)
        for step in plan.steps:
            if step.kind is StepKind.FALLBACK:
                host.send_data(step.stream_id, step.data, True)
            elif step.kind is StepKind.STALLED:
                request = host.requests.get(step.stream_id)
                timeout = request.eloquent.ack_timeout if request is not None and request.eloquent else 0.0
                log.info("stream %d: no ack progress for %.1f s; cancelling it", step.stream_id, timeout)
                host.reset(step.stream_id, H3_REQUEST_CANCELLED)
                if request is not None:
                    request.disconnect()
            else:
                host.send_data(step.stream_id, b"", True)
            host.forget_if_idle(step.stream_id)
        if plan.datagrams:
            self._send_datagrams(plan.datagrams)

    def _send_datagrams(self, batch: list[tuple[int, bytes]]) -> None:
        host = self.host
        h3 = host.h3
        assert h3 is not None
        limit = peer_max_datagram_frame_size(host.quic) or 0
        previous_stream: int | None = None
        record = host.state.options.record_timings
        self._send_batch += record
        wt = host.webtransport
        for stream_id, datagram in batch:
            target = wt.datagram_target(stream_id) if wt is not None else stream_id  # a session's, for WebTransport
            if not fits(target, datagram, limit):
                continue  # cannot happen with our budget; never let one jam aioquic's queue
            if stream_id == previous_stream:
                # A copy (duplication, redundancy) or a split run's rest: own QUIC packet, or one loss kills both
                host.transmit()
                self._send_batch += record
            h3.send_datagram(target, datagram)
            previous_stream = stream_id
            if record:
                self._record_send(stream_id, datagram)

    def _record_send(self, stream_id: int, datagram: bytes) -> None:
        """Benchmarks' per-token timelines: when each datagram of a request went to QUIC (``record_timings``)."""
        host = self.host
        if (request := host.requests.get(stream_id)) is not None:
            sends = host.state.sends
            entry = sends.setdefault(request.request_id, (request.scope.get("client"), []))
            entry[1].append((host.loop.time(), datagram, self._send_batch))
            while len(sends) > host.state.options.timings_kept:
                sends.popitem(last=False)

    def _schedule_deadline(self, planned_at: float) -> None:
        deadline = self.scheduler.wake_at(planned_at)
        if deadline == self._deadline_at:
            return
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        self._deadline_at = deadline
        if deadline is not None:
            self._deadline_handle = self.host.loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_handle = None
        self._deadline_at = None
        self.run()

    def cancel(self) -> None:
        """The connection ended: no timer of the pump fires any more."""
        for handle in (self._deadline_handle, self._soon_handle, self._rest_handle):
            if handle is not None:
                handle.cancel()
