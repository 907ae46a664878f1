"""A hook plugin installed through the ``eloquent_plugins`` entry point is loaded and sees every event; resume
store plugins go through the resume transport's own hook, with a fixed precedence."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.resume import MemoryStore, ResumeStore, create_store
from eloquent_plugins.transports.resume.hooks import add_resume_hookspecs, plugin_store_factories
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.upstream import add_upstream_hookspecs, upstream_kinds

PLUGIN = '''
"""Test plugin: records every hook call into the file named by $EVENT_LOG."""
import json, os
from eloquent_plugins.core.hooks.specs import hookimpl

def _log(**record):
    with open(os.environ["EVENT_LOG"], "a") as f:
        f.write(json.dumps(record) + "\\n")

@hookimpl
def eloquent_stream_start(stream):
    _log(hook="start", stream=stream.stream_id)

@hookimpl
def eloquent_stream_event(stream, event):
    _log(hook="event", stream=stream.stream_id, index=event.index, payload=event.payload.decode())

@hookimpl
def eloquent_stream_end(stream, reason):
    _log(hook="end", stream=stream.stream_id, reason=reason)
'''


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build a real distribution with an entry point, install it into a private target dir."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    (src / "recorder_plugin").mkdir(parents=True)
    (src / "recorder_plugin" / "__init__.py").write_text(PLUGIN)
    (src / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "recorder-plugin"
        version = "1.0"
        [project.entry-points.eloquent_plugins]
        recorder = "recorder_plugin"
        [tool.setuptools]
        packages = ["recorder_plugin"]
    """))
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(src)], check=True)
    target = root / "site"
    wheel = next(wheels.glob("recorder_plugin-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                    str(target), str(wheel)], check=True)
    return target


async def test_entry_point_plugin_sees_every_event(installed_plugin: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(installed_plugin))
    importlib.invalidate_caches()
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("EVENT_LOG", str(log))
    pm = create_plugin_manager()
    assert pm.has_plugin("recorder"), "the entry point was not loaded"

    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.0)),
                             StreamConfig(keepalive=0, resume=False), plugin_manager=pm)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    sent = [m.data for m in SSEParser().feed(response.content)]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["hook"] == "start" and records[-1] == {**records[-1], "hook": "end", "reason": "complete"}
    seen = [r for r in records if r["hook"] == "event"]
    assert [r["index"] for r in seen] == list(range(len(seen)))
    assert [r["payload"] for r in seen if r["payload"]] == sent, "the plugin must see exactly the events sent"
    assert len({r["stream"] for r in records}) == 1


class _Store(MemoryStore):
    """A plugin's store (a MemoryStore is enough to tell it apart by type)."""


class _Factory:
    def __init__(self, *schemes: str) -> None:
        self.scheme, self.schemes = schemes[0], schemes

    def create(self, url: str, config: StreamConfig) -> ResumeStore:
        return _Store(ttl=config.resume_ttl)


class _StorePlugin:
    def __init__(self, *factories: _Factory) -> None:
        self.factories = list(factories)

    @hookimpl
    def eloquent_register_resume_stores(self) -> list[_Factory]:
        return self.factories


def test_the_core_manager_knows_no_transport_hooks() -> None:
    pm = create_plugin_manager(load_entry_points=False)
    assert not hasattr(pm.hook, "eloquent_register_transports")
    assert getattr(pm.hook, "eloquent_register_resume_stores", None) is None, "the resume hook is the resume's own"
    assert plugin_store_factories(pm) == []  # adds the resume hookspec
    assert pm.hook.eloquent_register_resume_stores.has_spec()
    add_resume_hookspecs(pm)  # a second time is harmless
    assert getattr(pm.hook, "eloquent_register_upstreams", None) is None, "upstream kinds are the transports' own"
    assert upstream_kinds(pm) == {}  # adds the upstream hookspec; no adapter registered here
    assert pm.hook.eloquent_register_upstreams.has_spec()
    add_upstream_hookspecs(pm)  # a second time is harmless


def test_a_plugin_store_replaces_the_builtin_one_for_its_scheme_only() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[_StorePlugin(_Factory("redis", "rediss"))])
    factories = plugin_store_factories(pm)
    assert type(create_store(StreamConfig(resume_store="redis://127.0.0.1:1/0"), factories)) is _Store
    assert type(create_store(StreamConfig(resume_store="memory://"), factories)) is MemoryStore
    mw = EloquentMiddleware(create_engine_app(EngineConfig()), StreamConfig(resume_store="rediss://h:1/0"),
                            plugin_manager=pm)
    assert type(mw.store) is _Store


def test_two_plugins_taking_one_scheme_are_refused_whatever_their_order() -> None:
    for first, second in ((_Factory("redis"), _Factory("rediss", "redis")),
                          (_Factory("rediss", "redis"), _Factory("redis"))):
        pm = create_plugin_manager(load_entry_points=False, plugins=[_StorePlugin(first), _StorePlugin(second)])
        with pytest.raises(ConfigError, match="several resume store plugins"):
            create_store(StreamConfig(resume_store="redis://127.0.0.1:1/0"), plugin_store_factories(pm))
        assert type(create_store(StreamConfig(resume_store="rediss://h:1/0"), plugin_store_factories(pm))) is _Store
        assert type(create_store(StreamConfig(), plugin_store_factories(pm))) is MemoryStore
