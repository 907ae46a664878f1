"""The TGI-protocol reproduction itself: it must behave as TGI is documented to, or the gateway tests prove nothing.

Its keep-alive interval is cut to 50 ms here, so these tests read events with an SSE parser that drops comments,
except the keep-alive test, which holds the stream and waits for the comment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.tgi_server import (
    EOS,
    ERROR_MESSAGES,
    TOKENS,
    TGIServerConfig,
    TGIServerState,
    create_tgi_server,
    run_in_thread,
)

KEEPALIVE = 0.05


@dataclass(frozen=True)
class Server:
    url: str
    state: TGIServerState


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    app = create_tgi_server(TGIServerConfig(keepalive=KEEPALIVE, max_concurrent_requests=2))
    with run_in_thread(app) as url:
        yield Server(url, app.state.tgi)


def events(response: httpx.Response) -> list[Any]:
    parser = SSEParser()
    out = []
    for message in parser.feed(response.content):
        assert message.raw.startswith(b"data: ")  # TGI >= 2.1 writes the space
        out.append(message.data if message.data == "[DONE]" else json.loads(message.data))
    return out


def stream(server: Server, inputs: str, **parameters: Any) -> list[dict[str, Any]]:
    response = httpx.post(server.url + "/generate_stream", json={"inputs": inputs, "parameters": parameters},
                          timeout=30)
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
    return events(response)


def test_index_starts_at_one_and_the_last_event_carries_the_result(server: Server) -> None:
    out = stream(server, "Test request", max_new_tokens=10, details=True)
    assert [e["index"] for e in out] == list(range(1, 11))
    assert [e["token"] for e in out] == list(TOKENS)
    assert all(e["generated_text"] is None and e["details"] is None for e in out[:-1])
    assert out[-1]["generated_text"] == " for /api/v1/projects/1"
    assert out[-1]["details"] == {"finish_reason": "length", "generated_tokens": 10, "seed": None,
                                  "input_length": 3}
    assert all("top_tokens" not in e for e in out)  # left out when empty, as serde's skip_serializing_if does


def test_eos_is_a_special_token_left_out_of_the_text(server: Server) -> None:
    out = stream(server, "Test request", max_new_tokens=50, details=True)
    assert out[-1]["token"] == EOS and out[-1]["details"]["finish_reason"] == "eos_token"
    assert out[-1]["generated_text"] == " for /api/v1/projects/1"


def test_details_only_when_asked_and_stop_sequences_stop(server: Server) -> None:
    out = stream(server, "Test request", stop=["v1"])
    assert out[-1]["details"] is None and out[-1]["generated_text"] == " for /api/v1"


def test_top_tokens_when_asked(server: Server) -> None:
    out = stream(server, "Test request", max_new_tokens=2, top_n_tokens=3)
    assert [len(e["top_tokens"]) for e in out] == [3, 3]
    assert out[0]["top_tokens"][0] == out[0]["token"]


@pytest.mark.parametrize("error_type", sorted(ERROR_MESSAGES))
def test_errors_are_events_under_200(server: Server, error_type: str) -> None:
    out = stream(server, f"x !error={error_type} !after=1")
    assert out[-1] == {"error": ERROR_MESSAGES[error_type], "error_type": error_type}
    assert len(out) == 2


@pytest.mark.parametrize(("parameters", "message"), [
    ({"best_of": 2}, "`best_of` != 1 is not supported when streaming tokens"),
    ({"decoder_input_details": True}, "`decoder_input_details` == true is not supported when streaming tokens"),
    ({"temperature": 0.0}, "`temperature` must be strictly positive"),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
])
def test_validation_errors_are_events_too(server: Server, parameters: dict[str, Any], message: str) -> None:
    assert stream(server, "x", **parameters) == [{"error": f"Input validation error: {message}",
                                                  "error_type": "validation"}]


def test_non_streaming_errors_use_tgis_status_codes(server: Server) -> None:
    codes = {t: httpx.post(server.url + "/generate", json={"inputs": f"x !error={t}"}) for t in ERROR_MESSAGES}
    assert {t: r.status_code for t, r in codes.items()} == {
        "validation": 422, "generation": 424, "overloaded": 429, "incomplete_generation": 500, "tokenizer": 422}
    assert codes["overloaded"].json() == {"error": "Model is overloaded", "error_type": "overloaded"}


def test_compat_route_streams_or_answers_a_list(server: Server) -> None:
    streamed = httpx.post(server.url + "/", json={"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 2}})
    assert [e["index"] for e in events(streamed)] == [1, 2]
    whole = httpx.post(server.url + "/", json={"inputs": "x", "parameters": {"max_new_tokens": 2}}).json()
    assert whole == [{"generated_text": " for /"}]
    single = httpx.post(server.url + "/generate", json={"inputs": "x", "parameters": {"max_new_tokens": 2,
                                                                                      "details": True}}).json()
    assert single["details"]["tokens"] == list(TOKENS[:2]) and single["details"]["prefill"] == []


def test_chat_stream_ends_with_done(server: Server) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "tgi", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3,
        "stream_options": {"include_usage": True}})
    out = events(response)
    assert out[-1] == "[DONE]"
    chunks = out[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in chunks[:-1])  # TGI: role in every delta
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_chat_stream_error_then_done(server: Server) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "tgi", "messages": [{"role": "user", "content": "x !error=generation !after=1"}], "stream": True})
    out = events(response)
    assert out[-2:] == [{"error": {"message": ERROR_MESSAGES["generation"], "http_status_code": 422}}, "[DONE]"]


def test_chat_template_error_comes_before_the_stream(server: Server) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": "tgi", "messages": [],
                                                                     "stream": True})
    assert response.status_code == 422 and response.json()["error_type"] == "template_error"


def test_keepalive_comment_after_silence(server: Server) -> None:
    with httpx.stream("POST", server.url + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=ka", "parameters": {"max_new_tokens": 1}}) as response:
        chunks = response.iter_raw()
        first = next(chunks)  # only keep-alives can come first: the stream is held
        assert first.startswith(b":\n\n") and first.replace(b":\n\n", b"") == b""
        server.state.release("ka")
        rest = b"".join(chunks)
    assert rest.replace(b":\n\n", b"").startswith(b'data: {"index":1,')


def test_overload_when_all_slots_are_taken(server: Server) -> None:
    state = server.state
    started = state.started
    body = {"inputs": "x !hold=slots", "parameters": {"max_new_tokens": 1}}
    with httpx.stream("POST", server.url + "/generate_stream", json=body, timeout=30) as one, \
            httpx.stream("POST", server.url + "/generate_stream", json=body, timeout=30) as two:
        assert state.wait_for("started", started + 2)
        third = stream(server, "x")
        state.release("slots")
        one.read(), two.read()
    assert third == [{"error": "Model is overloaded", "error_type": "overloaded"}]


def test_info_and_health(server: Server) -> None:
    info = httpx.get(server.url + "/info").json()
    assert info["router"] == "text-generation-router" and info["max_concurrent_requests"] == 2
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.content == b""


def test_disconnects_are_counted(server: Server) -> None:
    state = server.state
    started, disconnects, completed = state.started, state.disconnects, state.completed
    with httpx.stream("POST", server.url + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=gone", "parameters": {"max_new_tokens": 1}}):
        assert state.wait_for("started", started + 1)
    assert state.wait_for("disconnects", disconnects + 1)
    assert state.completed == completed
