"""The HTTP/3 front end runs an app's ASGI lifespan only when asked (no other server runs it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.http3.server import start_http3_server


def make_app(events: list[str], fail: bool = False) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if fail:
            raise RuntimeError("upstream unreachable")
        events.append("startup")
        yield
        events.append("shutdown")

    return Starlette(routes=[Route("/", lambda r: PlainTextResponse("ok"))], lifespan=lifespan)


@pytest.mark.parametrize("run", [True, False])
async def test_lifespan_runs_only_when_asked(run: bool) -> None:
    events: list[str] = []
    server = await start_http3_server(make_app(events), host="127.0.0.1", port=0, config=StreamConfig(),
                                      lifespan=run)
    assert events == (["startup"] if run else [])
    await server.close()
    assert events == (["startup", "shutdown"] if run else [])


async def test_failed_startup_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="startup failed"):
        await start_http3_server(make_app([], fail=True), host="127.0.0.1", port=0, config=StreamConfig(),
                                 lifespan=True)


async def test_app_without_lifespan_support_still_serves() -> None:
    async def bare(scope: dict, receive: object, send: object) -> None:
        assert scope["type"] == "http", "no lifespan here"

    server = await start_http3_server(bare, host="127.0.0.1", port=0, config=StreamConfig(), lifespan=True)
    await server.close()
