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
from typing import Any

Message = dict[str, Any]
Receive = Callable[[], Any]
DISCONNECT: Message = {"type": "http.disconnect"}


class ReceiveRelay:
    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._queue: deque[Message] = deque()
        self._reading = False
        self._pump: asyncio.Task[None] | None = None
        self._changed: asyncio.Future[None] | None = None
        self._held = False
        self._on_gone: list[Callable[[], None]] = []
        self.client_gone = False
        self.released = False
        """The app was shown the disconnect after a hold (the stream was abandoned)."""

    async def receive(self) -> Message:
        """The ``receive`` the app gets."""
        while True:
            if self._queue:
                message = self._queue.popleft()
                self._notify()
                return message
            if self.client_gone:
                if not self._held:
                    return DISCONNECT
            elif not self._reading and self._pump is None:
                message = await self._read()
                if message["type"] != "http.disconnect":
                    return message
                continue
            await self._wait()

    def hold(self) -> None:
        """From now on, keep the client's disconnect from the app until ``release()``."""
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.released = self.client_gone
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

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None

    async def _read(self) -> Message:
        self._reading = True
        try:
            message = await self._receive()
        finally:
            self._reading = False
            self._notify()
        if message["type"] == "http.disconnect":
            self._gone()
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
        if self.client_gone:
            return
        self.client_gone = True
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            callback()
        self._notify()

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await self._changed

    def _notify(self) -> None:
        fut = self._changed
        if fut is not None:
            self._changed = None
            if not fut.done():
                fut.set_result(None)
