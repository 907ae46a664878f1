"""Fixtures shared by several test modules. Plain helper functions (request bodies, polling, free ports, servers
run as context managers) live in ``tests/support/``, which test modules import; no test module imports another."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from eloquent_plugins.transports.http3.server import Http3Server

StartH3 = Callable[..., Awaitable["Http3Server"]]


@pytest.fixture
async def h3_engine() -> AsyncIterator[StartH3]:
    """``await h3_engine(ttft=..., tpot=..., record_timings=...)``: the built-in engine behind the HTTP/3 front end
    on a free loopback UDP port (read ``.port``); every server started through it is closed after the test."""
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.engine import EngineConfig, create_engine_app
    from eloquent_plugins.transports.http3.options import FrontEndOptions
    from eloquent_plugins.transports.http3.server import start_http3_server

    started: list[Http3Server] = []

    async def start(*, ttft: float = 0.01, tpot: float = 0.002, record_timings: bool = False) -> Http3Server:
        app = create_engine_app(EngineConfig(ttft=ttft, tpot=tpot))
        options = FrontEndOptions(record_timings=True) if record_timings else None
        server = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(), options=options)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        await server.close()
