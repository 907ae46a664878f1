"""Every stream counted and logged the same way whatever carries it (SSE, the HTTP/3 stream, Eloquent datagrams),
the stream metrics reachable where the upstream owns ``/metrics`` (TGI gateway, vLLM), and a resume store that
cannot be reached: one warning at start, one line per failed request, never a traceback."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eloquent_client import EloquentClient
from prometheus_client import CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from eloquent_plugins.cli.app_factory import build_app
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.metrics import METRICS_PATH
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.servers import UvicornThread, free_port, wait_for_port
from tests.support.tgi_server import create_tgi_server, run_in_thread

MODEL = "eloquent-builtin"
BODY = {"model": MODEL, "prompt": "observe", "stream": True, "max_tokens": 8}
ACCESS = re.compile(r'^\S+ \S+ INFO uvicorn\.access: 127\.0\.0\.1:\d+ - "(\w+) (\S+) HTTP/(1\.1|3)" (\d{3})$')
"""``eloquent serve``'s one format, for uvicorn's access lines and the HTTP/3 front end's alike."""


def samples(text: str, name: str) -> dict[str, float]:
    """``{label set: value}`` of one metric in a Prometheus exposition."""
    return {m.group(1) or "": float(m.group(2))
            for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE)}


class Served:
    """``eloquent serve`` (built-in engine, SSE on TCP and HTTP/3 on UDP, one port number) as a user runs it."""

    def __init__(self) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ELOQUENT_", "OTEL_"))}
        exe = str(Path(sys.executable).with_name("eloquent"))
        self.proc = subprocess.Popen([exe, "serve", "--port", str(self.port), "--tpot", "0.002", "--ttft", "0.01"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     cwd=tempfile.gettempdir())
        wait_for_port(self.port, timeout=60, proc=self.proc)

    def stop(self) -> list[str]:
        """Its output lines, once it exited."""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace").splitlines()


@pytest.fixture
def served() -> Iterator[Served]:
    server = Served()
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()


async def test_every_path_is_counted_and_logged_once_in_one_format(served: Served) -> None:
    http = f"http://127.0.0.1:{served.port}"
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{http}/v1/completions?probe=sse", json=BODY) as response:
            assert response.status_code == 200
            assert b"[DONE]" in b"".join([chunk async for chunk in response.aiter_bytes()])
    for transport in ("h3-stream", "eloquent"):
        async with EloquentClient(f"https://127.0.0.1:{served.port}", transport=transport, verify=False) as client:
            async with client.stream("POST", f"/v1/completions?probe={transport}", json=BODY) as stream:
                assert await stream.text()
                assert stream.delivery == transport
    async with httpx.AsyncClient(timeout=60) as client:
        exposition = (await client.get(f"{http}/metrics")).text
        assert (await client.get(f"{http}{METRICS_PATH}")).text.count("eloquent_sse_streams_started_total{") == 3
    started = samples(exposition, "eloquent_sse_streams_started_total")
    assert started == {'transport="sse"': 1.0, 'transport="h3-stream"': 1.0, 'transport="datagram"': 1.0}
    # Issue 26: the names say nothing of SSE (a datagram stream is not one) and the histograms carry the transport;
    # the names of before stay as aliases (histograms over every transport).
    assert samples(exposition, "eloquent_streams_started_total") == started
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds", "inter_event_gap_seconds"):
        counts = samples(exposition, f"eloquent_{histogram}_count")
        assert set(counts) == set(started), (histogram, counts)
        assert all(v > 0 for v in counts.values()), counts
        assert samples(exposition, f"eloquent_sse_{histogram}_count") == {"": sum(counts.values())}
    assert samples(exposition, "eloquent_events_total") == samples(exposition, "eloquent_sse_events_total")

    lines = served.stop()
    by_probe: dict[str, list[re.Match[str]]] = {}
    for match in filter(None, map(ACCESS.match, lines)):
        probe = re.search(r"probe=([\w-]+)", match.group(2))
        if probe:
            by_probe.setdefault(probe.group(1), []).append(match)
    assert {k: len(v) for k, v in by_probe.items()} == {"sse": 1, "h3-stream": 1, "eloquent": 1}, lines[-40:]
    assert [m.group(3) for m in by_probe["sse"]] == ["1.1"]
    assert [m.group(3) for m in by_probe["h3-stream"] + by_probe["eloquent"]] == ["3", "3"]
    assert all(m.group(4) == "200" for found in by_probe.values() for m in found)
    stream_lines = [line for line in lines if " started: POST /v1/completions" in line]
    assert [re.search(r"transport: ([\w-]+)", line).group(1) for line in stream_lines] == [  # type: ignore[union-attr]
        "sse", "h3-stream", "datagram"]
    assert not any("Traceback" in line for line in lines)


# ---------------------------------------------------------------------------------- where /metrics is taken


def test_stream_metrics_behind_the_tgi_gateway_are_at_eloquent_metrics() -> None:
    upstream_app = create_tgi_server()

    async def tgi_metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse("tgi_request_count 7\n")  # TGI serves its own Prometheus /metrics

    upstream_app.add_route("/metrics", tgi_metrics)
    with run_in_thread(upstream_app) as upstream:
        gateway = build_app(StreamConfig(), create_plugin_manager(), upstream=f"tgi={upstream}")
        with UvicornThread(gateway) as server:
            body = {"inputs": "Test request", "parameters": {"max_new_tokens": 4}}
            with httpx.stream("POST", f"{server.url}/generate_stream", json=body, timeout=30) as response:
                assert response.status_code == 200 and response.read()
            assert "tgi_request_count 7" in httpx.get(f"{server.url}/metrics", timeout=30).text  # TGI's, proxied
            ours = httpx.get(f"{server.url}{METRICS_PATH}", timeout=30)
    assert ours.status_code == 200 and "tgi_request_count" not in ours.text
    assert samples(ours.text, "eloquent_sse_streams_started_total") == {'transport="sse"': 1.0}


def test_the_vllm_plugin_registers_the_stream_metrics_into_vllms_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    import eloquent_vllm.metrics as vllm_metrics
    from eloquent_vllm.middleware import VllmStreamMiddleware

    registry = CollectorRegistry()
    monkeypatch.setattr(vllm_metrics, "vllm_registry", lambda: registry)

    class VllmApp:  # what the plugin reads: vLLM's parsed CLI namespace on app.state.args
        class state:  # noqa: N801 - mirrors starlette's app.state
            from argparse import Namespace
            args = Namespace(stream_transport="sse")

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    VllmStreamMiddleware(inner)._setup(VllmApp())
    assert "eloquent_sse_streams_started_total" in generate_latest(registry).decode()
    # A second middleware in the same process cannot register the same names: one warning, no crash.
    assert vllm_metrics.register_stream_metrics(EloquentMiddleware(inner, StreamConfig()), registry) is False


def test_vllm_registry_falls_back_to_prometheus_default() -> None:
    from prometheus_client import REGISTRY

    from eloquent_vllm.metrics import vllm_registry

    try:
        import vllm  # noqa: F401
    except ImportError:
        assert vllm_registry() is REGISTRY


# ---------------------------------------------------------------------------------- an unreachable store


async def _startup(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[Any]]:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    sent: asyncio.Queue[Any] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get,
                                   sent.put))
    assert (await asyncio.wait_for(sent.get(), 30))["type"] == "lifespan.startup.complete"
    return task, inbox


async def test_unreachable_redis_is_one_warning_at_start_and_one_line_per_request(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = StreamConfig(resume_store=f"redis://:secret@127.0.0.1:{free_port()}/0")
    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001)), config)
    task, inbox = await _startup(app)
    at_start = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(at_start) == 1 and "unreachable" in at_start[0].getMessage()
    assert "secret" not in at_start[0].getMessage()
    caplog.clear()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        new = await client.post("/v1/completions", json=BODY)
        assert new.status_code == 200 and "[DONE]" in new.text and "\nid: " not in "\n" + new.text  # documented
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "not resumable" in warnings[0].getMessage()
        caplog.clear()
        resume = await client.post("/v1/completions", json=BODY, headers={"last-event-id": "a" * 24 + ":2"})
        assert resume.status_code == 503 and resume.json()["error"]["code"] == "resume_store_unavailable"
        assert resume.headers["retry-after"] == "1"
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "503" in warnings[0].getMessage()
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 30)
    assert not any(r.exc_info for r in caplog.records)
