"""ASGI lifespan for an app served by the HTTP/3 front end alone.

When uvicorn serves the same app (``eloquent serve``, vLLM) it runs the lifespan and the front end must not run
it twice; when the front end is the only server, the app's startup/shutdown (e.g. a gateway opening and closing its
upstream client) would otherwise never run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from eloquent_plugins.core.errors import ConfigError


class Lifespan:
    """Runs one app's lifespan protocol: ``startup()`` once, ``shutdown()`` once."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.state: dict[str, Any] = {}
        self.supported = True

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self._app(scope, self._inbox.get, self._outbox.put)
        except BaseException:  # an app without lifespan support raises on the scope type, as uvicorn's "auto"
            self.supported = False
            await self._outbox.put({"type": "lifespan.unsupported"})
            raise

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        message = await self._outbox.get()
        if message["type"] == "lifespan.startup.failed":
            with contextlib.suppress(BaseException):
                await self._task  # the app re-raises its startup error; collect it here
            raise ConfigError(f"application startup failed: {message.get('message', '')}")

    async def shutdown(self) -> None:
        if self._task is None:
            return
        if self.supported and not self._task.done():
            await self._inbox.put({"type": "lifespan.shutdown"})
            await self._outbox.get()
        with contextlib.suppress(BaseException):
            await self._task
