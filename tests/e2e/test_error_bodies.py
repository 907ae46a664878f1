"""Every error body the gateways and the built-in engine write is the one their codec builds (``core/codecs``).

The bodies used to be rebuilt beside the codecs (the TGI and OpenAI gateways, Triton's payload module, the engine
in four places); now each codec module has one function per shape (``openai_error``, ``tgi_error``,
``tgi_chat_error``, ``triton_error``) and the codec's ``error_payload`` is built from it. Each test makes a path
fail for real and compares the bytes it wrote with what the codec writes for the same message."""

from __future__ import annotations

import json

import httpx
from eloquent_openai.gateway import create_openai_gateway
from eloquent_tgi.gateway import create_tgi_gateway
from eloquent_triton.gateway import create_triton_gateway
from starlette.testclient import TestClient

from eloquent_plugins.core.codecs import OpenAICodec, TGICodec, TritonCodec
from eloquent_plugins.core.codecs.base import dump_json
from eloquent_plugins.core.codecs.tgi import tgi_chat_error
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.engine import EngineConfig, create_engine_app
from tests.support.triton_models import port_below_ephemeral_range

UPSTREAM = "http://127.0.0.1:9"


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _events(body: bytes) -> list[bytes]:
    return [message.data.encode() for message in SSEParser().feed(body)]


def _message(payload: bytes) -> str:
    error = json.loads(payload)["error"]
    return error["message"] if isinstance(error, dict) else error


def test_the_tgi_gateway_writes_the_tgi_codecs_bodies() -> None:
    codec = TGICodec()
    gateway = create_tgi_gateway(UPSTREAM, transport=httpx.MockTransport(_refuse))
    with TestClient(gateway) as client:
        stream = client.post("/generate_stream", json={"inputs": "x"})
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "stream": True})
        info = client.get("/info")
    [event] = _events(stream.content)
    assert event == codec.error_payload(_message(event), error_type="generation")
    error, done = _events(chat.content)
    assert error == dump_json(tgi_chat_error(_message(error), 502)) and done == b"[DONE]"
    assert info.status_code == 502
    assert info.content == codec.error_payload(_message(info.content), error_type="generation")


def test_the_openai_gateway_writes_the_openai_codecs_bodies() -> None:
    codec = OpenAICodec()
    gateway = create_openai_gateway(UPSTREAM, transport=httpx.MockTransport(_refuse))
    with TestClient(gateway) as client:
        stream = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        models = client.get("/v1/models")
    error, done = _events(stream.content)
    assert error == codec.error_payload(_message(error), error_type="server_error", status=502)
    assert done == codec.end_payloads()[0]
    assert models.status_code == 502
    assert models.content == codec.error_payload(_message(models.content), error_type="server_error", status=502)


def test_the_triton_gateway_writes_the_triton_codecs_body() -> None:
    gateway = create_triton_gateway(f"http://127.0.0.1:{port_below_ephemeral_range()}")
    with TestClient(gateway) as client:
        response = client.post("/v2/models/m/generate_stream", json={"text_input": "x"})
    assert response.status_code == 502
    assert response.content == TritonCodec().error_payload(_message(response.content))


def test_the_engine_writes_the_openai_codecs_bodies() -> None:
    codec = OpenAICodec()
    failing = {"prompt": "x", "max_tokens": 8, "eloquent_engine": {"ttft": 0, "tpot": 0, "fail_after": 2}}
    with TestClient(create_engine_app(EngineConfig(ttft=0, tpot=0))) as client:
        whole = client.post("/v1/completions", json=failing)
        stream = client.post("/v1/completions", json={**failing, "stream": True})
        missing = client.get("/v1/nothing")
    assert whole.status_code == 500 and whole.content == codec.error_payload(_message(whole.content))
    *_, error, done = _events(stream.content)
    assert error == codec.error_payload(_message(error)) and done == b"[DONE]"
    assert missing.status_code == 404
    assert missing.content == codec.error_payload(_message(missing.content), error_type="invalid_request_error",
                                                  code="not_found")
