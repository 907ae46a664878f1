"""A TCP proxy for tests that drops connections mid-response, to exercise resume.

Each client connection is forwarded to an upstream picked by ``choose_upstream(key, attempt)``; ``key`` is the
value of the request's ``x-test-stream`` header (so the test can tell streams apart), else the request target,
and ``attempt`` counts that key's connections. If ``cuts[key]`` is above zero, the proxy closes both sides after
a random number of response-body bytes (uniform in ``cut_range``) and counts the cut in ``done_cuts[key]``.
One request per connection: clients must not reuse connections (httpx: ``max_keepalive_connections=0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CutPlan:
    cuts: dict[str, int] = field(default_factory=dict)
    """Cuts still to make per stream key."""
    cut_range: tuple[int, int] = (1, 3000)
    seed: int = 1
    done_cuts: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)


class CutProxy:
    """Runs in its own thread and event loop; use as a context manager."""

    def __init__(self, upstreams: list[int], plan: CutPlan,
                 choose_upstream: Callable[[str, int], int] | None = None) -> None:
        self.upstreams = upstreams
        self.plan = plan
        self.choose = choose_upstream or (lambda key, attempt: upstreams[0])
        self.rng = random.Random(plan.seed)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cutproxy", daemon=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CutProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, sock=self._sock, backlog=1024))
        self._ready.set()
        self.loop.run_forever()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        uwriter: asyncio.StreamWriter | None = None
        try:
            head = await creader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            key = parts[1].decode("latin-1") if len(parts) > 1 else ""  # the request target, unless the header says
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"x-test-stream":
                    key = value.strip().decode()
            attempt = self.plan.attempts.get(key, 0)
            self.plan.attempts[key] = attempt + 1
            cut_at: int | None = None
            if self.plan.cuts.get(key, 0) > 0:
                cut_at = self.rng.randint(*self.plan.cut_range)
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.choose(key, attempt))
            uwriter.write(head)
            up = asyncio.ensure_future(self._pipe(creader, uwriter))
            try:
                await self._downstream(ureader, cwriter, key, cut_at)
            finally:
                up.cancel()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # a cut, a peer that went away, or the proxy shutting down
        finally:
            for writer in (cwriter, uwriter):
                if writer is not None:
                    with contextlib.suppress(Exception):
                        writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _downstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str,
                          cut_at: int | None) -> None:
        buf = b""
        # Pass the response head whole, then count body bytes towards the cut.
        while b"\r\n\r\n" not in buf:
            data = await reader.read(65536)
            if not data:
                writer.write(buf)
                return
            buf += data
        head_end = buf.index(b"\r\n\r\n") + 4
        writer.write(buf[:head_end])
        body = buf[head_end:]
        sent = 0
        while True:
            if body:
                if cut_at is not None and sent + len(body) >= cut_at:
                    writer.write(body[: cut_at - sent])
                    await writer.drain()
                    self.plan.cuts[key] -= 1
                    self.plan.done_cuts[key] = self.plan.done_cuts.get(key, 0) + 1
                    return  # the finally of _handle aborts both sides
                writer.write(body)
                sent += len(body)
                await writer.drain()
            body = await reader.read(65536)
            if not body:
                return
