"""uvicorn driven by the drain (``transports.drain``): what ``eloquent serve`` runs on TCP."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

from eloquent_plugins.transports.drain import Drain

log = logging.getLogger("eloquent.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM (and a first Ctrl+C) starting the drain instead of uvicorn's shutdown, and the exit
    when the drain is done (``transports.drain``; also after ``POST /eloquent/drain``). A second Ctrl+C quits at
    once."""

    def watch(self, drain: Drain, before_exit: Callable[[], Awaitable[None]] | None = None) -> None:
        """``before_exit``: what must stop while the app still runs (the HTTP/3 front end: a request it took
        after the drain would otherwise meet an app its lifespan shutdown already took apart)."""
        self.drain = drain
        self._before_exit = before_exit
        self._loop = asyncio.get_running_loop()
        self._exit_task = self._loop.create_task(self._exit_when_drained())

    async def _exit_when_drained(self) -> None:
        await self.drain.wait()
        if self._before_exit is not None:
            try:
                await self._before_exit()
            except Exception:  # noqa: BLE001 - the exit goes on; the caller closes it again after serve()
                log.exception("closing before the exit failed")
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain = getattr(self, "drain", None)
        if drain is None:  # not serving yet: uvicorn's own handling
            super().handle_exit(sig, frame)
        elif drain.draining and sig == signal.SIGINT:
            log.warning("second interrupt: exiting without waiting for the drain")
            self.should_exit = self.force_exit = True
        else:
            self._loop.call_soon_threadsafe(drain.begin, signal.Signals(sig).name)
