"""Owning the client's ``receive`` for one request without hiding anything from the app.

Every message reaches the app, in order, and the request body is never read ahead by more than one message.
What the relay adds: it notices the client's ``http.disconnect`` even when the app is not listening (a pump
starts once an SSE response is under way), and, for a resumable stream, it can *hold* that disconnect back from
the app until the stream is abandoned (no reconnect within the grace period); then the app sees it and aborts
the engine request, exactly as it would have without the middleware.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import Enum

from eloquent_plugins.transports.asgi import Message, Receive

DISCONNECT: Message = {"type": "http.disconnect"}
BODY_HEAD_MAX = 1 << 20
"""Request-body bytes ``body_head`` keeps at most (the middleware's default ``max_request_bytes``)."""


class RelayState(Enum):
    """The client's side of the request, and whether the app may see that it ended."""

    CONNECTED = "connected"
    HOLDING = "holding"
    """Connected; a disconnect will be kept from the app (``hold()``)."""
    HELD = "held"
    """The client left; the app is not told yet."""
    GONE = "gone"
    """The client left; the app sees ``http.disconnect``."""
    RELEASED = "released"
    """The client left and the app was shown it after a hold (the stream was abandoned)."""


_AFTER_GONE = {RelayState.CONNECTED: RelayState.GONE, RelayState.HOLDING: RelayState.HELD}
_AFTER_HOLD = {RelayState.CONNECTED: RelayState.HOLDING, RelayState.GONE: RelayState.HELD,
               RelayState.RELEASED: RelayState.HELD}
_AFTER_RELEASE = {RelayState.HOLDING: RelayState.CONNECTED, RelayState.HELD: RelayState.RELEASED}
_CLIENT_GONE = frozenset({RelayState.HELD, RelayState.GONE, RelayState.RELEASED})


class ReceiveRelay:
    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._queue: deque[Message] = deque()
        self._reading = False
        self._pump: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        """The one read the app asked for, while it is in flight (see ``receive``)."""
        self._error: BaseException | None = None
        """What the server's ``receive`` raised in the app's read: raised to the app."""
        self._changed: asyncio.Future[None] | None = None
        self._on_gone: list[Callable[[], None]] = []
        self.state = RelayState.CONNECTED
        self.body_head: bytearray | None = None
        """When set (``--padding`` on), the first ``BODY_HEAD_MAX`` bytes of the request body the app read: the
        exchange looks for ``stream_options.include_obfuscation`` in it (core.padding.obfuscation_requested)."""
        self.recorded: bytearray | None = None
        """The request body as the app read it, while ``record(limit)`` is on and it stays under the limit (what
        a stream records so that another replica can continue it: ``core.continuation``)."""
        self._record_limit = 0

    def record(self, limit: int) -> None:
        """Keep a copy of the request body (up to ``limit`` bytes; past it, none)."""
        self.recorded, self._record_limit = bytearray(), limit

    @property
    def client_gone(self) -> bool:
        return self.state in _CLIENT_GONE

    @property
    def released(self) -> bool:
        """The app was shown the disconnect after a hold (the stream was abandoned)."""
        return self.state is RelayState.RELEASED

    async def receive(self) -> Message:
        """The ``receive`` the app gets."""
        while True:
            if self._queue:
                message = self._queue.popleft()
                self._notify()
                head = self.body_head
                if head is not None and message["type"] == "http.request" and len(head) < BODY_HEAD_MAX:
                    head += message.get("body", b"")
                return message
            if self._error is not None:
                raise self._error
            if self.client_gone:
                if self.state is not RelayState.HELD:
                    return DISCONNECT
            elif not self._reading and self._pump is None:
                # Read in a task, not inline: a disconnect this relay decides itself (a cut client, then the
                # abandoned stream's release) must reach an app whose own read never returns.
                self._reading = True
                self._reader = asyncio.get_running_loop().create_task(self._read_one(), name="eloquent-receive")
            await self._wait()

    def hold(self) -> None:
        """From now on, keep the client's disconnect from the app until ``release()``."""
        self.state = _AFTER_HOLD.get(self.state, self.state)

    def release(self) -> None:
        state = _AFTER_RELEASE.get(self.state)
        if state is not None:
            self.state = state
            self._notify()

    def on_gone(self, callback: Callable[[], None]) -> None:
        if self.client_gone:
            callback()
        else:
            self._on_gone.append(callback)

    def watch(self) -> None:
        """Start noticing the disconnect even if the app never calls ``receive`` again."""
        if self._pump is None and not self.client_gone:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump(), name="eloquent-receive")

    def disconnect(self) -> None:
        """Treat the client as gone (it stopped reading: send timeout)."""
        self._gone()

    def forget(self) -> None:
        """The exchange is over: drop the ``on_gone`` callbacks (they hold it, and it holds this relay: a cycle that
        only the garbage collector would free, once per request)."""
        self._on_gone = []

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    async def _read_one(self) -> None:
        """The app's read: its message (not a disconnect, which ``_read`` turns into state) joins the queue."""
        try:
            message = await self._read()
        except Exception as exc:  # noqa: BLE001 - handed to the app's receive, as an inline read would have
            self._error = exc
            self._notify()
            return
        if message["type"] != "http.disconnect":
            self._queue.append(message)
            self._notify()

    async def _read(self) -> Message:
        self._reading = True
        try:
            message = await self._receive()
        finally:
            self._reading = False
            self._notify()
        if message["type"] == "http.disconnect":
            self._gone()
        elif self.recorded is not None:
            self.recorded += message.get("body", b"")
            if len(self.recorded) > self._record_limit:
                self.recorded = None
        return message

    async def _run_pump(self) -> None:
        while not self.client_gone:
            if self._reading or self._queue:
                await self._wait()  # the app's own receive is in flight, or the app has not taken a message yet
                continue
            message = await self._read()
            if message["type"] != "http.disconnect":
                self._queue.append(message)
                self._notify()

    def _gone(self) -> None:
        state = _AFTER_GONE.get(self.state)
        if state is None:
            return
        self.state = state
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            callback()
        self._notify()

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        # Shielded: the app's read and the pump may wait on the same future, and cancelling one waiter (the pump
        # at close(), a task group tearing down the app's disconnect listener) must not cancel it for the other.
        await asyncio.shield(self._changed)

    def _notify(self) -> None:
        fut = self._changed
        if fut is not None:
            self._changed = None
            if not fut.done():
                fut.set_result(None)
