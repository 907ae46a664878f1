"""``bench leak``'s two observed paths: SSE writes and Eloquent datagrams, as an observer of the connection sees them.

**SSE**: the real ``EloquentMiddleware`` in process around an answer source (the built-in engine, or a replay of
recorded vLLM answers, ``leak_vllm``); every body write the server is handed, sized and timed. **Datagrams**: the
real ``EloquentSender`` with the padding (and ``--send-tick``) in the simulator, each answer's tokens at the times
its source produced them (the built-in engine run in process, ``engine_times``; vLLM's recording); every datagram
it sends, sized and timed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.cli.bench.leak_attack import Observed
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import DATAGRAM_FLOOR, DATAGRAM_GROWTH, SSE_GROWTH, datagram_policy, sse_policy
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.core.wire import DataPacket, decode_packet, encode_packet
from eloquent_plugins.engine import create_engine_app
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.sim.run import StreamSeeds, run_eloquent
from eloquent_plugins.sim.scenario import Scenario
from eloquent_plugins.sim.timeline import Timeline, TokenModel, generate_timeline
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

BUDGET = Limits().max_datagram_size
"""The simulator's datagram budget (the sender's default ``Limits``)."""


# ---- the answers ---------------------------------------------------------------------------------------------
def answer_set(n: int, tokens: int) -> tuple[list[str], list[list[str]]]:
    """``n`` prompts whose built-in engine answers (its passages, token by token) all differ."""
    from eloquent_plugins.engine.core import Engine

    engine = Engine()
    prompts: list[str] = []
    texts: list[list[str]] = []
    for i in range(50 * n):
        prompt = f"question {i}: tell me something"
        words = [t.text for t in engine.tokens_for(prompt, max_tokens=tokens, seed=None)]
        if words not in texts:
            prompts.append(prompt)
            texts.append(words)
            if len(texts) == n:
                return prompts, texts
    raise SystemExit(f"the built-in engine has fewer than {n} different answers of {tokens} tokens")


App = Callable[[Any, Any, Any], Awaitable[None]]
"""An ASGI app."""


@dataclass
class Source:
    """Where the answers come from: the built-in engine's passages (``builtin_source``) or a real vLLM server's
    answers, recorded and replayed (``leak_vllm``)."""

    name: str
    prompts: list[str]
    texts: list[list[str]]
    """Each answer's tokens (its first run's: a run at a temperature above 0 may differ)."""
    app: Callable[[], App]
    """A fresh ASGI app that streams the answers (the SSE path puts the middleware around it)."""
    timeline: Callable[[int, int, random.Random], Timeline]
    """``(run, answer, rng)``: the answer's token times and events, for the simulator."""


def builtin_source(n: int, tokens: int, tpot: float, jitter: float, sim_tpot: float, runs: int,
                   concurrency: int, drawn: bool = False) -> Source:
    """The built-in engine: ``tpot`` and its ``jitter`` for the SSE path; for the simulator, the times of the same
    engine's tokens at ``sim_tpot`` (the same seeded rhythm per answer, the event loop's noise per run), recorded
    once in process (``engine_times``), as vLLM's are; ``drawn``: times drawn afresh each run at ``sim_tpot``
    instead (no timing that depends on the answer)."""
    prompts, texts = answer_set(n, tokens)
    recorded: list[list[list[float]]] = []

    def timeline(run: int, answer: int, rng: random.Random) -> Timeline:
        if drawn:
            return timeline_for(texts[answer], sim_tpot, rng)
        if not recorded:
            engine = create_engine_app(EngineConfig(ttft=0.0, tpot=sim_tpot, tpot_jitter=jitter))
            recorded.extend(engine_times(engine, prompts, tokens, runs, concurrency))
        return timeline_for(texts[answer], sim_tpot, rng, recorded[run][answer])

    return Source("builtin", prompts, texts,
                  lambda: create_engine_app(EngineConfig(ttft=0.0, tpot=tpot, tpot_jitter=jitter)), timeline)


def engine_times(engine: App, prompts: list[str], tokens: int, runs: int, concurrency: int) -> list[list[list[float]]]:
    """``[run][answer]``: when each content chunk left ``engine`` (seconds from the first), ``concurrency``
    streams at once, run by run."""
    app = timed_app(engine)
    asks = [(run, a, p) for run in range(runs) for a, p in enumerate(prompts)]

    async def main() -> list[list[list[float]]]:
        out = [[[] for _ in prompts] for _ in range(runs)]
        sem = asyncio.Semaphore(concurrency)

        async def one(run: int, answer: int, prompt: str) -> None:
            async with sem:
                times = (await sse_stream(app, prompt, tokens, answer)).generated
                out[run][answer] = [t - times[0] for t in times]

        await asyncio.gather(*(one(*ask) for ask in asks))
        return out

    return asyncio.run(main())


# ---- SSE: the real middleware in process --------------------------------------------------------------------
def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
            "root_path": "", "headers": [(b"host", b"bench"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}


def _content_lengths(frame: bytes, parser: SSEParser) -> list[int]:
    out = []
    for message in parser.feed(frame):
        if message.data.startswith("{"):
            choices = json.loads(message.data).get("choices") or [{}]
            content = (choices[0].get("delta") or {}).get("content") or choices[0].get("text")
            if content:
                out.append(len(content.encode()))
    return out


async def sse_stream(app: Any, prompt: str, tokens: int, answer: int) -> Observed:
    """One request through ``app`` (``sse_app``): every body write the server would get, sized and timed."""
    body = json.dumps({"model": "eloquent-builtin", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    done = asyncio.Event()
    sent = False
    seen = Observed(answer)
    truth = SSEParser()
    loop = asyncio.get_running_loop()
    out_events: list[float] = []
    generated: list[float] = []
    scope = _scope()
    scope[_TIMES] = generated

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        data = message.get("body", b"")
        if not message.get("more_body", False):
            done.set()
        if not data:
            return
        now = loop.time()
        lengths = _content_lengths(data, truth)
        seen.sizes.append(len(data))
        seen.times.append(now)
        seen.token_lengths.append(lengths[0] if len(lengths) == 1 else None)
        out_events.extend([now] * len(lengths))

    await app(scope, receive, send)
    done.set()
    seen.latency = [o - g for o, g in zip(out_events, generated)]
    seen.generated = generated
    return seen


_TIMES = "eloquent.bench.generated"
"""Scope key: the list the timed engine appends each content chunk's send time to (generation times)."""


def timed_app(engine: App) -> App:
    """``engine`` (an answer source's app) with its content chunks timed as they leave it (``sse_stream``)."""

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        mine: list[float] = scope.get(_TIMES, [])
        loop = asyncio.get_running_loop()

        async def timed_send(message: dict[str, Any]) -> None:
            chunk = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if b'"content":"' in chunk and b'"content":""' not in chunk:  # a token (not the role chunk)
                mine.append(loop.time())
            await send(message)

        await engine(scope, receive, timed_send)

    return timed


def sse_app(mode: str, tick: float, inner: App, growth: float = SSE_GROWTH) -> EloquentMiddleware:
    """``inner`` (an answer source's app) behind the middleware; its content chunks are timed as they leave it."""
    app = EloquentMiddleware(timed_app(inner), StreamConfig(padding=mode, send_tick=tick, keepalive=0.0, resume=False))
    if app.padding is not None and growth != SSE_GROWTH:
        app.padding = sse_policy(mode, growth)  # the bench's classes, not the server's default
    return app


def observe_sse(mode: str, tick: float, source: Source, runs: int, tokens: int, concurrency: int,
                progress: Callable[[str], None], growth: float = SSE_GROWTH) -> tuple[list[Observed], float, int]:
    """Every answer ``runs`` times (run by run); also the CPU seconds per event and the padding bytes."""
    app = sse_app(mode, tick, source.app(), growth)
    prompts = source.prompts
    asks = [(a, p) for _ in range(runs) for a, p in enumerate(prompts)]

    async def main() -> list[Observed]:
        out: list[Observed | None] = [None] * len(asks)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int, answer: int, prompt: str) -> None:
            async with sem:
                out[i] = await sse_stream(app, prompt, tokens, answer)

        await asyncio.gather(*(one(i, a, p) for i, (a, p) in enumerate(asks)))
        return [o for o in out if o is not None]

    async def timed() -> tuple[list[Observed], float]:
        await sse_stream(app, "warm-up", tokens, -1)  # imports, first-call caches: not per event
        cpu = time.process_time()
        result = await main()
        return result, time.process_time() - cpu

    result, cpu = asyncio.run(timed())
    progress(f"sse {mode}{' tick' if tick else ''}: {len(result)} streams")
    return result, cpu / max(1, len(asks) * tokens), app.metrics.padding_bytes


# ---- datagrams: the real sender in the simulator -------------------------------------------------------------
def timeline_for(texts: list[str], tpot: float, rng: random.Random, times: list[float] | None = None) -> Timeline:
    """``texts`` as OpenAI chunks at ``times`` (the engine's, ``engine_times``; None: drawn at ``tpot``)."""
    base = generate_timeline(TokenModel(tokens=len(texts), tpot=tpot), rng)
    prefix = base.payloads[0].decode()
    prefix = prefix[: prefix.index('"content":') + len('"content":')]
    payloads = tuple((prefix + json.dumps(t) + '},"finish_reason":null}]}\n\n').encode() for t in texts)
    if times is not None and len(times) != len(texts):
        raise SystemExit(f"bench leak: the engine sent {len(times)} content chunks for an answer of {len(texts)}")
    return Timeline(base.times if times is None else tuple(times), tuple(texts), payloads, base.end_payload)


def observe_datagrams(mode: str, source: Source, runs: int, scenario: Scenario, seed: int,
                      progress: Callable[[str], None], floor: int = DATAGRAM_FLOOR,
                      growth: float = DATAGRAM_GROWTH, tick: float = 0.0) -> tuple[list[Observed], float]:
    """Every answer ``runs`` times through the simulated sender (``mode`` padding, ``tick``: ``--send-tick``);
    also the CPU seconds per event. Each token's latency is from its generation to the first datagram with it."""
    policy = datagram_policy(mode, BUDGET, floor, growth) if mode != "off" else None
    out: list[Observed] = []
    cpu = time.process_time()
    for run in range(runs):
        for answer in range(len(source.prompts)):
            rng = random.Random(f"{seed}/{run}/{answer}")
            timeline = source.timeline(run, answer, rng)
            words = timeline.texts
            seeds = StreamSeeds.derive(seed, run * len(source.prompts) + answer)
            seen = Observed(answer)
            newest = -1
            born = timeline.times

            def observe(now: float, datagram: bytes) -> None:
                nonlocal newest
                packet = decode_packet(datagram)
                seen.sizes.append(len(datagram))
                seen.times.append(now)
                top = packet.entries[-1].index if isinstance(packet, DataPacket) else -1
                fresh = top == newest + 1 and top < len(words)
                seen.token_lengths.append(len(words[top].encode()) if fresh else None)
                seen.latency.extend(now - born[i] for i in range(newest + 1, min(top + 1, len(born))))
                newest = max(newest, top)
                seen.raw_bytes += len(encode_packet(packet))  # the same packet without its padding

            result = run_eloquent(scenario, timeline, seeds, None, padding=policy, observe=observe, send_tick=tick)
            seen.stall = stall_metrics(result.generated, result.rendered, result.min_delay).stall_ratio
            out.append(seen)
    cpu = time.process_time() - cpu
    progress(f"datagram {mode}{' tick' if tick else ''}: {len(out)} streams")
    return out, cpu / max(1, sum(len(t) for t in source.texts) * runs)
