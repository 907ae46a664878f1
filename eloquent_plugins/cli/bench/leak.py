# long: one bench, two observed paths (SSE writes, datagrams), the attacker's two tasks and the cost figures
"""``eloquent bench leak``: what an observer of the encrypted connection learns from write sizes and times (issue 29).

The observer sees only what TLS or QUIC leaves visible: the size and time of each SSE write (the ASGI body
messages the real ``EloquentMiddleware`` hands the server for the built-in engine's answers, in process) or of each
Eloquent datagram (the real sender in the simulator, 10% loss by default). Per ``--padding`` mode it tries

(a) to recover each token's byte length: a table from what it sees (write size; datagram size and the size change
    since the previous datagram) to the token length most often seen with it in the training runs;
(b) to tell which of ``--answers`` known answers was streamed: 1-nearest-neighbour over three feature sets (the
    size sequence, the histogram of sizes; the sequence of gaps between writes), leave-one-run-out over ``--runs``
    runs of each answer; the better of the two size attacks and the timing attack are reported, against chance
    ``1/answers``.

Every answer has ``--tokens`` tokens, so the number of writes does not tell them apart (it does in real life:
padding does not hide an answer's length). Also per mode: bytes against ``off`` (payload, and on the wire with a
per-write TLS+TCP or QUIC+UDP overhead), stall ratio in the simulator at ``--loss`` (TCP with the padded write
sizes for SSE, the Eloquent sender with padding for datagrams), CPU per event, and with ``--send-tick`` the SSE
path's added latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_progress
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import DATAGRAM_FLOOR, MODES, datagram_policy, sse_policy
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.core.wire import DataPacket, decode_packet, encode_packet, pad_packet
from eloquent_plugins.engine import create_engine_app
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER, TCP_HEADER
from eloquent_plugins.sim.run import StreamSeeds, run_eloquent, run_tcp
from eloquent_plugins.sim.scenario import Scenario
from eloquent_plugins.sim.timeline import Timeline, TokenModel, generate_timeline
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

TLS_RECORD = 22
"""TLS 1.3 per record: 5 header bytes, a content-type byte, a 16-byte tag (on top of the TCP/IP header)."""
BUDGET = Limits().max_datagram_size
"""The simulator's datagram budget (the sender's default ``Limits``)."""


@dataclass
class Observed:
    """One stream as the observer sees it, and the truth it is scored against."""

    answer: int
    sizes: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    token_lengths: list[int | None] = field(default_factory=list)
    """Per write/datagram: the byte length of the one new token it carries (None: none, or several)."""
    raw_bytes: int = 0
    """The same writes' bytes without padding."""
    stall: float = 0.0
    latency: list[float] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--answers", type=numbers.positive, default=20, help="known answers to tell apart (20)")
    parser.add_argument("--runs", type=numbers.positive, default=5, help="runs of each answer (5; >= 2)")
    parser.add_argument("--tokens", type=numbers.positive, default=40, help="tokens per answer (40)")
    parser.add_argument("--modes", default=",".join(MODES), help="padding modes, comma-separated (off,bucket,constant)")
    parser.add_argument("--paths", default="sse,datagram", help="sse, datagram or both (sse,datagram)")
    parser.add_argument("--loss", type=numbers.loss_rate, default=0.10, help="simulated loss each direction (0.10)")
    parser.add_argument("--rtt", type=numbers.seconds, default=0.06, help="simulated round trip, seconds (0.06)")
    parser.add_argument("--tpot", type=numbers.seconds, default=0.03, help="simulated seconds per token (0.03)")
    parser.add_argument("--sse-tpot", type=numbers.seconds, default=0.004,
                        help="the in-process engine's seconds per token for the SSE path (0.004)")
    parser.add_argument("--engine-jitter", type=numbers.fraction, default=0.3,
                        help="the in-process engine's tpot jitter (0.3); it is seeded by the prompt, so each answer "
                        "keeps its own timing from run to run: a stand-in for timing that depends on the content")
    parser.add_argument("--send-tick", type=numbers.seconds, default=0.0,
                        help="also run the SSE path with --padding constant and this --send-tick (0: skip)")
    parser.add_argument("--datagram-floor", type=numbers.positive, default=DATAGRAM_FLOOR,
                        help=f"smallest datagram class of bucket padding ({DATAGRAM_FLOOR})")
    parser.add_argument("--concurrency", type=numbers.positive, default=8, help="SSE streams at once (8)")
    parser.add_argument("--seed", type=numbers.seed, default=29)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    add_progress(parser)


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
            content = (choices[0].get("delta") or {}).get("content")
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
    return seen


_TIMES = "eloquent.bench.generated"
"""Scope key: the list the timed engine appends each content chunk's send time to (generation times)."""


def sse_app(mode: str, tick: float, tpot: float, jitter: float) -> EloquentMiddleware:
    """The built-in engine behind the middleware; the engine's content chunks are timed as they leave it."""
    engine = create_engine_app(EngineConfig(ttft=0.0, tpot=tpot, tpot_jitter=jitter))

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        mine: list[float] = scope.get(_TIMES, [])
        loop = asyncio.get_running_loop()

        async def timed_send(message: dict[str, Any]) -> None:
            chunk = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if b'"content":"' in chunk and b'"content":""' not in chunk:  # a token (not the role chunk)
                mine.append(loop.time())
            await send(message)

        await engine(scope, receive, timed_send)

    return EloquentMiddleware(timed, StreamConfig(padding=mode, send_tick=tick, keepalive=0.0, resume=False))


def observe_sse(mode: str, tick: float, prompts: list[str], texts: list[list[str]], runs: int, tokens: int,
                tpot: float, jitter: float, concurrency: int,
                progress: Callable[[str], None]) -> tuple[list[Observed], float, int]:
    """Every answer ``runs`` times (run by run); also the CPU seconds per event and the padding bytes."""
    app = sse_app(mode, tick, tpot, jitter)
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
def timeline_for(texts: list[str], tpot: float, rng: random.Random) -> Timeline:
    base = generate_timeline(TokenModel(tokens=len(texts), tpot=tpot), rng)
    prefix = base.payloads[0].decode()
    prefix = prefix[: prefix.index('"content":') + len('"content":')]
    payloads = tuple((prefix + json.dumps(t) + '},"finish_reason":null}]}\n\n').encode() for t in texts)
    return Timeline(base.times, tuple(texts), payloads, base.end_payload)


def observe_datagrams(mode: str, texts: list[list[str]], runs: int, scenario: Scenario, seed: int,
                      progress: Callable[[str], None], floor: int = DATAGRAM_FLOOR) -> tuple[list[Observed], float]:
    policy = datagram_policy(mode, BUDGET, floor) if mode != "off" else None
    out: list[Observed] = []
    cpu = time.process_time()
    for run in range(runs):
        for answer, words in enumerate(texts):
            rng = random.Random(f"{seed}/{run}/{answer}")
            timeline = timeline_for(words, scenario.tpot_ms / 1000, rng)
            seeds = StreamSeeds.derive(seed, run * len(texts) + answer)
            seen = Observed(answer)
            newest = -1

            def observe(now: float, datagram: bytes) -> None:
                nonlocal newest
                packet = decode_packet(datagram)
                seen.sizes.append(len(datagram))
                seen.times.append(now)
                top = packet.entries[-1].index if isinstance(packet, DataPacket) else -1
                fresh = top == newest + 1 and top < len(words)
                seen.token_lengths.append(len(words[top].encode()) if fresh else None)
                newest = max(newest, top)
                seen.raw_bytes += len(encode_packet(packet))  # the same packet without its padding

            result = run_eloquent(scenario, timeline, seeds, None, padding=policy, observe=observe)
            seen.stall = stall_metrics(result.generated, result.rendered, result.min_delay).stall_ratio
            out.append(seen)
    cpu = time.process_time() - cpu
    progress(f"datagram {mode}: {len(out)} streams")
    return out, cpu / max(1, runs * len(texts) * len(texts[0]))


def sse_stall(observed: list[Observed], scenario: Scenario, texts: list[list[str]], seed: int) -> float:
    """Stall ratio of SSE over simulated TCP at the scenario's loss, each token's write as large as observed."""
    ratios = []
    for i, obs in enumerate(observed):
        sizes = [s for s, n in zip(obs.sizes, obs.token_lengths) if n is not None][: len(texts[obs.answer])]
        rng = random.Random(f"{seed}/tcp/{i}")
        timeline = timeline_for(texts[obs.answer], scenario.tpot_ms / 1000, rng)
        if len(sizes) < len(timeline.times):
            sizes += [sizes[-1] if sizes else 256] * (len(timeline.times) - len(sizes))
        result = run_tcp(scenario, timeline, StreamSeeds.derive(seed, i), None, 1, "retransmission", sizes=sizes)
        ratios.append(stall_metrics(result.generated, result.rendered, result.min_delay).stall_ratio)
    return statistics.fmean(ratios)


# ---- the attacker --------------------------------------------------------------------------------------------
def _folds(observed: list[Observed], runs: int, answers: int) -> list[tuple[list[Observed], list[Observed]]]:
    """Leave one run out: stream ``k`` of each answer is run ``k // answers`` (``observe_*`` order them so)."""
    by_run: list[list[Observed]] = [[] for _ in range(runs)]
    counts: Counter[int] = Counter()
    for obs in observed:
        by_run[counts[obs.answer] % runs].append(obs)
        counts[obs.answer] += 1
    return [([o for j, r in enumerate(by_run) if j != k for o in r], by_run[k]) for k in range(runs)]


def token_length_recovery(observed: list[Observed], runs: int, answers: int, datagram: bool) -> tuple[float, float]:
    """The attacker's hit rate on single-token writes, and the baseline (always the most common length)."""
    hits = base_hits = total = 0
    for train, test in _folds(observed, runs, answers):
        fine: dict[tuple[int, int], Counter[int]] = {}
        coarse: dict[int, Counter[int]] = {}
        overall: Counter[int] = Counter()
        for obs in train:
            for key, n in _length_keys(obs, datagram):
                fine.setdefault(key, Counter())[n] += 1
                coarse.setdefault(key[0], Counter())[n] += 1
                overall[n] += 1
        mode = overall.most_common(1)[0][0] if overall else 0
        for obs in test:
            for key, n in _length_keys(obs, datagram):
                table = fine.get(key) or coarse.get(key[0])
                guess = table.most_common(1)[0][0] if table else mode
                hits += guess == n
                base_hits += mode == n
                total += 1
    return hits / max(1, total), base_hits / max(1, total)


def _length_keys(obs: Observed, datagram: bool) -> list[tuple[tuple[int, int], int]]:
    keys = []
    previous = 0
    for size, n in zip(obs.sizes, obs.token_lengths):
        if n is not None:
            keys.append(((size, size - previous if datagram else 0), n))
        previous = size
    return keys


def _features(obs: Observed, kind: str, length: int, classes: Sequence[int]) -> list[float]:
    sizes = [s / 64 for s in obs.sizes[:length]] + [0.0] * max(0, length - len(obs.sizes))
    if kind == "sizes":
        return sizes
    if kind == "gaps":
        t = obs.times
        return [(b - a) * 100 for a, b in zip(t, t[1:length])] + [0.0] * max(0, length - len(t))
    counts = Counter(obs.sizes)
    return [counts.get(c, 0) / 4 for c in classes]


def identification(observed: list[Observed], runs: int, answers: int, tokens: int) -> dict[str, float]:
    """1-NN accuracy per feature set (``sizes``, ``histogram``: the sizes; ``gaps``: the timing)."""
    classes = sorted({s for o in observed for s in o.sizes})
    out = {}
    for kind in ("sizes", "histogram", "gaps"):
        right = count = 0
        for train, test in _folds(observed, runs, answers):
            train_x = [(_features(o, kind, tokens + 4, classes), o.answer) for o in train]
            for obs in test:
                x = _features(obs, kind, tokens + 4, classes)
                guess = min(train_x, key=lambda t: math.dist(t[0], x))[1]
                right += guess == obs.answer
                count += 1
        out[kind] = right / max(1, count)
    return out


# ---- padding's own CPU ---------------------------------------------------------------------------------------
def padding_cpu(mode: str, frame: bytes, datagram: bytes, n: int = 20000) -> tuple[float, float]:
    """Nanoseconds per call of what padding adds per event: the SSE writes of one frame, one padded datagram."""
    if mode == "off":
        return 0.0, 0.0
    sse, dgram = sse_policy(mode), datagram_policy(mode, BUDGET)
    start = time.perf_counter()
    for _ in range(n):
        sse.sse_writes(frame)
    mid = time.perf_counter()
    for _ in range(n):
        pad_packet(datagram, dgram.target(len(datagram)))
    end = time.perf_counter()
    return (mid - start) / n * 1e9, (end - mid) / n * 1e9


# ---- the report ----------------------------------------------------------------------------------------------
def summarize(path: str, mode: str, observed: list[Observed], runs: int, answers: int, tokens: int,
              cpu: float, stall: float, raw: int, overhead: int, raw_writes: int | None) -> dict[str, Any]:
    """``raw``: the bytes without padding (SSE: of these writes; datagrams: of the ``off`` run, whose packets the
    padded runs would have sent); ``raw_writes``: writes without padding (``off``'s; None: as many as now)."""
    recovered, baseline = token_length_recovery(observed, runs, answers, path == "datagram")
    accuracy = identification(observed, runs, answers, tokens)
    by_size = max(accuracy["sizes"], accuracy["histogram"])
    padded = sum(sum(o.sizes) for o in observed)
    writes = sum(len(o.sizes) for o in observed)
    raw_writes = writes if raw_writes is None else raw_writes
    latency = [x for o in observed for x in o.latency]
    return {
        "path": path, "mode": mode, "streams": len(observed),
        "token_length_recovery": round(recovered, 3), "token_length_baseline": round(baseline, 3),
        "identification_sizes": round(by_size, 3), "identification_sizes_x_chance": round(by_size * answers, 2),
        "identification_timed": round(accuracy["gaps"], 3),
        "identification_timed_x_chance": round(accuracy["gaps"] * answers, 2),
        "identification_by_features": {k: round(v, 3) for k, v in accuracy.items()}, "chance": round(1 / answers, 3),
        "bytes_ratio": round(padded / max(1, raw), 3),
        "wire_bytes_ratio": round((padded + overhead * writes) / max(1, raw + overhead * raw_writes), 3),
        "sizes_seen": len({s for o in observed for s in o.sizes}),
        "stall_ratio": round(stall, 4), "cpu_us_per_event": round(cpu * 1e6, 1),
        "latency_ms_mean": round(statistics.fmean(latency) * 1000, 2) if latency else None,
        "latency_ms_p95": round(sorted(latency)[int(0.95 * (len(latency) - 1))] * 1000, 2) if latency else None,
    }


def run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown padding mode {m!r} (choose from {', '.join(MODES)})")
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (the attacker trains on the other runs)")
    show: Callable[[str], None] = (lambda line: print(line, flush=True)) if args.progress else (lambda line: None)
    asked, texts = answer_set(args.answers, args.tokens)
    scenario = Scenario(loss=args.loss, rtt_ms=args.rtt * 1000, tpot_ms=args.tpot * 1000, tokens=args.tokens)
    rows: list[dict[str, Any]] = []
    plain: dict[str, int] = {}
    frame = b'id: tok:12\ndata: {"id":"chatcmpl-x","object":"chat.completion.chunk","choices":[{"delta":' \
            b'{"content":" word"}}]}\n\n'
    datagram = bytes(40)
    variants = [(m, 0.0) for m in modes] + ([("constant", args.send_tick)] if args.send_tick else [])
    if "sse" in paths:
        for mode, tick in variants:
            observed, cpu, padding = observe_sse(mode, tick, asked, texts, args.runs, args.tokens, args.sse_tpot,
                                                 args.engine_jitter, args.concurrency, show)
            stall = sse_stall(observed, scenario, texts, args.seed)
            raw = sum(sum(o.sizes) for o in observed) - padding
            if mode == "off":
                plain["sse"] = sum(len(o.sizes) for o in observed)
            row = summarize("sse", mode + (f"+tick {tick * 1000:g}ms" if tick else ""), observed, args.runs,
                            args.answers, args.tokens, cpu, stall, raw, TLS_RECORD + TCP_HEADER,
                            plain.get("sse"))
            row["padding_ns_per_event"] = round(padding_cpu(mode, frame, datagram)[0])
            rows.append(row)
    if "datagram" in paths:
        for mode in modes:
            observed, cpu = observe_datagrams(mode, texts, args.runs, scenario, args.seed, show, args.datagram_floor)
            stall = statistics.fmean(o.stall for o in observed)
            raw = sum(o.raw_bytes for o in observed)
            if mode == "off":
                plain["datagram"] = raw
            row = summarize("datagram", mode, observed, args.runs, args.answers, args.tokens, cpu, stall,
                            plain.get("datagram", raw), QUIC_DATAGRAM_HEADER, None)
            row["padding_ns_per_event"] = round(padding_cpu(mode, frame, datagram)[1])
            rows.append(row)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump({"answers": args.answers, "runs": args.runs, "tokens": args.tokens, "loss": args.loss,
                       "variants": rows}, fp, indent=2)
    return 0


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"bench leak: {args.answers} answers x {args.runs} runs x {args.tokens} tokens; chance 1/{args.answers}"
          f" = {1 / args.answers:.3f}; simulated loss {args.loss:g}, rtt {args.rtt * 1000:g} ms")
    head = (f"{'path':<9}{'mode':<22}{'len rec':>8}{'(base)':>8}{'id size':>8}{'xch':>6}{'id time':>8}{'xch':>6}"
            f"{'bytes':>7}{'wire':>7}"
            f"{'sizes':>6}{'stall':>8}{'cpu us/ev':>10}{'pad ns':>8}{'lat ms':>8}")
    print(head)
    for r in rows:
        lat = r["latency_ms_mean"]
        print(f"{r['path']:<9}{r['mode']:<22}{r['token_length_recovery']:>8.3f}{r['token_length_baseline']:>8.3f}"
              f"{r['identification_sizes']:>8.3f}{r['identification_sizes_x_chance']:>6.1f}"
              f"{r['identification_timed']:>8.3f}{r['identification_timed_x_chance']:>6.1f}{r['bytes_ratio']:>7.2f}"
              f"{r['wire_bytes_ratio']:>7.2f}{r['sizes_seen']:>6}{r['stall_ratio']:>8.4f}"
              f"{r['cpu_us_per_event']:>10.1f}{r['padding_ns_per_event']:>8}{'' if lat is None else f'{lat:.2f}':>8}")
