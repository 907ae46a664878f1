"""CPU per token of the HTTP/3 datagram path against the HTTP/3 reliable stream, server and client apart.

Why: ``bench e2e --calibrate`` put the datagram path's lossless stall floor above the reliable stream's, and the
per-token timeline put the difference in processing (issue 19, item 2). Stall floors and wall-clock timings move
by points with the machine's load; the CPU each side spends per token, on a clock nobody else moves, does not.

So the real stack -- the built-in engine behind the HTTP/3 front end (``GuardedQuicServer``, ``Http3Connection``,
the scheduler and the core sender) and the client's ``Http3ClientConnection`` (aioquic, ``H3Stream``, the core
assembler and receiver) reading every event -- runs on a **virtual clock** (``virtual_clock``): packets cross an
in-memory link after ``rtt / 2``, nothing waits for real time, and the loop charges every callback's CPU to the
side it runs for. UDP syscalls are not in it: the packet counts say how many each token would cost.

``core`` times the sans-I/O pieces alone (``EloquentResponseStream`` -> ``EloquentAssembler``, acks back).
``--profile client|server|core`` prints cProfile's top functions of that part instead.

    python -m eloquent_plugins.cli.bench.datapath [--streams 1 --tokens 200 --repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import heapq
import io
import json
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench.virtual_clock import SERVER_ADDR, LinkEnd, VirtualLoop, link, side_context
from eloquent_plugins.cli.flags import add_duration, add_progress, parse

SCHEMES = ("eloquent", "stream")
MODEL = "eloquent-builtin"


# ---- live: the whole stack on the virtual clock ----------------------------------------------------------------
@dataclass(slots=True)
class LiveFigures:
    """Per token: server CPU (the engine, the front end, aioquic) and client CPU (aioquic, ``H3Stream``, the
    assembler, the reader) in microseconds, and datagrams each way."""

    scheme: str
    tokens: int
    server_us: float
    client_us: float
    down_packets: float
    up_packets: float


def _body(index: int, tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "stream": True, "max_tokens": tokens, "seed": index,
                       "messages": [{"role": "user", "content": f"Tell me story number {index}."}]}).encode()


async def _serve(end: LinkEnd, tpot: float, tokens: int) -> Any:
    """The HTTP/3 front end and the built-in engine, listening on ``end`` (what ``start_http3_server`` builds,
    without its socket)."""
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.engine import EngineConfig, create_engine_app
    from eloquent_plugins.h3glue.listener import GuardedQuicServer
    from eloquent_plugins.transports.http3.connection import Http3Connection
    from eloquent_plugins.transports.http3.options import FrontEndOptions
    from eloquent_plugins.transports.http3.server import codec_router, quic_server_configuration
    from eloquent_plugins.transports.http3.state import ServerState

    app = create_engine_app(EngineConfig(ttft=0.05, tpot=tpot, max_tokens_limit=max(8192, tokens)))
    options, config = FrontEndOptions(), StreamConfig()
    state = ServerState(app, config, options, None, codec_router(None, options))
    server = GuardedQuicServer(configuration=quic_server_configuration(config, options),
                               create_protocol=partial(Http3Connection, state=state))
    end.set_protocol(server)
    server.connection_made(end)
    return server


async def _read(conn: Any, scheme: str, index: int, tokens: int) -> int:
    """One streamed request read to its end, as ``H3Attempt`` reads it; returns the events."""
    from eloquent_plugins.core.protocol import DATAGRAM, SCHEME_HEADER, TRANSPORT_HEADER

    headers = [("content-type", "application/json"), ("accept", "text/event-stream")]
    if scheme != "stream":
        headers += [(TRANSPORT_HEADER.decode(), DATAGRAM.decode()), (SCHEME_HEADER.decode(), scheme)]
    h3 = await conn.request("POST", "/v1/chat/completions", headers=headers, body=_body(index, tokens),
                            eloquent=scheme != "stream")
    try:
        await h3.wait_headers(30.0)
        count = 0
        async for _ in h3.events():
            count += 1
        return count
    finally:
        h3.cancel()


async def _live(scheme: str, streams: int, tokens: int, rtt: float, tpot: float, repeats: int,
                profiler: cProfile.Profile | None) -> list[LiveFigures]:
    from eloquent_client.http3 import Http3ClientConnection

    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop)
    server_end, client_end = link(loop, rtt / 2)
    server = await server_end.context.run(asyncio.ensure_future, _serve(server_end, tpot, tokens))
    conn = await Http3ClientConnection.over(client_end, SERVER_ADDR, verify=False)
    out: list[LiveFigures] = []
    try:
        await _read(conn, scheme, 0, 4)  # the handshake's and first request's one-off work stays out
        for _ in range(repeats):
            cpu0, down0, up0 = dict(loop.cpu), server_end.sent, client_end.sent
            if profiler is not None:
                profiler.enable()
            rendered = sum(await asyncio.gather(*(_read(conn, scheme, i, tokens) for i in range(streams))))
            if profiler is not None:
                profiler.disable()
            n = max(rendered, 1)
            out.append(LiveFigures(scheme, rendered, (loop.cpu["server"] - cpu0.get("server", 0.0)) / n * 1e6,
                                   (loop.cpu["client"] - cpu0.get("client", 0.0)) / n * 1e6,
                                   (server_end.sent - down0) / n, (client_end.sent - up0) / n))
    finally:
        await conn.close()
        server.close()
    return out


def live(scheme: str, *, streams: int = 1, tokens: int = 200, rtt: float = 0.1, tpot: float = 0.03,
         repeats: int = 3, profiler: cProfile.Profile | None = None) -> list[LiveFigures]:
    """``repeats`` runs of ``streams`` concurrent requests of ``tokens`` tokens over one connection, on a fresh
    virtual-clock loop (``profiler``: enabled around the measured runs only)."""
    loop = VirtualLoop()
    try:
        return side_context("client").run(loop.run_until_complete,
                                          _live(scheme, streams, tokens, rtt, tpot, repeats, profiler))
    finally:
        loop.close()


# ---- core: the sans-I/O pieces on a virtual clock ---------------------------------------------------------------
def _chunk(i: int) -> bytes:
    """An OpenAI-shaped SSE message with a few characters of text, as engines write them."""
    text = ("Once upon a time ", "there ", "was a ", "story ", "number ", f"{i} ", "that ", "went on. ")[i % 8]
    obj = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1700000000,
           "model": MODEL, "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None,
                                        "finish_reason": None}]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def core_once(tokens: int, rtt: float, tpot: float, chunks: list[bytes] | None = None) -> tuple[int, int]:
    """One stream through the server's response stream and the client's assembler, no loss, acks back after
    ``rtt``; returns (events rendered, datagrams sent). ``chunks``: the SSE messages (made here when None)."""
    from eloquent_plugins.core.assembler import EloquentAssembler
    from eloquent_plugins.core.response_stream import EloquentResponseStream
    from eloquent_plugins.core.sender import SenderConfig

    stream = EloquentResponseStream(0, SenderConfig(), now=0.0)
    assembler = EloquentAssembler(0)
    queue: list[tuple[float, int, int, bytes]] = []  # (time, order, 0 token / 1 datagram / 2 ack, data)
    chunks = chunks if chunks is not None else [_chunk(i) for i in range(tokens)]
    for i in range(tokens):
        queue.append((i * tpot, i, 0, chunks[i]))
    heapq.heapify(queue)
    order, fed, rendered, one_way = tokens, 0, 0, rtt / 2
    while queue:
        now, _, kind, data = heapq.heappop(queue)
        if kind == 0:
            stream.feed_body(data, now)
            fed += 1
            if fed == tokens:
                rendered += len(assembler.on_control(stream.finish(now)))
        elif kind == 1:
            rendered += len(assembler.on_datagram(data, now))
            for ack in assembler.acks(now):
                order += 1
                heapq.heappush(queue, (now + one_way, order, 2, ack))
            continue
        else:
            stream.receive_datagram(data, now)
        for datagram in stream.datagrams_to_send(now):
            order += 1
            heapq.heappush(queue, (now + one_way, order, 1, datagram))
    return rendered, stream.datagrams_sent


def core(*, tokens: int, rtt: float, tpot: float, repeats: int) -> list[float]:
    """CPU microseconds per token of ``core_once``, one figure per repeat."""
    out = []
    chunks = [_chunk(i) for i in range(tokens)]
    for _ in range(repeats):
        start = time.process_time()
        rendered, _ = core_once(tokens, rtt, tpot, chunks)
        out.append((time.process_time() - start) / max(rendered, 1) * 1e6)
    return out


# ---- the command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=numbers.positive, default=1, help="concurrent streams on the one "
                        "connection (default: %(default)s, as each client of bench e2e)")
    parser.add_argument("--tokens", type=numbers.positive, default=200, help="tokens per stream (default: "
                        "%(default)s)")
    parser.add_argument("--repeats", type=numbers.positive, default=5, help="measured runs per scheme; the "
                        "median is reported (default: %(default)s)")
    add_duration(parser, "--rtt", default=0.1, help="round-trip time of the link (default: %(default)s)")
    add_duration(parser, "--tpot", default=0.03, help="engine seconds per token (default: %(default)s)")
    parser.add_argument("--part", choices=("live", "core", "all"), default="all", help="what to measure "
                        "(default: %(default)s)")
    parser.add_argument("--profile", choices=("client", "server", "core"), default=None,
                        help="print cProfile's top functions of that part (Eloquent scheme) instead of timing")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the figures as JSON")
    add_progress(parser)


def _stats_text(profiler: cProfile.Profile, top: int = 30) -> str:
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    if args.profile is not None:
        profiler = cProfile.Profile()
        if args.profile == "core":
            tokens = args.tokens * args.streams
            profiler.runcall(core_once, tokens, args.rtt, args.tpot, [_chunk(i) for i in range(tokens)])
        else:
            # One loop runs both sides; cProfile sees both, so the other side's functions show up too.
            live("eloquent", streams=args.streams, tokens=args.tokens, rtt=args.rtt, tpot=args.tpot, repeats=1,
                 profiler=profiler)
        print(_stats_text(profiler))
        return 0
    result: dict[str, Any] = {"streams": args.streams, "tokens": args.tokens, "rtt": args.rtt, "tpot": args.tpot,
                              "repeats": args.repeats}
    lines = [f"{args.streams} stream(s) x {args.tokens} tokens, RTT {args.rtt * 1000:g} ms, TPOT "
             f"{args.tpot * 1000:g} ms, virtual clock; median of {args.repeats} runs"]
    if args.part in ("live", "all"):
        lines.append(f"{'scheme':<10}{'server us/token':>17}{'client us/token':>17}{'down pkts/token':>17}"
                     f"{'up pkts/token':>15}")
        result["live"] = {}
        for scheme in SCHEMES:
            if args.progress:
                print(f"live {scheme} ...", file=sys.stderr)
            runs = live(scheme, streams=args.streams, tokens=args.tokens, rtt=args.rtt, tpot=args.tpot,
                        repeats=args.repeats)
            med = {k: statistics.median(getattr(r, k) for r in runs)
                   for k in ("server_us", "client_us", "down_packets", "up_packets")}
            result["live"][scheme] = {"median": med, "runs": [asdict(r) for r in runs]}
            lines.append(f"{scheme:<10}{med['server_us']:>17.0f}{med['client_us']:>17.0f}"
                         f"{med['down_packets']:>17.2f}{med['up_packets']:>15.2f}")
    if args.part in ("core", "all"):
        per_token = core(tokens=args.tokens * args.streams, rtt=args.rtt, tpot=args.tpot,
                         repeats=max(args.repeats, 5))
        result["core_us"] = {"median": statistics.median(per_token), "runs": per_token}
        lines.append(f"core (response stream + assembler, sans-I/O): {statistics.median(per_token):.1f} us/token")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump(result, fp, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eloquent_plugins.cli.bench.datapath",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parse(parser, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
