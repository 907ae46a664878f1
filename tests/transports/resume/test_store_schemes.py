"""Which ``--resume-store`` URLs are accepted is the resume package's call: the built-in schemes plus every scheme
a plugin registers through ``eloquent_register_resume_stores``; anything else is a ``ConfigError`` naming them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.core.protocol import STREAM_HEADER
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.resume import (MemoryStore, ResumeStore, check_resume_store, create_store,
                                                known_schemes)
from eloquent_plugins.transports.resume.hooks import plugin_store_factories
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.servers import free_port

ELOQUENT = str(Path(sys.executable).with_name("eloquent"))


class ShelfStore(MemoryStore):
    """A store of a plugin's own (in-process, like ``memory://``), reached through its own scheme."""

    scheme = "shelf"

    def __init__(self, url: str, ttl: float) -> None:
        super().__init__(ttl=ttl)
        self.url = url


class ShelfFactory:
    scheme = "shelf"

    def create(self, url: str, config: StreamConfig) -> ResumeStore:
        return ShelfStore(url, config.resume_ttl)


class ShelfPlugin:
    @hookimpl
    def eloquent_register_resume_stores(self) -> list[ShelfFactory]:
        return [ShelfFactory()]


def test_a_scheme_no_store_takes_is_refused_naming_the_known_ones() -> None:
    StreamConfig(resume_store="mysql://x")  # the settings no longer judge the scheme
    with pytest.raises(ConfigError, match="resume store must be one of memory://, redis://, rediss://, unix://"):
        create_store(StreamConfig(resume_store="mysql://x"))
    with pytest.raises(ConfigError, match="'localhost:6379'"):
        create_store(StreamConfig(resume_store="localhost:6379"))
    with pytest.raises(ConfigError, match="resume store"):
        check_resume_store(StreamConfig(resume_store="shelf://a"), create_plugin_manager(load_entry_points=False))
    check_resume_store(StreamConfig(resume_store="shelf://a", resume=False))  # no store is made: nothing to refuse


def test_known_schemes_add_the_plugins_ones() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[ShelfPlugin()])
    assert known_schemes(plugin_store_factories(pm)) == ["memory", "redis", "rediss", "shelf", "unix"]
    with pytest.raises(ConfigError, match="shelf://"):
        create_store(StreamConfig(resume_store="mysql://x"), plugin_store_factories(pm))


async def test_a_plugin_registered_scheme_is_accepted_and_its_store_used() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[ShelfPlugin()])
    config = StreamConfig(keepalive=0, resume_store="shelf://rack-1")
    check_resume_store(config, pm)  # what the vLLM plugin runs at startup
    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.0)), config, plugin_manager=pm)
    store = app.store
    assert type(store) is ShelfStore and store.url == "shelf://rack-1"

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    sent = [m.data for m in SSEParser().feed(response.content)]
    assert sent and sent[-1] == "[DONE]"
    token = response.headers[STREAM_HEADER]
    source = await store.open(token)
    assert source is not None, "the stream was not kept in the plugin's store"
    frames = source.take(0)
    replayed = [m.data for m in SSEParser().feed(b"".join(frames))]
    assert replayed == sent and source.end_reason == "complete" and source.ended(len(frames))


def test_serve_refuses_an_unknown_scheme_at_startup() -> None:
    result = subprocess.run([ELOQUENT, "serve", "--resume-store", "postgres://db/0", "--stream-transport", "sse",
                             "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "resume store must be one of memory://" in result.stderr and "'postgres://db/0'" in result.stderr
