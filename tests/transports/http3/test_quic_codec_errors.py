"""Every JSON error the HTTP/3 front end writes takes the route's codec shape, as on the SSE path: OpenAI's
``{"error": {...}}`` on OpenAI routes, TGI's ``{"error": "...", "error_type": "..."}`` on ``/generate_stream``,
Triton's ``{"error": "..."}`` on ``/v2/models/<m>/generate_stream``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from eloquent_client import EloquentClient

from eloquent_plugins.core.codecs import BUILTIN_CODECS
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import start_http3_server

TGI, TRITON, OPENAI = "/generate_stream", "/v2/models/m/generate_stream", "/v1/completions"


async def crash_after_first_event(scope, receive, send):  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b'data: {"token":{"id":1,"text":"a"}}\n\n', "more_body": True})
    raise RuntimeError("boom")


def error_event(payloads: list[Any]) -> Any:
    """The last JSON event the client saw (the in-band error)."""
    return json.loads(payloads[-1])


@pytest.mark.parametrize("transport", ["eloquent", "h3-stream"])
@pytest.mark.parametrize(("path", "shape"), [
    (TGI, lambda e: set(e) == {"error", "error_type"} and isinstance(e["error"], str)),
    (TRITON, lambda e: set(e) == {"error"} and isinstance(e["error"], str)),
    (OPENAI, lambda e: set(e) == {"error"} and e["error"]["code"] == 500),
])
async def test_in_band_error_after_the_200_takes_the_route_shape(transport: str, path: str, shape: Any) -> None:
    srv = await start_http3_server(crash_after_first_event, host="127.0.0.1", port=0, config=StreamConfig())
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", transport=transport, verify=False) as client:
            conn = await client.connection()
            stream = await conn.request("POST", path, body=b"{}", eloquent=transport == "eloquent",
                                        headers=[("eloquent-transport", "datagram")] if transport == "eloquent"
                                        else [])
            await stream.wait_headers(5)
            assert stream.eloquent == (transport == "eloquent")
            payloads = [e.data async for e in stream.events()]
    finally:
        await srv.close()
    assert json.loads(payloads[0]) == {"token": {"id": 1, "text": "a"}}
    error = error_event(payloads)
    assert shape(error), error


@pytest.mark.parametrize(("path", "expected"), [
    (TGI, {"error": "request body exceeds 100 bytes", "error_type": "invalid_request_error"}),
    (TRITON, {"error": "request body exceeds 100 bytes"}),
    (OPENAI, {"error": {"message": "request body exceeds 100 bytes", "type": "invalid_request_error",
                        "param": None, "code": "request_too_large"}}),
])
async def test_a_refused_request_answers_in_the_route_shape(path: str, expected: dict[str, Any]) -> None:
    srv = await start_http3_server(crash_after_first_event, host="127.0.0.1", port=0,
                                   config=StreamConfig(max_request_bytes=100))
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", transport="h3-stream", verify=False) as client:
            refused = await client.request("POST", path, json={"inputs": "x" * 500})
    finally:
        await srv.close()
    assert refused.status == 413 and refused.json() == expected


async def test_a_router_in_the_options_decides_the_shape() -> None:
    codecs = {codec.name: codec for codec in BUILTIN_CODECS}
    router = CodecRouter(codecs, routes=[(r"^/custom$", "tgi"), (r"", "openai")])
    srv = await start_http3_server(crash_after_first_event, host="127.0.0.1", port=0,
                                   config=StreamConfig(max_request_bytes=100),
                                   options=FrontEndOptions(codec_router=router))
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", transport="h3-stream", verify=False) as client:
            custom = await client.request("POST", "/custom", json={"inputs": "x" * 500})
            generate = await client.request("POST", TGI, json={"inputs": "x" * 500})
    finally:
        await srv.close()
    assert custom.json()["error_type"] == "invalid_request_error"
    assert generate.json()["error"]["code"] == "request_too_large"
