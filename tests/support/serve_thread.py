"""``eloquent serve`` in-process, in a thread with its own event loop: the same app on uvicorn (TCP) and on the
HTTP/3 front end (UDP), sharing one resume store, as the command runs them; the front end records generation
times, so a test can compute stall ratios of what a browser rendered."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import uvicorn

from eloquent_plugins.cli.app_factory import build_app
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.cors import CorsMiddleware, parse_origins
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import Http3Server, start_http3_server


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeThread:
    def __init__(self, *, config: StreamConfig | None = None, options: FrontEndOptions | None = None,
                 engine: dict[str, Any] | None = None, cors_origin: str | None = None,
                 inner: Callable[[Any], Any] | None = None, wrap: Callable[[Any], Any] | None = None) -> None:
        """``cors_origin``: as ``--cors-origin`` (CORS on both transports, WebTransport origins too); ``inner``: an
        ASGI wrapper put around the app inside CORS, on both transports (a test's recorder); ``wrap``: one around
        the app on TCP only (pages a test serves beside it)."""
        self.config = config or StreamConfig()
        self.wrap = wrap
        self.options = options or FrontEndOptions(record_timings=True)
        self.engine = engine or {"ttft": 0.05, "tpot": 0.02}
        self.cors_origin = cors_origin
        self.inner = inner
        self.port = _free_tcp_port()
        self.h3: Http3Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def udp_port(self) -> int:
        assert self.h3 is not None
        return self.h3.port

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            app = build_app(self.config, create_plugin_manager(), engine_options=self.engine)
            if self.inner is not None:
                app = self.inner(app)
            if self.cors_origin:  # as ``eloquent serve --cors-origin`` does
                app = CorsMiddleware(app, self.cors_origin)
            # pages served by uvicorn here are same-origin for the front end's WebTransport sessions
            options = replace(self.options, page_ports=(*self.options.page_ports, self.port),
                              cors_origins=parse_origins(self.cors_origin))
            self.h3 = await start_http3_server(app, host="127.0.0.1", port=0, config=self.config, options=options)
            tcp_app = self.wrap(app) if self.wrap is not None else app
            self._server = uvicorn.Server(uvicorn.Config(tcp_app, host="127.0.0.1", port=self.port,
                                                         log_level="warning", lifespan="off"))
            serving = asyncio.ensure_future(self._server.serve())
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.02)
            self._ready.set()
            await serving
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            if self.h3 is not None:
                await self.h3.close()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop (start a relay there, say) and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def generation_times(self, request_id: str) -> list[float] | None:
        assert self.h3 is not None
        return self.h3.generation_times(request_id)

    def __enter__(self) -> ServeThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(15)
