"""The sync API beside the async one: ``SyncEloquentClient`` runs an ``EloquentClient`` on an event loop of its own
in a background thread (QUIC needs a loop that keeps running between the caller's reads, to ack datagrams as they
arrive), and hands results across. ``LoopThread`` is shared with the sync httpx transport."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from eloquent_client.client import EloquentClient
from eloquent_client.events import ClientEvent
from eloquent_client.response import Response, ResponseStream

T = TypeVar("T")
_END = object()


class LoopThread:
    """A daemon thread running one event loop; ``run(coro)`` blocks until it completes there."""

    def __init__(self, name: str = "eloquent-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync call from inside the client's own loop would deadlock")
        return self.submit(coro).result()

    def iterate(self, source: AsyncIterator[T]) -> Iterator[T]:
        """Pull ``source`` (an async iterator living on the loop) one item at a time."""

        async def step() -> Any:
            try:
                return await source.__anext__()
            except StopAsyncIteration:
                return _END

        while True:
            item = self.run(step())
            if item is _END:
                return
            yield item

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        with contextlib.suppress(Exception):
            self.run(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class SyncResponseStream:
    """``ResponseStream`` for sync code: the same attributes, ``events()``/``text_deltas()`` as plain iterators."""

    def __init__(self, inner: ResponseStream, portal: LoopThread) -> None:
        self._inner = inner
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def events(self) -> Iterator[ClientEvent]:
        return self._portal.iterate(self._inner.events())

    def text_deltas(self) -> Iterator[str]:
        return self._portal.iterate(self._inner.text_deltas())

    def text(self) -> str:
        return self._portal.run(self._inner.text())


class SyncEloquentClient:
    """Same arguments as ``EloquentClient``; every method blocks."""

    def __init__(self, base_url: str, **options: Any) -> None:
        self._portal = LoopThread()

        async def build() -> EloquentClient:
            return EloquentClient(base_url, **options)

        try:
            self._client = self._portal.run(build())
        except BaseException:
            self._portal.close()
            raise

    @property
    def client(self) -> EloquentClient:
        """The async client underneath (its methods must run on this client's loop)."""
        return self._client

    def __enter__(self) -> SyncEloquentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def stream(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
               headers: Mapping[str, str] | None = None) -> Iterator[SyncResponseStream]:
        manager = self._client.stream(method, path, json=json, content=content, headers=headers)
        inner = self._portal.run(manager.__aenter__())
        try:
            yield SyncResponseStream(inner, self._portal)
        except BaseException as exc:
            if not self._portal.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._portal.run(manager.__aexit__(None, None, None))

    def request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        return self._portal.run(self._client.request(method, path, json=json, content=content, headers=headers))

    def close(self) -> None:
        if self._portal.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._portal.run(self._client.aclose())
        self._portal.close()


__all__ = ["LoopThread", "SyncEloquentClient", "SyncResponseStream"]
