"""What the vLLM adapter's ASGI stack adds per request and per event, in-process (issue 16 items 3 and 4).

Why in-process: on a live vLLM server the plugin's cost on bypassed requests (well under 1% of the API server's
CPU per token) is far inside the paired-round spread of a shared 2-core machine; here it is timed exactly.
``VllmStreamMiddleware(app)`` (as vLLM's ``--middleware`` builds it, ``--stream-transport sse``) around a stand-in
app that answers with ``messages`` body messages, against the bare app: CPU per request with the bypass header
(``eloquent-transport: datagram``: vLLM's own streaming, passed through), and per non-streamed request (a JSON
answer, which goes through the SSE middleware's pass-through), and per event of a stream through the SSE
middleware (the plugin's SSE path; the app yields between events as an engine does). Run it with vLLM's venv or
ours:
``python -m eloquent_vllm.bench_cost [--messages 256] [--requests 2000] [--loop uvloop] [--gc] [--cold 1024]
[--opcodes]``.

``--loop uvloop``: the loop vLLM's API server runs on (its ``loop.time`` and callbacks are C, so what Python code
costs differs from the default loop). ``--gc``: the garbage collector's share, per path: collections per
generation and their time per 1000 events (``gc.callbacks``), and the GC-tracked objects a request leaves behind
(net, while the collector is off) and how many of them only a collection frees (reference cycles). Why: objects
kept alive per event make the collector run inside whatever allocates next (the server's write), where a sampling
profiler charges it. ``--cold KIB``: the SSE path per event with cold caches, as on a live server, where an engine
step and the other streams run Python code over other memory between two events of one stream: before each event
the stand-in app reads one attribute of each of KIB * 16 objects (~KIB KiB), and only its ``send`` calls are timed.
``--opcodes``: the Python bytecodes the adapter stack adds per event on the SSE path (``sys.settrace`` with opcode
events, through the middleware minus the bare app), by function: exact and repeatable, so a change to the
per-event path can be judged on a machine too noisy to time it (CPU time per bytecode varies; the count does not).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import importlib.util
import statistics
import sys
import time
from argparse import Namespace
from types import SimpleNamespace
from typing import Any, Literal

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


class _Other:
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def cold_app(messages: int, kib: int, spent: list[float]) -> ASGIApp:
    """A stream whose events arrive with cold caches (Python code over ~``kib`` KiB of other objects before each);
    appends the CPU seconds of its body ``send`` calls to ``spent`` (per request)."""
    others = [_Other(1000 + i) for i in range(kib * 16)]  # ~64 bytes each: the object, its int, the list slot

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        clock = time.process_time
        total = 0.0
        for _ in range(messages):
            for other in others:
                total += other.value * 0
            await asyncio.sleep(0)
            started = clock()
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
            total += clock() - started
        spent.append(total)
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


async def opcode_counts(asgi: ASGIApp, outer: Any, *, requests: int, case: str) -> collections.Counter[str]:
    """Bytecodes executed over ``requests`` requests of ``case``, by ``folder/file.py:function``."""
    counts: collections.Counter[str] = collections.Counter()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts["/".join(code.co_filename.split("/")[-2:]) + ":" + code.co_name] += 1
        return trace

    sys.settrace(trace)
    try:
        for _ in range(requests):
            await asgi(_scope(outer, case, bypass=False), _receive, _sink)
    finally:
        sys.settrace(None)
    return counts


class GcMeter:
    """Collections per generation and the time spent in them while installed in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


async def gc_figures(asgi: ASGIApp, outer: Any, *, bypass: bool, requests: int, messages: int,
                     case: str) -> dict[str, float]:
    """The collector's work per 1000 events over ``requests`` requests, and what one request leaves to it."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = gc.get_count()[0]
        await asgi(_scope(outer, case, bypass=bypass), _receive, _sink)
        left = gc.get_count()[0] - before
    finally:
        if was_enabled:
            gc.enable()
    cyclic = gc.collect()
    with GcMeter() as meter:
        await cpu_per_request_us(asgi, outer, bypass=bypass, requests=requests, case=case)
    per = 1000 / (requests * messages)
    return {"gen0": meter.collections[0] * per, "gen1": meter.collections[1] * per,
            "gen2": meter.collections[2] * per, "gc_us": meter.seconds * 1e6 * per,
            "tracked_left_per_request": left, "cyclic_per_request": cyclic}


async def measure(messages: int = 256, requests: int = 2000, repeat: int = 7, *,
                  with_gc: bool = False, cold_kib: int = 0, opcodes: bool = False) -> dict[str, Any]:
    """Median added CPU (us) per request and (bypass) per event of the adapter stack over the bare app; with
    ``with_gc``, also the collector's figures per path (``gc_<case>_<figure>``; ``<case>`` is bare_bypass, bypass,
    bare_sse or sse); with ``cold_kib``, the SSE path's added CPU per event with cold caches (``sse_cold_*``, one
    request per repeat and side); with ``opcodes``, the SSE path's added bytecodes per event (``sse_opcodes_per_event``)
    and the functions that run them, most first (``sse_opcodes_by_function``, per event)."""
    from eloquent_vllm.middleware import VllmStreamMiddleware  # same package

    outer = SimpleNamespace(state=SimpleNamespace(args=Namespace(stream_transport="sse", eloquent_keepalive=15.0,
                                                                 host="127.0.0.1", port=8000)))
    out: dict[str, Any] = {"messages": messages}
    cases = {"bypass": (True, stand_in_app(messages, b"text/event-stream")),
             "non_streamed": (False, stand_in_app(1, b"application/json")),
             "sse": (False, stand_in_app(messages, b"text/event-stream", yields=True))}
    spent: list[float] = []
    apps = {label: app for label, (_, app) in cases.items()}
    if cold_kib:
        apps["sse_cold"] = cold_app(messages, cold_kib, spent)
    bare_app = dispatch(apps)
    wrapped = VllmStreamMiddleware(bare_app)
    await _check_through_middleware(wrapped, outer, messages)
    if opcodes:
        for _ in range(3):  # first requests of a path import and build what later ones reuse
            await cpu_per_request_us(wrapped, outer, bypass=False, requests=1, case="sse")
        bare_ops = await opcode_counts(bare_app, outer, requests=4, case="sse")
        added = await opcode_counts(wrapped, outer, requests=4, case="sse")
        added.subtract(bare_ops)
        per = 1 / (4 * messages)
        out["sse_bare_opcodes_per_event"] = sum(bare_ops.values()) * per
        out["sse_opcodes_per_event"] = sum(added.values()) * per
        out["sse_opcodes_by_function"] = {name: count * per for name, count in added.most_common() if count > 0}
    if with_gc:
        for label in ("bypass", "sse"):
            bypass = cases[label][0]
            for prefix, asgi in ((f"bare_{label}", bare_app), (label, wrapped)):
                figures = await gc_figures(asgi, outer, bypass=bypass, requests=requests, messages=messages,
                                           case=label)
                out.update({f"gc_{prefix}_{key}": value for key, value in figures.items()})
    for label, (bypass, _app) in cases.items():
        bare, through = [], []
        for _ in range(repeat):
            bare.append(await cpu_per_request_us(bare_app, outer, bypass=bypass, requests=requests, case=label))
            through.append(await cpu_per_request_us(wrapped, outer, bypass=bypass, requests=requests, case=label))
        out[f"{label}_bare_us_per_request"] = statistics.median(bare)
        out[f"{label}_added_us_per_request"] = statistics.median(through) - statistics.median(bare)
    out["bypass_added_ns_per_event"] = out["bypass_added_us_per_request"] / messages * 1000
    out["sse_added_ns_per_event"] = out["sse_added_us_per_request"] / messages * 1000
    if cold_kib:
        sides: dict[str, list[float]] = {"bare": [], "through": []}
        for _ in range(repeat):
            for side, asgi in (("bare", bare_app), ("through", wrapped)):
                spent.clear()
                await cpu_per_request_us(asgi, outer, bypass=False, requests=1, case="sse_cold")
                sides[side].append(spent[0] / messages * 1e9)
        out["sse_cold_bare_ns_per_send"] = statistics.median(sides["bare"])
        out["sse_cold_added_ns_per_event"] = statistics.median(sides["through"]) - statistics.median(sides["bare"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eloquent_vllm.bench_cost", description=__doc__)
    parser.add_argument("--messages", type=int, default=256, help="body messages (events) per bypassed request")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop (vLLM's API server runs on uvloop)")
    parser.add_argument("--gc", action="store_true", help="also print the garbage collector's figures per path")
    parser.add_argument("--cold", type=int, default=0, metavar="KIB",
                        help="also time the SSE path with cold caches: Python code over KIB KiB of other objects "
                        "between events")
    parser.add_argument("--opcodes", action="store_true",
                        help="also count the Python bytecodes the stack adds per event on the SSE path, by function")
    args = parser.parse_args(argv)
    if args.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        parser.error("--loop uvloop needs the uvloop package (vLLM's venv has it: run this with its python)")
    r = run(measure(args.messages, args.requests, args.repeat, with_gc=args.gc, cold_kib=args.cold,
                    opcodes=args.opcodes), args.loop)
    print(f"bypass ({args.messages} events/request): bare {r['bypass_bare_us_per_request']:.1f} us/request, "
          f"adapter adds {r['bypass_added_us_per_request']:.2f} us/request = "
          f"{r['bypass_added_ns_per_event']:.0f} ns/event")
    print(f"non-streamed: bare {r['non_streamed_bare_us_per_request']:.1f} us/request, adapter adds "
          f"{r['non_streamed_added_us_per_request']:.2f} us/request")
    print(f"SSE path ({args.messages} events/request, through the middleware: ids, stream log, direct write): "
          f"adapter adds {r['sse_added_us_per_request']:.1f} us/request = {r['sse_added_ns_per_event']:.0f} ns/event")
    if args.cold:
        print(f"SSE path, cold caches ({args.cold} KiB of other objects read between events): adapter adds "
              f"{r['sse_cold_added_ns_per_event']:.0f} ns/event (bare send {r['sse_cold_bare_ns_per_send']:.0f} ns)")
    if args.opcodes:
        print(f"SSE path, bytecodes: the adapter adds {r['sse_opcodes_per_event']:.1f} per event (the bare app runs "
              f"{r['sse_bare_opcodes_per_event']:.1f}); by function:")
        for name, count in list(r["sse_opcodes_by_function"].items())[:8]:
            print(f"  {count:7.1f}  {name}")
    if args.gc:
        for case in ("bare_bypass", "bypass", "bare_sse", "sse"):
            g = {key: r[f"gc_{case}_{key}"] for key in ("gen0", "gen1", "gen2", "gc_us", "tracked_left_per_request",
                                                         "cyclic_per_request")}
            print(f"GC {case}: per 1000 events {g['gen0']:.3f} gen0 / {g['gen1']:.3f} gen1 / {g['gen2']:.4f} gen2 "
                  f"collections, {g['gc_us']:.1f} us; a request leaves {g['tracked_left_per_request']:.0f} "
                  f"GC-tracked objects, {g['cyclic_per_request']:.0f} of them in cycles")
    return 0


def run(main: Any, loop: Literal["asyncio", "uvloop"] = "asyncio") -> Any:
    """``asyncio.run``, on uvloop when asked (an ImportError names the missing package)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


if __name__ == "__main__":
    raise SystemExit(main())
