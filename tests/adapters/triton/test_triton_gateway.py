"""The Triton gateway against a real Triton (PyTriton's tritonserver 2.51, CPU) over HTTP and gRPC.

One server for the module (``tests.support.triton_models``, run from ``.venv-triton``); if it does not
start, every test here fails with its log. Each test runs the gateway in uvicorn on a real socket,
because header timing and client disconnects only mean something over a real connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_triton.gateway import create_triton_gateway
from tests.support.triton_models import (
    UPSTREAM_KINDS,
    ERROR_BEFORE_MESSAGE,
    TritonServerProcess,
    error_after_message,
    tokens_for,
)

pytestmark = pytest.mark.triton

KINDS = UPSTREAM_KINDS
# A hang guard, not a timing assertion: how long a test waits for something that must happen.
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServerProcess]:
    with TritonServerProcess() as server:  # fails every test here, with Triton's log, if it does not start
        yield server


@asynccontextmanager
async def running_gateway(upstream: str, wrap: Any = None) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway (``wrap``-ped, if given) in uvicorn on a free loopback port, and a client for it."""
    app = create_triton_gateway(upstream)
    if wrap is not None:
        app = wrap(app)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
    )  # a stream the gateway failed to end must not hang the test run
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # surfaces the startup error
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        timeout = httpx.Timeout(HANG_GUARD_S)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=timeout) as client:
            yield client
    finally:
        server.should_exit = True
        await task


@dataclass
class Answer:
    status: int
    content_type: str
    raw_events: list[bytes]
    body: bytes

    @property
    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(raw.decode().removeprefix("data: ").strip()) for raw in self.raw_events]

    @property
    def text(self) -> str:
        return "".join(p["text_output"] for p in self.payloads if "text_output" in p)


async def post_stream(client: httpx.AsyncClient, model: str, body: dict[str, Any]) -> Answer:
    async with client.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as response:
        raw = await response.aread()
    content_type = response.headers.get("content-type", "")
    events = [m.raw for m in SSEParser().feed(raw)] if content_type.startswith("text/event-stream") else []
    return Answer(response.status_code, content_type, events, raw)


STREAM_CASES: list[tuple[str, dict[str, Any]]] = [
    ("token_stream", {"text_input": "the quick brown fox", "max_tokens": 7}),
    ("token_stream", {"id": "req-42", "text_input": "héllo wörld 🚀 \"quoted\" back\\slash", "max_tokens": 5}),
    ("token_stream", {"text_input": "parameters pass through", "max_tokens": 3, "temperature": 0.5}),
    ("slow_first", {"text_input": "after a pause", "wait_s": 0.2, "max_tokens": 3}),
    ("error_after", {"text_input": "two tokens then boom", "fail_after": 2}),
    ("error_before", {"text_input": "never"}),
    ("cancellable_stream", {"id": "py-backend", "text_input": "backend model", "max_tokens": 4, "token_delay_s": 0.0}),
]


async def test_http_and_grpc_upstreams_give_identical_events(triton: TritonServerProcess) -> None:
    answers: dict[str, list[Answer]] = {}
    for kind in KINDS:
        async with running_gateway(triton.url(kind)) as client:
            answers[kind] = [await post_stream(client, model, body) for model, body in STREAM_CASES]
    for (model, body), over_http, over_grpc in zip(STREAM_CASES, answers["http"], answers["grpc"], strict=True):
        assert over_http.raw_events, (model, body, over_http)
        assert (over_http.status, over_http.content_type) == (over_grpc.status, over_grpc.content_type), model
        assert over_http.raw_events == over_grpc.raw_events, (model, body)


@pytest.mark.parametrize("kind", KINDS)
async def test_events_match_triton_and_text_matches_non_streamed_output(
    triton: TritonServerProcess, kind: str
) -> None:
    body = {"id": "same", "text_input": "one two three", "max_tokens": 6}
    async with httpx.AsyncClient(base_url=triton.http_url, timeout=HANG_GUARD_S) as direct:
        from_triton = await post_stream(direct, "token_stream", body)
    async with running_gateway(triton.url(kind)) as client:
        streamed = await post_stream(client, "token_stream", body)
        full = await client.post("/v2/models/token_full/generate", json=body)

    assert streamed.status == 200 and streamed.content_type == "text/event-stream; charset=utf-8"
    assert streamed.payloads == from_triton.payloads  # Triton's own events, field for field
    assert [p["text_output"] for p in streamed.payloads] == tokens_for("one two three", 6)
    assert all(p["model_name"] == "token_stream" and p["model_version"] == "1" for p in streamed.payloads)
    assert all(p["id"] == "same" for p in streamed.payloads)
    assert full.status_code == 200, full.text
    assert streamed.text == full.json()["text_output"] == "".join(tokens_for("one two three", 6))


@pytest.mark.parametrize("kind", KINDS)
async def test_headers_arrive_before_the_first_model_response(
    triton: TritonServerProcess, kind: str, tmp_path: Path
) -> None:
    # slow_first holds its first response until the gate file exists (or HANG_GUARD_S passes, and
    # then says " waited"). The gate is only created once the headers are here, so a first token of
    # " gate-open" proves the headers came before the model produced anything.
    gate = tmp_path / "gate"
    body = {"text_input": "then tokens", "wait_s": HANG_GUARD_S, "gate": str(gate), "max_tokens": 2}
    async with running_gateway(triton.url(kind)) as client:
        async with client.stream("POST", "/v2/models/slow_first/generate_stream", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            gate.touch()
            raw = await response.aread()
    payloads = [json.loads(m.data) for m in SSEParser().feed(raw)]
    assert [p["text_output"] for p in payloads] == [" gate-open", " then", " tokens"]


@pytest.mark.parametrize("kind", KINDS)
async def test_model_error_after_first_response_is_in_band(triton: TritonServerProcess, kind: str) -> None:
    async with running_gateway(triton.url(kind)) as client:
        answer = await post_stream(client, "error_after", {"text_input": "a b c", "fail_after": 2})
    assert answer.status == 200
    *tokens, last = answer.payloads
    assert [t["text_output"] for t in tokens] == tokens_for("a b c", 2)
    assert set(last) == {"error"} and error_after_message(2) in last["error"]


@pytest.mark.parametrize("kind", KINDS)
async def test_model_error_before_first_response(triton: TritonServerProcess, kind: str) -> None:
    # The headers already left (that is the point of the gateway), so the model's failure arrives as
    # Triton's in-band error event, the only event of the stream.
    async with running_gateway(triton.url(kind)) as client:
        answer = await post_stream(client, "error_before", {"text_input": "x"})
    assert answer.status == 200
    assert len(answer.payloads) == 1
    assert set(answer.payloads[0]) == {"error"} and ERROR_BEFORE_MESSAGE in answer.payloads[0]["error"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("model", "content", "status", "message"),
    [
        ("no_such_model", b'{"text_input": "x"}', 404, "Request for unknown model: 'no_such_model' is not found"),
        ("token_stream", b'{"text_input": ', 400, "failed to parse the request JSON buffer"),
        ("token_stream", b'["not", "an", "object"]', 400, "the request body must be a JSON object"),
        ("token_stream", b'{"max_tokens": 2}', 400, "missing required input(s): text_input"),
        ("token_stream", b'{"text_input": 7}', 400, "input 'text_input': expected a string"),
        ("token_stream", b'{"text_input": "x", "max_tokens": "many"}', 400, "input 'max_tokens': expected INT32"),
    ],
)
async def test_request_errors_get_a_status_and_tritons_json(
    triton: TritonServerProcess, kind: str, model: str, content: bytes, status: int, message: str
) -> None:
    async with running_gateway(triton.url(kind)) as client:
        for route in ("generate_stream", "generate"):
            response = await client.post(
                f"/v2/models/{model}/{route}", content=content, headers={"content-type": "application/json"}
            )
            assert response.status_code == status, (route, response.text)
            assert response.headers["content-type"] == "application/json"
            assert set(response.json()) == {"error"} and response.json()["error"].startswith(message)


async def test_unreachable_upstream_is_a_502() -> None:
    from tests.support.triton_models import port_below_ephemeral_range as free_port

    for upstream in (f"http://127.0.0.1:{free_port()}", f"grpc://127.0.0.1:{free_port()}"):
        async with running_gateway(upstream) as client:
            response = await client.post("/v2/models/m/generate_stream", json={"text_input": "x"})
        assert response.status_code == 502, (upstream, response.text)
        assert "unreachable" in response.json()["error"]


async def _wait_for_file(*candidates: Path) -> Path:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while loop.time() < deadline:
        for path in candidates:
            if path.exists():
                return path
        await asyncio.sleep(0.05)
    raise AssertionError(f"none of {candidates} appeared within {HANG_GUARD_S}s")


@pytest.mark.parametrize("kind", KINDS)
async def test_client_disconnect_cancels_the_upstream_request(triton: TritonServerProcess, kind: str) -> None:
    # cancellable_stream is a Python-backend model using eloquent_triton.decoupled: it polls Triton's
    # is_cancelled() and writes cancelled-<id> (or completed-<id>) into the state dir.
    request_id = f"cancel-over-{kind}"
    max_tokens = 100000
    body = {"id": request_id, "text_input": "long story", "max_tokens": max_tokens, "token_delay_s": 0.02}
    async with running_gateway(triton.url(kind)) as client:
        async with client.stream("POST", "/v2/models/cancellable_stream/generate_stream", json=body) as response:
            assert response.status_code == 200
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    assert "error" not in json.loads(line[6:])
                    seen += 1
                    if seen == 3:
                        break  # leaving the block closes the connection mid-stream
        outcome = await _wait_for_file(
            triton.state_dir / f"cancelled-{request_id}", triton.state_dir / f"completed-{request_id}"
        )
    assert outcome.name == f"cancelled-{request_id}"
    assert 3 <= int(outcome.read_text()) < max_tokens


@pytest.mark.parametrize("kind", KINDS)
async def test_the_gateway_works_inside_eloquent_middleware(
    triton: TritonServerProcess, kind: str, tmp_path: Path
) -> None:
    # The middleware adds keep-alive and event ids to the gateway's stream. Ordering again: the gate
    # opens only after a keep-alive comment arrived, i.e. while Triton had produced nothing.
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    config = StreamConfig(keepalive=0.05, stream_transport="sse")
    gate = tmp_path / "gate"
    body = {"text_input": "kept alive", "wait_s": HANG_GUARD_S, "gate": str(gate), "max_tokens": 2}
    received = b""
    wrap = lambda app: EloquentMiddleware(app, config)  # noqa: E731
    async with running_gateway(triton.url(kind), wrap=wrap) as client:
        async with client.stream("POST", "/v2/models/slow_first/generate_stream", json=body) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            while not received.lstrip().startswith(b":"):
                received += await chunks.__anext__()
            assert b"data:" not in received
            gate.touch()
            async for chunk in chunks:
                received += chunk
    messages = SSEParser().feed(received)
    assert [json.loads(m.data)["text_output"] for m in messages] == [" gate-open", " kept", " alive"]
    assert all(m.id for m in messages) and len({m.id for m in messages}) == 3


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_streams_do_not_mix(triton: TritonServerProcess, kind: str) -> None:
    texts = [f"stream {i} words" for i in range(8)]
    async with running_gateway(triton.url(kind)) as client:
        answers = await asyncio.gather(
            *(post_stream(client, "token_stream", {"id": f"c{i}", "text_input": t, "max_tokens": 5})
              for i, t in enumerate(texts))
        )
    for i, (text, answer) in enumerate(zip(texts, answers, strict=True)):
        assert answer.status == 200
        assert [p["text_output"] for p in answer.payloads] == tokens_for(text, 5)
        assert {p["id"] for p in answer.payloads} == {f"c{i}"}
