"""``eloquent bench overhead``: what the SSE middleware costs per event.

Local mode (default) serves the same token stream (built-in engine, tpot=0) from real uvicorn processes on
loopback, one per variant: the bare engine app, the engine behind ``EloquentMiddleware`` (resumable, and with
resume off), and an sse-starlette ``EventSourceResponse`` yielding the same chunks. For each it reports events/s
on one connection and the server process's CPU time per event, side by side with the ratio to the bare app.
It also times the middleware in-process (no sockets: a synthetic app and a no-op ``send``), which isolates its
own per-event cost, and ``--profile`` prints where that time goes.

``--target URL`` measures a live OpenAI-compatible server instead: tokens/s streamed vs non-streamed at
concurrency 1 and 32 (``--concurrency``), plus time to first token, in interleaved rounds with per-round ratios
(and, when the server runs our middleware, its streams around the middleware too); repeat ``--target LABEL=URL``
to put several servers side by side. See :mod:`.overhead_live`. ``--vllm MODEL`` starts vLLM with our
``--stream-transport`` and without it (and the ``openai=`` gateway) side by side and reports CPU per token in
vLLM's API-server and engine processes for every streaming path. See :mod:`.overhead_vllm`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench.procs import free_port
from eloquent_plugins.cli.flags import add_plot, add_progress

VARIANTS = ("bare", "middleware", "middleware-noresume", "sse-starlette")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer events and repetitions (a smoke run)")
    parser.add_argument("--events", type=numbers.positive, default=None,
                        help="events per stream (default 20000, quick 3000)")
    parser.add_argument("--repeat", type=numbers.positive, default=None,
                        help="runs per variant, best kept (default 3, quick 1)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--profile", action="store_true", help="cProfile the in-process middleware run")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    add_plot(parser, "write a PNG of the figures (needs matplotlib)")
    add_progress(parser)
    parser.add_argument("--target", metavar="[LABEL=]URL", action="append",
                        help="measure a live OpenAI-compatible server (base URL, e.g. http://127.0.0.1:8000) instead "
                        "of the local variants; repeat to compare several side by side")
    parser.add_argument("--vllm", metavar="MODEL", help="start vLLM on MODEL with --stream-transport (our plugin) and "
                        "without our flags, side by side: CPU per token in vLLM's processes for every streaming path")
    parser.add_argument("--vllm-python", metavar="PATH", help="python of the vLLM venv for --vllm (default "
                        "$ELOQUENT_VLLM_VENV/bin/python, else this one)")
    parser.add_argument("--vllm-args", default="", help="extra vLLM flags for both servers, one string "
                        "(e.g. '--enforce-eager --max-model-len 4096')")
    parser.add_argument("--vllm-transport", choices=("sse", "eloquent"), default="eloquent",
                        help="--stream-transport of the plugin server (default eloquent: adds the HTTP/3 path)")
    parser.add_argument("--vllm-startup-timeout", type=numbers.positive_seconds, default=900.0, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=numbers.positive, default=None,
                        help="for --target/--vllm: rounds per level; each "
                        "runs every mode once (non-streamed, streamed, and streamed around the middleware where "
                        "there is one) in a rotated order; the table gives the median of the per-round ratios "
                        "(default 9)")
    parser.add_argument("--client-cpus", metavar="LIST", help="pin this benchmark process to these CPUs "
                        "(e.g. 1 or 0-3; os.sched_setaffinity)")
    parser.add_argument("--server-cpus", metavar="LIST", help="for --vllm: start vLLM confined to these CPUs "
                        "(its processes inherit the mask; its OpenMP threads bind within it)")
    parser.add_argument("--gateway-cpus", metavar="LIST", help="for --vllm: start the openai= gateway confined to "
                        "these CPUs (with --server-cpus elsewhere: the gateway does not compete with vLLM's API "
                        "server for a core, so the gateway row compares like with like)")
    parser.add_argument("--model", default=None, help="model name for --target (default: the first of /v1/models)")
    parser.add_argument("--max-tokens", type=numbers.positive, default=256, help="tokens per request for --target")
    parser.add_argument("--concurrency", default="1,32", help="concurrency levels for --target (default 1,32)")
    parser.add_argument("--requests", type=numbers.positive, default=None, help="requests per level for --target "
                        "(default 2x the concurrency, at least 4)")
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=numbers.port, default=0, help=argparse.SUPPRESS)


# -- the apps under test ---------------------------------------------------------------------------------------


def build_app(variant: str) -> Any:
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.engine import EngineConfig, create_engine_app

    engine_config = EngineConfig(ttft=0.0, tpot=0.0, max_tokens_limit=1_000_000, max_tokens_default=16)
    engine = create_engine_app(engine_config)
    if variant == "bare":
        return engine
    if variant in ("middleware", "middleware-noresume"):
        from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

        return EloquentMiddleware(engine, StreamConfig(keepalive=15.0, resume=variant == "middleware"))
    if variant == "sse-starlette":
        return _sse_starlette_app(engine)
    raise ValueError(variant)


def _sse_starlette_app(engine_app: Any) -> Any:
    """The same engine chunks through sse-starlette's EventSourceResponse (what many servers use)."""
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.routing import Route

    from eloquent_plugins.engine.render import ChunkWriter
    from eloquent_plugins.engine.requests import parse_request

    engine = engine_app.state.engine

    async def chat(request: Request) -> EventSourceResponse:
        req = parse_request(await request.json(), chat=True, config=engine.config)
        writer = ChunkWriter(chat=True, request_id="chatcmpl-bench", created=int(time.time()),
                             model=engine.config.model, include_usage=False)

        async def events():
            yield writer.role()[6:-2].decode()
            async for tok in engine.generate(req.prompt, max_tokens=req.max_tokens, seed=req.seed):
                yield writer.token(tok.text)[6:-2].decode()
            yield "[DONE]"

        return EventSourceResponse(events(), ping=15, sep="\n")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _serve(variant: str, port: int) -> int:
    import uvicorn

    uvicorn.run(build_app(variant), host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                loop="asyncio", http="h11", access_log=False)
    return 0


# -- local measurement -----------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    variant: str
    events: int
    events_per_s: float
    cpu_us_per_event: float
    runs: list[dict[str, float]] = field(default_factory=list)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one_stream(url: str, events: int) -> tuple[int, float]:
    import httpx

    body = {"messages": [{"role": "user", "content": "benchmark"}], "stream": True, "max_tokens": events, "seed": 1}
    count = 0
    tail = b""
    async with httpx.AsyncClient(timeout=120) as client:
        start = time.perf_counter()
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for chunk in response.aiter_raw():
                data = tail + chunk
                count += data.count(b"data:") - tail.count(b"data:")
                tail = data[-5:]
        return count, time.perf_counter() - start


def _start_server(variant: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "eloquent_plugins.cli.bench.overhead", "--serve", variant,
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_port(port, proc)
    return proc, f"http://127.0.0.1:{port}"


def measure_variants(variants: list[str], events: int, repeat: int) -> list[VariantResult]:
    """Round-robin over the variants, so a busy machine slows them alike; keep each one's best run (highest
    events/s, lowest CPU per event: interference only ever makes figures worse)."""
    servers = {}
    try:
        for variant in variants:
            servers[variant] = _start_server(variant)
            asyncio.run(_one_stream(servers[variant][1], min(events, 500)))  # warm-up
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for _ in range(repeat):
            for variant in variants:
                proc, url = servers[variant]
                cpu0 = _cpu_seconds(proc.pid)
                count, wall = asyncio.run(_one_stream(url, events))
                cpu = _cpu_seconds(proc.pid) - cpu0
                runs[variant].append({"events": count, "seconds": wall, "events_per_s": count / wall,
                                      "cpu_us_per_event": cpu / count * 1e6})
    finally:
        for proc, _url in servers.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return [VariantResult(v, int(runs[v][0]["events"]), max(r["events_per_s"] for r in runs[v]),
                          min(r["cpu_us_per_event"] for r in runs[v]), runs[v]) for v in variants]


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"benchmark server exited: {err[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"benchmark server did not listen on {port}")


# -- in-process: the middleware's own cost ---------------------------------------------------------------------


def in_process_cost(events: int, *, resume: bool, profile: bool = False) -> dict[str, float]:
    """Microseconds per event of app -> middleware -> send, against app -> send, with no I/O at all."""
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.engine.render import ChunkWriter
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    writer = ChunkWriter(chat=True, request_id="chatcmpl-bench", created=0, model="m", include_usage=False)
    chunks = [writer.token(f" word{i % 50}") for i in range(events)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.sleep(0)  # an engine yields to the loop between tokens
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    sent = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        sent += len(message.get("body", b""))

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b"",
             "asgi": {"version": "3.0", "spec_version": "2.3"}}
    middleware = EloquentMiddleware(app, StreamConfig(keepalive=15.0, resume=resume))

    async def timed(target: Any) -> float:
        start = time.perf_counter()
        await target(dict(scope), receive, send)
        return time.perf_counter() - start

    async def main() -> tuple[float, float]:
        bare, wrapped = [], []
        for _ in range(5):  # interleaved; the best of each (interference only adds time)
            bare.append(await timed(app))
            wrapped.append(await timed(middleware))
        return min(bare), min(wrapped)

    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(main())
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    bare, wrapped = asyncio.run(main())
    return {"events": events, "bare_us_per_event": bare / events * 1e6,
            "middleware_us_per_event": wrapped / events * 1e6,
            "added_us_per_event": (wrapped - bare) / events * 1e6}


# -- entry -----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.serve:
        return _serve(args.serve, args.port)
    if args.client_cpus:
        from eloquent_plugins.cli.bench.overhead_live import parse_cpus

        os.sched_setaffinity(0, parse_cpus(args.client_cpus))  # threads started later inherit it
    if args.vllm:
        from eloquent_plugins.cli.bench.overhead_vllm import run_vllm

        result = run_vllm(args)
    elif args.target:
        from eloquent_plugins.cli.bench.overhead_live import run_target

        result = run_target(args)
    else:
        events = args.events or (3000 if args.quick else 20000)
        repeat = args.repeat or (1 if args.quick else 3)
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            from eloquent_plugins.core.errors import ConfigError

            raise ConfigError(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
        if "sse-starlette" in variants:  # the baseline most servers use; checked before minutes of measuring
            from eloquent_plugins.cli.optional import needs_extra

            with needs_extra("bench overhead's sse-starlette baseline (or leave it out with --variants)"):
                import sse_starlette  # noqa: F401
        results = measure_variants(variants, events, repeat)
        base = next((r for r in results if r.variant == "bare"), results[0])
        print(f"one stream of {events} events over loopback (uvicorn h11, tpot=0), best of {repeat}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'variant':<21} {'events/s':>10} {'vs bare':>8} {'server CPU us/event':>20} {'vs bare':>8}")
        for r in results:
            print(f"{r.variant:<21} {r.events_per_s:>10.0f} {r.events_per_s / base.events_per_s:>8.2f} "
                  f"{r.cpu_us_per_event:>20.1f} {r.cpu_us_per_event / base.cpu_us_per_event:>8.2f}")
        micro_events = 2000 if args.quick else 20000
        micro = [in_process_cost(micro_events, resume=resume, profile=args.profile and resume)
                 for resume in (True, False)]
        print(f"in-process, no sockets ({micro_events} events): app->send "
              f"{micro[0]['bare_us_per_event']:.2f} us/event; middleware adds "
              f"{micro[0]['added_us_per_event']:.2f} us/event (resumable), "
              f"{micro[1]['added_us_per_event']:.2f} us/event (resume off)")
        result = {"events": events, "repeat": repeat, "loadavg": os.getloadavg()[0], "cpus": os.cpu_count(),
                  "variants": [asdict(r) for r in results],
                  "in_process": {"resumable": micro[0], "resume_off": micro[1]}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eloquent bench overhead", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
