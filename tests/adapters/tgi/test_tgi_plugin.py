"""``eloquent serve --upstream tgi=URL`` finds the TGI gateway through the plugin hook."""

from __future__ import annotations

import eloquent_tgi.plugin
import httpx
import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.upstream import parse_upstream, upstream_kind
from tests.support.servers import free_port as closed_port


def test_hook_registers_the_tgi_upstream() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_tgi.plugin])
    kind = upstream_kind(pm, "tgi")
    assert kind.name == "tgi" and "/generate_stream" in kind.description


async def test_upstream_spec_builds_a_working_gateway() -> None:
    name, url = parse_upstream(f"tgi=http://127.0.0.1:{closed_port()}")
    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_tgi.plugin])
    app = upstream_kind(pm, name).create_app(url, StreamConfig())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        response = await client.post("/generate_stream", json={"inputs": "x"})
    # nothing listens there: the failure arrives as TGI's own in-band error event
    assert response.status_code == 200 and response.content.endswith(b'"error_type":"generation"}\n\n')


def test_bad_url_is_refused_when_the_app_is_built() -> None:
    with pytest.raises(ConfigError):
        eloquent_tgi.plugin.create_app("grpc://127.0.0.1:8001", StreamConfig())


def test_installed_entry_point_provides_tgi() -> None:
    """Needs the ``tgi = "eloquent_tgi.plugin"`` line under ``[project.entry-points.eloquent_plugins]``."""
    assert upstream_kind(create_plugin_manager(), "tgi").create_app is eloquent_tgi.plugin.create_app


async def test_served_app_reads_like_tgi() -> None:
    """What ``eloquent serve --upstream tgi=URL`` hosts (the gateway behind the middleware) against the
    reproduction: the ``text-generation`` client reads the same events as from TGI directly."""
    import text_generation

    from eloquent_plugins.cli.app_factory import build_app
    from tests.support.tgi_server import create_tgi_server, run_in_thread

    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_tgi.plugin])
    with run_in_thread(create_tgi_server()) as upstream:
        app = build_app(StreamConfig(stream_transport="sse"), pm, upstream=f"tgi={upstream}")
        with run_in_thread(app) as served:
            runs = []
            for url in (upstream, served):
                client = text_generation.AsyncClient(url, timeout=60)
                runs.append([r.model_dump() async for r in client.generate_stream("Test request", max_new_tokens=4)])
    assert runs[0] == runs[1] and len(runs[1]) == 4
