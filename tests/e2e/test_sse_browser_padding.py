"""A real browser's EventSource (headless Chromium) reads padded SSE unchanged (issue 29): with ``--padding
bucket`` every write carries an SSE comment line, with ``constant`` the events are also cut into 256-byte writes
(mid-line), and the page gets exactly the events, ids and data of the unpadded stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.chromium import open_page
from tests.support.servers import UvicornThread

EVENTS = 40
PAGE = """<!doctype html><html><body><script>
const got = [], ids = [];
const es = new EventSource('/events');
es.onmessage = (e) => {
  if (e.data === '[DONE]') {
    es.close();
    fetch('/result', {method: 'POST', body: JSON.stringify({got, ids})});
    return;
  }
  got.push(e.data); ids.push(e.lastEventId);
};
</script></body></html>"""


def chunk(i: int) -> str:
    """An OpenAI-shaped chunk; every fifth one long (several 256-byte writes under ``constant``)."""
    text = f" word{i}" * (40 if i % 5 == 4 else 1)
    return json.dumps({"id": "chatcmpl-pad", "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def make_app(results: list[dict[str, list[str]]]) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"connection": "close"})

    async def events(request: Request) -> StreamingResponse:
        async def body() -> object:
            for i in range(EVENTS):
                await asyncio.sleep(0.005)
                yield f"data: {chunk(i)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    async def result(request: Request) -> Response:
        results.append(json.loads(await request.body()))
        return Response(status_code=204)

    return Starlette(routes=[Route("/page", page), Route("/events", events),
                             Route("/result", result, methods=["POST"])])


@pytest.fixture(scope="module")
def sites() -> Iterator[dict[str, tuple[UvicornThread, list[dict[str, list[str]]]]]]:
    out = {}
    with UvicornThread(EloquentMiddleware(make_app(r1 := []), StreamConfig(padding="bucket", keepalive=0.0))) as b, \
            UvicornThread(EloquentMiddleware(make_app(r2 := []), StreamConfig(padding="constant",
                                                                              keepalive=0.0))) as c:
        out["bucket"], out["constant"] = (b, r1), (c, r2)
        yield out


@pytest.mark.parametrize("mode", ["bucket", "constant"])
def test_eventsource_reads_padded_sse_unchanged(sites: dict[str, tuple[UvicornThread, list]], mode: str) -> None:
    server, results = sites[mode]
    url = f"http://127.0.0.1:{server.port}"
    raw = httpx.get(url + "/events", timeout=30).content
    parser = SSEParser()
    sent = parser.feed(raw)
    assert parser.comments_seen >= EVENTS and b"\n:pp" in raw  # the stream is padded
    with open_page(url + "/page") as browser:
        deadline = time.monotonic() + 60
        while not results and time.monotonic() < deadline and browser.poll() is None:
            time.sleep(0.1)
    assert results, "the page never reported its events"
    report = results[0]
    assert report["got"] == [chunk(i) for i in range(EVENTS)], "events lost, repeated or changed"
    assert report["got"] == [m.data for m in sent if m.data != "[DONE]"]
    token = report["ids"][0].rpartition(":")[0]
    assert token and report["ids"] == [f"{token}:{i}" for i in range(EVENTS)]
