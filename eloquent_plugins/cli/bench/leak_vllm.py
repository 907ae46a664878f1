"""``bench leak --vllm MODEL``: a real vLLM server's answers for the attacker to tell apart (issue 29).

A real model's answers differ from the built-in engine's passages in token lengths and timing, and both are what
the attacker reads. The bench starts ``python -m eloquent_vllm.serve MODEL`` (vLLM unchanged: no stream flags),
streams ``--answers`` prompts ``--runs`` times each, one at a time (so each run's gaps are vLLM's own), and records
every SSE event as vLLM sent it with its arrival time. The two observed paths then replay the recording: SSE
through the real middleware (``replay_app``, each event at its recorded time), datagrams through the real sender
in the simulator (``take_timeline``, the recorded events at their recorded times). ``--vllm-answers PATH`` keeps
the recording, and replays it without vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.cli.bench.leak_paths import App, Source
from eloquent_plugins.cli.bench.procs import stop_process, wait_healthy
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.sim.timeline import Timeline

TOPICS = ("rivers", "taxes", "a rash", "divorce", "elections", "bitcoin", "vaccines", "a loan", "asylum", "chess",
          "insomnia", "a lawsuit", "pregnancy", "layoffs", "debt", "a protest", "poetry", "surgery", "gambling",
          "weather", "a will", "grief", "salary", "hacking")
HANG_GUARD_S = 300.0
"""The recording client's timeout: a guard against a hung server, never a measurement."""


@dataclass(frozen=True)
class Take:
    """One recorded run of one answer: every SSE event vLLM sent (``data: ...`` and its blank line), when it
    arrived (seconds from the first), and which events carry content."""

    events: tuple[bytes, ...]
    times: tuple[float, ...]
    texts: tuple[str | None, ...]
    """The content each event carries (None: none: the role chunk, the finish chunk, ``[DONE]``)."""


def prompts_for(n: int) -> list[str]:
    return [f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def _content(data: str) -> str | None:
    if not data.startswith("{"):
        return None
    choices = json.loads(data).get("choices") or [{}]
    text = (choices[0].get("delta") or {}).get("content") or choices[0].get("text")
    return text or None


def record(url: str, model: str, prompts: list[str], runs: int, tokens: int, temperature: float,
           progress: Callable[[str], None]) -> list[list[Take]]:
    """``[answer][run]``: each prompt streamed ``runs`` times, run by run, one request at a time."""
    import httpx

    takes: list[list[Take]] = [[] for _ in prompts]
    with httpx.Client(timeout=HANG_GUARD_S) as client:
        for run in range(-1, runs):  # run -1: a warm-up (first-request compilation, caches), not kept
            for answer, prompt in enumerate(prompts if run >= 0 else prompts[:1]):
                body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                                        "temperature": temperature, "messages": [{"role": "user", "content": prompt}]}
                if temperature > 0:
                    body["seed"] = run
                events, times, texts = [], [], []
                parser = SSEParser()
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                    if response.status_code != 200:
                        raise SystemExit(f"vLLM answered {response.status_code}: {response.read()[:300]!r}")
                    for chunk in response.iter_bytes():
                        now = time.monotonic()
                        for message in parser.feed(chunk):
                            events.append(f"data: {message.data}\n\n".encode())
                            times.append(now)
                            texts.append(_content(message.data))
                if run >= 0:
                    takes[answer].append(Take(tuple(events), tuple(t - times[0] for t in times), tuple(texts)))
            if run >= 0:
                progress(f"vllm: run {run + 1} of {runs} recorded")
    return takes


def replay_app(prompts: list[str], takes: list[list[Take]]) -> App:
    """An ASGI app that streams the recorded answer of the request's prompt, each event at its recorded time; the
    n-th request for a prompt gets its run ``n mod runs`` (``observe_sse`` asks run by run)."""
    index = {p: i for i, p in enumerate(prompts)}
    asked: Counter[int] = Counter()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        prompt = json.loads(body)["messages"][0]["content"]
        answer = index.get(prompt, 0)
        take = takes[answer][asked[answer] % len(takes[answer])]
        asked[answer] += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        loop = asyncio.get_running_loop()
        start = loop.time()
        for event, at in zip(take.events, take.times):
            delay = start + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def take_timeline(take: Take) -> Timeline:
    """The recorded run for the simulator: every event before the finish chunk (the role chunk and the events
    whose token decodes to no text too: the front end sends each as a datagram entry), at its time from the
    first; the finish chunk and ``[DONE]`` after them."""
    end = next((i for i, e in enumerate(take.events) if b'"finish_reason":null' not in e), len(take.events))
    if end == 0:
        raise SystemExit("a recorded vLLM answer has no events before its finish chunk")
    t0 = take.times[0]
    return Timeline(tuple(t - t0 for t in take.times[:end]), tuple(t or "" for t in take.texts[:end]),
                    take.events[:end], b"".join(take.events[end:]))


def save(path: str, meta: dict[str, Any], prompts: list[str], takes: list[list[Take]]) -> None:
    with open(path, "w", encoding="utf-8") as fp:
        json.dump({**meta, "prompts": prompts, "takes": [
            [{"events": [e.decode() for e in t.events], "times": list(t.times), "texts": list(t.texts)} for t in runs]
            for runs in takes]}, fp)


def load(path: str) -> tuple[dict[str, Any], list[str], list[list[Take]]]:
    with open(path, encoding="utf-8") as fp:
        data = json.load(fp)
    takes = [[Take(tuple(e.encode() for e in t["events"]), tuple(t["times"]), tuple(t["texts"])) for t in runs]
             for runs in data.pop("takes")]
    return data, data.pop("prompts"), takes


def vllm_source(args: argparse.Namespace, progress: Callable[[str], None]) -> Source:
    """Record (``--vllm``) or load (``--vllm-answers`` alone) the answers; the ``Source`` that replays them."""
    if args.vllm:
        from eloquent_plugins.cli.bench.overhead_vllm import launch_vllm, vllm_python

        extra = ["--dtype", "float32", "--enforce-eager", "--seed", "0", "--max-num-seqs", "4",
                 *shlex.split(args.vllm_args)]
        server = launch_vllm("leak", vllm_python(args.vllm_python), args.vllm, [], extra)
        progress(f"vllm: starting ({server.log})")
        try:
            wait_healthy(server.proc, f"{server.url}/health", timeout=args.vllm_startup_timeout, log_path=server.log,
                         what="vLLM")
            import httpx

            model = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["id"]
            prompts = prompts_for(args.answers)
            takes = record(server.url, model, prompts, args.runs, args.tokens, args.vllm_temperature, progress)
        finally:
            stop_process(server.proc)
        meta = {"model": args.vllm, "served_as": model, "command": server.command,
                "temperature": args.vllm_temperature, "tokens": args.tokens}
        if args.vllm_answers:
            save(args.vllm_answers, meta, prompts, takes)
    else:
        meta, prompts, takes = load(args.vllm_answers)
    texts = [list(take_timeline(runs[0]).texts) for runs in takes]
    distinct = len({tuple(t) for t in texts})
    progress(f"vllm: {len(prompts)} answers ({distinct} different texts), {len(takes[0])} runs each")
    return Source(f"vllm (T={meta['temperature']:g}, {distinct} different texts)", prompts, texts,
                  lambda: replay_app(prompts, takes),
                  lambda run, answer, rng: take_timeline(takes[answer][run % len(takes[answer])]))
