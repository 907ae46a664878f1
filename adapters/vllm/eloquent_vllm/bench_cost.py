"""What the vLLM adapter's ASGI stack adds per request and per event, in-process (issue 16 items 3 and 4).

Why in-process: on a live vLLM server the plugin's cost on bypassed requests (well under 1% of the API server's
CPU per token) is far inside the paired-round spread of a shared 2-core machine; here it is timed exactly.
``VllmStreamMiddleware(app)`` (as vLLM's ``--middleware`` builds it, ``--stream-transport sse``) around a stand-in
app that answers with ``messages`` body messages, against the bare app: CPU per request with the bypass header
(``eloquent-transport: datagram``: vLLM's own streaming, passed through), and per non-streamed request (a JSON
answer, which goes through the SSE middleware's pass-through), and per event of a stream through the SSE
middleware (the plugin's SSE path; the app yields between events as an engine does). Run it with vLLM's venv or
ours:
``python -m eloquent_vllm.bench_cost [--messages 256] [--requests 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from argparse import Namespace
from types import SimpleNamespace
from typing import Any

from eloquent_plugins.core.protocol import DATAGRAM, TRANSPORT_HEADER
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Send

EVENT = b'data: {"id":"x","choices":[{"delta":{"content":"tok"}}]}\n\n'


def stand_in_app(messages: int, content_type: bytes, *, yields: bool = False) -> ASGIApp:
    """``yields``: give the loop a turn before each event, as an engine's stream does between tokens (the SSE
    path's connection then sits caught up and the event takes the direct-write path, as on a live server)."""

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for _ in range(messages):
            if yields:
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def _sink(message: Message) -> None:
    return None


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


def dispatch(apps: dict[str, ASGIApp]) -> ASGIApp:
    """One app for every case, chosen by ``scope["bench"]``: the adapter is built once (a second build would
    register its metrics in the process's Prometheus registry again)."""

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        await apps[scope["bench"]](scope, receive, send)

    return app


def _scope(outer: Any, case: str, *, bypass: bool) -> dict[str, Any]:
    headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
    if bypass:
        headers.append((TRANSPORT_HEADER, DATAGRAM))
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
            "query_string": b"", "app": outer, "bench": case}


async def cpu_per_request_us(asgi: ASGIApp, outer: Any, *, bypass: bool, requests: int, case: str = "") -> float:
    start = time.process_time()
    for _ in range(requests):
        await asgi(_scope(outer, case, bypass=bypass), _receive, _sink)
    return (time.process_time() - start) / requests * 1e6


async def _check_through_middleware(wrapped: ASGIApp, outer: Any, messages: int) -> None:
    """The SSE figure must time the middleware's stream path: every event of one request comes out with an id."""
    sent: list[Message] = []

    async def record(message: Message) -> None:
        sent.append(message)

    await wrapped(_scope(outer, "sse", bypass=False), _receive, record)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    if body.count(b"\nid: ") + body.startswith(b"id: ") != messages:
        raise RuntimeError(f"the SSE measure did not go through the middleware: {body[:200]!r}")


async def measure(messages: int = 256, requests: int = 2000, repeat: int = 7) -> dict[str, float]:
    """Median added CPU (us) per request and (bypass) per event of the adapter stack over the bare app."""
    from eloquent_vllm.middleware import VllmStreamMiddleware  # same package

    outer = SimpleNamespace(state=SimpleNamespace(args=Namespace(stream_transport="sse", eloquent_keepalive=15.0,
                                                                 host="127.0.0.1", port=8000)))
    out: dict[str, float] = {"messages": messages}
    cases = {"bypass": (True, stand_in_app(messages, b"text/event-stream")),
             "non_streamed": (False, stand_in_app(1, b"application/json")),
             "sse": (False, stand_in_app(messages, b"text/event-stream", yields=True))}
    bare_app = dispatch({label: app for label, (_, app) in cases.items()})
    wrapped = VllmStreamMiddleware(bare_app)
    await _check_through_middleware(wrapped, outer, messages)
    for label, (bypass, _app) in cases.items():
        bare, through = [], []
        for _ in range(repeat):
            bare.append(await cpu_per_request_us(bare_app, outer, bypass=bypass, requests=requests, case=label))
            through.append(await cpu_per_request_us(wrapped, outer, bypass=bypass, requests=requests, case=label))
        out[f"{label}_bare_us_per_request"] = statistics.median(bare)
        out[f"{label}_added_us_per_request"] = statistics.median(through) - statistics.median(bare)
    out["bypass_added_ns_per_event"] = out["bypass_added_us_per_request"] / messages * 1000
    out["sse_added_ns_per_event"] = out["sse_added_us_per_request"] / messages * 1000
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eloquent_vllm.bench_cost", description=__doc__)
    parser.add_argument("--messages", type=int, default=256, help="body messages (events) per bypassed request")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    r = asyncio.run(measure(args.messages, args.requests, args.repeat))
    print(f"bypass ({args.messages} events/request): bare {r['bypass_bare_us_per_request']:.1f} us/request, "
          f"adapter adds {r['bypass_added_us_per_request']:.2f} us/request = "
          f"{r['bypass_added_ns_per_event']:.0f} ns/event")
    print(f"non-streamed: bare {r['non_streamed_bare_us_per_request']:.1f} us/request, adapter adds "
          f"{r['non_streamed_added_us_per_request']:.2f} us/request")
    print(f"SSE path ({args.messages} events/request, through the middleware: ids, stream log, direct write): "
          f"adapter adds {r['sse_added_us_per_request']:.1f} us/request = {r['sse_added_ns_per_event']:.0f} ns/event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
