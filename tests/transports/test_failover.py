"""Several upstreams per gateway (issue 25, item 3): ``eloquent serve --upstream openai=URL1,URL2`` in front of two
built-in engine servers. One upstream is SIGKILLed mid-stream: the stream completes from the other with the uncut
text; a refused connection goes to the next upstream; a request an upstream may have started is never sent again."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support.migration import Answer, read_all, sse_events
from tests.support.servers import eloquent_serve_process, free_port

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "the sea at night"}], "stream": True, "max_tokens": 100,
        "temperature": 0, "stream_options": {"include_usage": True}}


def _engine() -> contextlib.AbstractContextManager:
    return eloquent_serve_process("--stream-transport", "none", "--tpot", "0.02", "--ttft", "0.05")


def _gateway(*urls: str) -> contextlib.AbstractContextManager:
    return eloquent_serve_process("--stream-transport", "sse", "--upstream", "openai=" + ",".join(urls))


def _url(proc: object) -> str:
    return f"http://127.0.0.1:{proc.port}"  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def survivor() -> Iterator[str]:
    with _engine() as engine:
        yield _url(engine)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return data


@contextlib.contextmanager
def _hangs_up() -> Iterator[str]:
    """An upstream that reads a request and closes the connection without answering (it may have started it)."""
    server = socket.create_server(("127.0.0.1", free_port()))
    seen: list[bytes] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    seen.append(_read_request(conn))  # read whole: closing with unread bytes would be a reset

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", seen  # type: ignore[misc]
    finally:
        server.close()


def test_upstream_killed_mid_stream_the_other_completes_it(survivor):
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client:
        uncut = read_all(client, survivor + CHAT, BODY)
        with _engine() as victim, _gateway(_url(victim), survivor) as gateway:
            answer = Answer()
            with client.stream("POST", _url(gateway) + CHAT, json=BODY) as response:
                assert response.status_code == 200
                for index, (_, data) in enumerate(sse_events(response)):
                    answer.events.append((index, data))
                    if index == 10:
                        victim.kill()
            stats = client.get(survivor + "/v1/engine/stats").json()
    assert answer.complete
    assert answer.text == uncut.text
    assert answer.usage == uncut.usage and answer.finish_reason == uncut.finish_reason == "length"
    assert len({__import__("json").loads(d)["id"] for d in answer.datas if d != "[DONE]"}) == 1, "one chunk id"
    assert stats["completed"] >= 2  # the uncut stream and the continuation


def test_refused_connection_goes_to_the_next_upstream(survivor):
    dead = f"http://127.0.0.1:{free_port()}"
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client, _gateway(dead, survivor) as gateway:
        uncut = read_all(client, survivor + CHAT, BODY)
        answer = read_all(client, _url(gateway) + CHAT, BODY)
    assert answer.complete and answer.text == uncut.text


def test_a_request_the_upstream_may_have_started_is_not_sent_again(survivor):
    with httpx.Client(timeout=httpx.Timeout(60, connect=10)) as client, _hangs_up() as (url, seen):
        before = client.get(survivor + "/v1/engine/stats").json()
        with _gateway(url, survivor) as gateway:
            answer = read_all(client, _url(gateway) + CHAT, BODY)
        after = client.get(survivor + "/v1/engine/stats").json()
    posts = [request for request in seen if request.startswith(b"POST ")]  # (the gateway also asks GET /version)
    assert len(posts) == 1 and posts[0].startswith(b"POST /v1/chat/completions")
    assert any('"error"' in d for d in answer.datas), "the stream ends with an error event"
    assert after["completed"] + after["aborted"] + after["running"] == \
        before["completed"] + before["aborted"] + before["running"], "the other upstream never got it"
