"""OpenTelemetry: one span per stream, whatever carries it, with its transport, connections, resumes and stall
figures; read back with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import opentelemetry.sdk  # noqa: E402,F401  (the [otel]/[test] extra: missing must fail, not skip)

from eloquent_client import EloquentClient  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from eloquent_plugins.transports.config import StreamConfig  # noqa: E402
from eloquent_plugins.core.sse_reader import SSEParser  # noqa: E402
from eloquent_plugins.engine import EngineConfig, create_engine_app  # noqa: E402
from eloquent_plugins.transports.http3.server import start_http3_server  # noqa: E402
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware  # noqa: E402
from eloquent_plugins.transports.telemetry import RESUME_SPAN, STREAM_SPAN, configure_from_env  # noqa: E402
from tests.support.servers import UvicornThread  # noqa: E402

BODY = {"model": "eloquent-builtin", "prompt": "trace", "stream": True, "max_tokens": 8}


@pytest.fixture
def traced() -> Iterator[tuple[EloquentMiddleware, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.01, tpot=0.002)), StreamConfig())
    app.tracer = provider.get_tracer("test")
    yield app, exporter
    provider.shutdown()


def stream_spans(exporter: InMemorySpanExporter) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == STREAM_SPAN]


async def test_one_span_per_stream_on_every_transport(traced: tuple[EloquentMiddleware, Any]) -> None:
    app, exporter = traced
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        response = await client.post("/v1/completions", json=BODY)
        assert response.status_code == 200
    server = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    try:
        for transport in ("h3-stream", "eloquent"):
            async with EloquentClient(f"https://127.0.0.1:{server.port}", transport=transport, verify=False) as c:
                async with c.stream("POST", "/v1/completions", json=BODY) as stream:
                    assert await stream.text()
    finally:
        await server.close()
    spans = stream_spans(exporter)
    assert [s.attributes["eloquent.transport"] for s in spans] == ["sse", "h3-stream", "datagram"]
    events = len(SSEParser().feed(response.content))
    for span in spans:
        attributes = span.attributes
        assert attributes["eloquent.stream_id"].startswith("s-")
        assert attributes["http.route"] == "/v1/completions" and attributes["eloquent.codec"] == "openai"
        assert attributes["eloquent.end_reason"] == "complete" and attributes["eloquent.events"] == events
        assert attributes["eloquent.resumes"] == 0 and attributes["eloquent.resumable"] is True
        assert 0 < attributes["eloquent.ttft_s"] < 30 and 0 <= attributes["eloquent.max_gap_s"] < 30
        assert attributes["eloquent.tpot_s"] <= attributes["eloquent.max_gap_s"]
        assert [e.name for e in span.events] == ["connection"]
    assert len({s.attributes["eloquent.stream_id"] for s in spans}) == 3


def test_a_resume_is_an_event_of_the_streams_span(traced: tuple[EloquentMiddleware, Any]) -> None:
    app, exporter = traced
    slow = {**BODY, "max_tokens": 40}
    app.app = create_engine_app(EngineConfig(ttft=0.01, tpot=0.02))
    with UvicornThread(app) as server:
        last_id = None
        with httpx.stream("POST", f"{server.url}/v1/completions", json=slow, timeout=30) as response:
            parser = SSEParser()
            for chunk in response.iter_bytes():
                ids = [m.id for m in parser.feed(chunk) if m.id]
                last_id = ids[-1] if ids else last_id
                if last_id is not None and int(last_id.rsplit(":", 1)[1]) >= 2:
                    break  # drop the connection mid-stream
        resumed = httpx.post(f"{server.url}/v1/completions", json=slow, headers={"last-event-id": last_id},
                             timeout=30)
        assert resumed.status_code == 200 and "[DONE]" in resumed.text
        after_end = httpx.post(f"{server.url}/v1/completions", json=slow, headers={"last-event-id": last_id},
                               timeout=30)
        assert after_end.status_code in (200, 410)
    [span] = stream_spans(exporter)
    assert span.attributes["eloquent.resumes"] == 1
    assert [e.name for e in span.events] == ["connection", "resume"]
    assert span.events[1].attributes["eloquent.resume_after"] == int(last_id.rsplit(":", 1)[1])
    # A resume after the stream's span ended gets a span of its own, with the same correlation id.
    own = [s for s in exporter.get_finished_spans() if s.name == RESUME_SPAN]
    assert all(s.attributes["eloquent.stream_id"] == span.attributes["eloquent.stream_id"] for s in own)
    assert len(own) == (1 if after_end.status_code == 200 else 0)


def test_configure_from_env_does_nothing_unless_asked() -> None:
    assert configure_from_env({}) is False
    assert configure_from_env({"OTEL_TRACES_EXPORTER": "none"}) is False


def test_otel_traces_exporter_console_prints_one_span_per_stream() -> None:
    """What the README says: ``OTEL_TRACES_EXPORTER=console`` makes ``eloquent serve`` print the spans (the setup
    call is the one ``eloquent serve`` makes; a fresh process, as the tracer provider is process-global)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import asyncio, httpx
        from opentelemetry import trace
        from eloquent_plugins.transports.config import StreamConfig
        from eloquent_plugins.engine import EngineConfig, create_engine_app
        from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
        from eloquent_plugins.transports.telemetry import configure_from_env

        assert configure_from_env()
        app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001)), StreamConfig())

        async def main():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
                body = {"model": "eloquent-builtin", "prompt": "x", "stream": True, "max_tokens": 3}
                assert (await client.post("/v1/completions", json=body)).status_code == 200

        asyncio.run(main())
        trace.get_tracer_provider().shutdown()
    ''')
    env = {"OTEL_TRACES_EXPORTER": "console", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f'"name": "{STREAM_SPAN}"') == 1 and '"eloquent.transport": "sse"' in done.stdout
