"""A virtual clock for the real asyncio stack (``bench datapath``): an event loop that, instead of sleeping, moves
its time to the next timer, and an in-memory UDP path between two sides of one loop.

Nothing waits for real time, so a run is the same packet for packet whatever else the machine does, and the loop
charges each callback's CPU (``time.process_time``) to the side (``SIDE``) whose context it runs in: a per-side
CPU figure that does not move with the machine's load. Only for code that does no real I/O (no sockets, no
threads): nothing could wake the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

SIDE: contextvars.ContextVar[str] = contextvars.ContextVar("virtual_clock_side", default="harness")
"""Which side a callback belongs to; the link delivers each packet in the receiving side's context."""
SERVER_ADDR = ("10.0.0.1", 443)
CLIENT_ADDR = ("10.0.0.2", 50000)
TICK = 1e-6
"""Virtual seconds one pass of the loop takes at least."""


class _Clock(selectors.BaseSelector):
    """A selector with nothing to select: waiting ``timeout`` moves the loop's clock by it."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("nothing is scheduled: the run would wait forever")
        # Each pass takes a microsecond at least, as on a real clock: a deadline computed as ``t + d`` and checked
        # as ``t <= now - d`` (aioquic's loss timer) would otherwise fire at ``now == t + d`` forever.
        self._loop.advance(max(timeout, TICK))
        return []

    def get_map(self) -> dict[int, selectors.SelectorKey]:
        return self._keys


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock that charges every callback's CPU to the ``SIDE`` it runs in. Only for
    code that does no real I/O (no sockets, no threads): nothing could wake it."""

    def __init__(self) -> None:
        self._now = 0.0
        self.cpu: defaultdict[str, float] = defaultdict(float)
        super().__init__(_Clock(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def call_soon(self, callback: Callable[..., object], *args: Any,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        return super().call_soon(self._charged, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return super().call_at(when, self._charged, callback, *args, context=context)

    def _charged(self, callback: Callable[..., object], *args: Any) -> None:
        start = time.process_time()
        try:
            callback(*args)
        finally:
            self.cpu[SIDE.get()] += time.process_time() - start


def side_context(name: str) -> contextvars.Context:
    """A context whose callbacks (and the tasks and timers they start) are charged to side ``name``."""
    context = contextvars.copy_context()
    context.run(SIDE.set, name)
    return context


class LinkEnd(asyncio.DatagramTransport):
    """One end of an in-memory UDP path: what is sent arrives at the other end's protocol ``delay`` later, in
    order, in the other side's context."""

    def __init__(self, loop: asyncio.AbstractEventLoop, addr: tuple[str, int], context: contextvars.Context,
                 delay: float) -> None:
        super().__init__()
        self.loop, self.addr, self.context, self.delay = loop, addr, context, delay
        self.peer: LinkEnd | None = None
        self.sent = 0
        self._protocol: Any = None
        self._closed = False
        self._inbox: deque[tuple[bytes, tuple[str, int]]] = deque()

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def get_protocol(self) -> Any:
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.addr if name == "sockname" else default

    def close(self) -> None:
        self._closed = True

    def is_closing(self) -> bool:
        return self._closed

    def abort(self) -> None:
        self.close()

    def sendto(self, data: Any, addr: Any = None) -> None:
        peer = self.peer
        if self._closed or peer is None:
            return
        self.sent += 1
        peer._inbox.append((bytes(data), self.addr))
        self.loop.call_at(self.loop.time() + self.delay, peer._deliver, context=peer.context)

    def _deliver(self) -> None:
        # Timers due at the same instant run in no set order (asyncio's heap), so each delivery takes the oldest
        # packet: the path keeps the order packets were sent in.
        data, source = self._inbox.popleft()
        if not self._closed and self._protocol is not None:
            self._protocol.datagram_received(data, source)


def link(loop: asyncio.AbstractEventLoop, delay: float) -> tuple[LinkEnd, LinkEnd]:
    """(server end, client end) of a path with one-way ``delay``."""
    server = LinkEnd(loop, SERVER_ADDR, side_context("server"), delay)
    client = LinkEnd(loop, CLIENT_ADDR, side_context("client"), delay)
    server.peer, client.peer = client, server
    return server, client
