"""The clients of ``eloquent bench load``: the per-stream SSE and HTTP/3 slots, the check every stream's text goes
through, and the load processes that hold the slots (one per transport, spawned by :func:`.load.run_load`).

Kept apart from the parent's sampling and reporting so a load process imports only what it runs."""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eloquent_plugins.cli.bench.load_wire import chat_body, content_delta

if TYPE_CHECKING:
    from eloquent_plugins.cli.bench.load_config import LoadConfig

# -- what each load process counts ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    gaps: array = field(default_factory=lambda: array("d"))
    ttfts: array = field(default_factory=lambda: array("d"))
    ttft_at: array = field(default_factory=lambda: array("d"))
    window_gaps: array = field(default_factory=lambda: array("d"))

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, detail[:300])

    def event(self, now: float, last: float | None, start: float) -> None:
        self.events += 1
        if last is None:
            self.ttfts.append(now - start)
            self.ttft_at.append(now)
        else:
            gap = now - last
            self.gaps.append(gap)
            self.window_gaps.append(gap)

    def progress(self, active: int) -> dict[str, Any]:
        gaps, self.window_gaps = self.window_gaps, array("d")
        return {"t": time.monotonic(), "events": self.events, "completed": self.completed, "active": active,
                "errors": sum(self.errors.values()), "window_gaps": gaps.tobytes()}

    def final(self) -> dict[str, Any]:
        return {"final": True, "started": self.started, "completed": self.completed, "cancelled": self.cancelled,
                "events": self.events, "errors": dict(self.errors), "examples": self.examples,
                "gaps": self.gaps.tobytes(), "ttfts": self.ttfts.tobytes(), "ttft_at": self.ttft_at.tobytes()}


# -- SSE load process ----------------------------------------------------------------------------------------------


class _StreamCheck:
    """One stream as a client reads it, SSE or HTTP/3: times each content event, keeps the text, and gives the
    verdict (completed, or which error) into the tally."""

    def __init__(self, tally: Tally) -> None:
        from eloquent_plugins.core.sse_reader import SSEParser

        self.tally = tally
        self.parser = SSEParser()
        self.text: list[str] = []
        self.done = self.failed = False
        self.last: float | None = None
        self.start = time.monotonic()

    def on_piece(self, result: Any, piece: bytes) -> None:
        """``lighthttp``'s body callback: the SSE messages in ``piece``, each timed as it arrives."""
        if result.status != 200:
            return
        for message in self.parser.feed(piece):
            self.on_data(message.data, time.monotonic())

    def on_data(self, data: str, now: float, *, error: bool = False) -> None:
        """One event's data; ``error``: the transport already marked it an in-band error."""
        if not error:
            if data == "[DONE]":
                self.done = True
            if not data or data == "[DONE]":
                return
        delta, in_band = (None, True) if error else content_delta(data)
        if in_band:
            self.failed = True
            self.tally.error("in-band error event", data)
        elif delta:
            self.tally.event(now, self.last, self.start)
            self.last = now
            self.text.append(delta)

    def verdict(self, expected: str, *, need_done: bool) -> None:
        """An in-band error was counted already; else a missing ``[DONE]`` (where the transport sends one) or a
        text other than the non-streamed answer is an error, and anything else a completed stream."""
        text = "".join(self.text)
        if self.failed:
            return
        if need_done and not self.done:
            self.tally.error("stream ended without [DONE]")
        elif text != expected:
            self.tally.error("text differs from the non-streamed answer", text[:200])
        else:
            self.tally.completed += 1


async def _sse_slot(slot: int, cfg: LoadConfig, port: int, expected: dict[str, str], tally: Tally,
                    stop: asyncio.Event, active: list[int]) -> None:
    from eloquent_plugins.cli.bench.lighthttp import Connection, ResponseError

    prompts = list(expected)
    # A stream takes about stream_seconds; read_timeout more than that means it stalled.
    conn = Connection("127.0.0.1", port, timeout=cfg.stream_seconds + cfg.read_timeout)
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    i = 0
    try:
        while not stop.is_set():
            prompt = prompts[(slot + i) % len(prompts)]
            i += 1
            body = json.dumps(chat_body(prompt, cfg.max_tokens, True)).encode()
            tally.started += 1
            active[0] += 1
            check = _StreamCheck(tally)
            refused = False
            try:
                result = await conn.request("POST", "/v1/chat/completions", body, headers, tail=1000,
                                            on_piece=check.on_piece)
                if result.status != 200:
                    tally.error(f"HTTP {result.status}", result.body.decode(errors="replace"))
                    refused = True
                else:
                    check.verdict(expected[prompt], need_done=True)
            except asyncio.CancelledError:
                tally.cancelled += 1
                raise
            except (OSError, TimeoutError, ResponseError, ValueError) as exc:
                tally.error(f"SSE {type(exc).__name__}", str(exc))
                conn.close()
                await asyncio.sleep(0.5)
            finally:
                active[0] -= 1
            if refused:
                await asyncio.sleep(0.5)  # a server refusing (503) is not hammered
    finally:
        conn.close()


# -- HTTP/3 load process -------------------------------------------------------------------------------------------


async def _h3_slot(slot: int, cfg: LoadConfig, client: Any, expected: dict[str, str], tally: Tally,
                   stop: asyncio.Event, active: list[int]) -> None:
    from eloquent_plugins.core.errors import EloquentError

    prompts = list(expected)
    i = 0
    while not stop.is_set():
        prompt = prompts[(slot + i) % len(prompts)]
        i += 1
        tally.started += 1
        active[0] += 1
        check = _StreamCheck(tally)
        try:
            async with client.stream("POST", "/v1/chat/completions",
                                     json=chat_body(prompt, cfg.max_tokens, True)) as resp:
                async for event in resp.events():
                    check.on_data(event.data, event.rendered_at, error=event.kind == "error")
            # The reliable trailer (event count + digest) proves completeness here: no [DONE] needed.
            check.verdict(expected[prompt], need_done=False)
        except asyncio.CancelledError:
            tally.cancelled += 1
            raise
        except (EloquentError, OSError, TimeoutError, ValueError) as exc:
            tally.error(f"HTTP/3 {type(exc).__name__}", str(exc))
            await asyncio.sleep(0.5)
        finally:
            active[0] -= 1


# -- one load process ----------------------------------------------------------------------------------------------


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def load_process(kind: str, cfg: LoadConfig, port: int, udp_port: int, expected: dict[str, str], pipe: Any) -> None:
    """Entry of a load process: hold the slots (``kind`` ``sse`` or ``h3``) or the hostile mix (``hostile``, see
    :mod:`.load_hostile`) until the parent says stop, reporting progress on ``pipe``."""
    raise_nofile()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tells us to stop
    if kind == "hostile":
        from eloquent_plugins.cli.bench.load_hostile import hostile_main

        asyncio.run(hostile_main(cfg, port, udp_port, expected, pipe))
    else:
        asyncio.run(_worker_main(kind, cfg, port, udp_port, expected, pipe))


async def _worker_main(kind: str, cfg: LoadConfig, port: int, udp_port: int, expected: dict[str, str],
                       pipe: Any) -> None:
    loop = asyncio.get_running_loop()
    tally = Tally()
    stop = asyncio.Event()
    active = [0]
    loop.add_reader(pipe.fileno(), stop.set)  # any message from the parent means stop
    n = cfg.sse_streams if kind == "sse" else cfg.h3_streams
    clients: list[Any] = []

    async def slot(i: int) -> None:
        await asyncio.sleep(cfg.ramp * i / max(1, n))
        if kind == "sse":
            await _sse_slot(i, cfg, port, expected, tally, stop, active)
        else:
            await _h3_slot(i, cfg, clients[i % len(clients)], expected, tally, stop, active)

    if kind == "h3":
        from eloquent_client import EloquentClient

        clients = [EloquentClient(f"https://127.0.0.1:{udp_port}", transport="eloquent", verify=False,
                                  timeout=cfg.read_timeout) for _ in range(max(1, min(cfg.h3_connections, n)))]

    async def report() -> None:
        while True:
            await asyncio.sleep(cfg.sample_interval)
            pipe.send(tally.progress(active[0]))

    tasks = [asyncio.create_task(slot(i)) for i in range(n)]
    reporter = asyncio.create_task(report())
    await stop.wait()
    loop.remove_reader(pipe.fileno())
    reporter.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, reporter, return_exceptions=True)
    for client in clients:
        try:
            await asyncio.wait_for(client.aclose(), 5)
        except Exception as exc:  # noqa: BLE001 - closing at the end must not lose the figures
            print(f"closing an HTTP/3 client: {exc!r}", file=sys.stderr)
    pipe.send(tally.final())
