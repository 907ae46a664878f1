"""A real browser's EventSource (headless Chromium) reads a stream through the middleware unchanged, and after
a TCP cut in the middle it reconnects with Last-Event-ID and gets the rest exactly once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.chromium import open_page
from tests.support.servers import UvicornThread

EVENTS = 60
PAGE = """<!doctype html><html><body><script>
const got = [], ids = [];
let errors = 0;
const es = new EventSource('/events');
es.onmessage = (e) => {
  if (e.data === '[END]') {
    es.close();
    fetch('/result', {method: 'POST', body: JSON.stringify({got, ids, errors})});
    return;
  }
  got.push(e.data); ids.push(e.lastEventId);
};
es.onerror = () => { errors += 1; };
</script></body></html>"""


def make_app(results: list) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"connection": "close"})  # /events opens its own connection

    async def events(request: Request) -> StreamingResponse:
        async def body():
            yield b"retry: 200\ndata: line 0\n\n"  # reconnect quickly after the cut
            for i in range(1, EVENTS):
                await asyncio.sleep(0.01)
                yield f"data: line {i}\n\n".encode()
            yield b"data: [END]\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    async def result(request: Request) -> Response:
        results.append(json.loads(await request.body()))
        return Response(status_code=204)

    return Starlette(routes=[Route("/page", page), Route("/events", events),
                             Route("/result", result, methods=["POST"])])


@pytest.fixture(scope="module")
def site():
    results: list = []
    app = EloquentMiddleware(make_app(results), StreamConfig(keepalive=1.0, resume_grace=10))
    with UvicornThread(app) as server:
        yield server, results


def test_eventsource_reads_and_resumes_through_the_middleware(site):
    server, results = site
    plan = CutPlan(cuts={"/events": 1}, cut_range=(400, 900), seed=3)
    with CutProxy([server.port], plan) as proxy, open_page(proxy.url + "/page") as browser:
        deadline = time.monotonic() + 60
        while not results and time.monotonic() < deadline and browser.poll() is None:
            time.sleep(0.1)
    assert results, "the page never reported its events"
    report = results[0]
    assert report["got"] == [f"line {i}" for i in range(EVENTS)], "events lost, repeated or changed"
    assert plan.done_cuts.get("/events") == 1 and report["errors"] >= 1, "the stream was not cut"
    token = report["ids"][0].rpartition(":")[0]
    assert report["ids"] == [f"{token}:{i}" for i in range(EVENTS)]
