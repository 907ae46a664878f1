"""A hook plugin installed through the ``eloquent_plugins`` entry point is loaded and sees every event."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser

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
