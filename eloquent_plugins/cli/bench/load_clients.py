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


MAX_RESUMES = 8
"""Cuts one stream may survive under rolling restarts (``--restart-every``) before it counts as lost."""


@dataclass(slots=True)
class Tally:
    """What one load process counts. Every started stream ends as exactly one of completed (text exact), refused
    (its first request not answered 200), lost (cut for good, or a wrong text) or cancelled (still running when the
    run ended); ``migrated`` counts the completed ones that were cut and resumed on another replica."""

    started: int = 0
    completed: int = 0
    cancelled: int = 0
    refused: int = 0
    lost: int = 0
    migrated: int = 0
    events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    gaps: array = field(default_factory=lambda: array("d"))
    ttfts: array = field(default_factory=lambda: array("d"))
    ttft_at: array = field(default_factory=lambda: array("d"))
    window_gaps: array = field(default_factory=lambda: array("d"))
    splice_gaps: array = field(default_factory=lambda: array("d"))
    """Per resume: seconds from the last event before the cut to the first one after it (not in ``gaps``)."""
    seconds_migrated: array = field(default_factory=lambda: array("d"))
    seconds_unmigrated: array = field(default_factory=lambda: array("d"))
    """Whole-stream seconds (request to last event) of completed streams, migrated or not."""

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, detail[:300])

    def event(self, now: float, last: float | None, start: float, *, splice: bool = False) -> None:
        self.events += 1
        if last is None:
            self.ttfts.append(now - start)
            self.ttft_at.append(now)
        elif splice:
            self.splice_gaps.append(now - last)
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
                "refused": self.refused, "lost": self.lost, "migrated": self.migrated,
                "events": self.events, "errors": dict(self.errors), "examples": self.examples,
                "gaps": self.gaps.tobytes(), "ttfts": self.ttfts.tobytes(), "ttft_at": self.ttft_at.tobytes(),
                "splice_gaps": self.splice_gaps.tobytes(), "seconds_migrated": self.seconds_migrated.tobytes(),
                "seconds_unmigrated": self.seconds_unmigrated.tobytes()}


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
        self.last_id: str | None = None
        self.resumes = 0
        self._splice = False
        self.start = time.monotonic()

    def cut(self) -> None:
        """The stream was cut and is being resumed: a fresh parser (the replay starts after ``last_id``), and the
        next content event's gap is the splice's."""
        from eloquent_plugins.core.sse_reader import SSEParser

        self.parser = SSEParser()
        self.resumes += 1
        self._splice = self.last is not None

    def on_piece(self, result: Any, piece: bytes) -> None:
        """``lighthttp``'s body callback: the SSE messages in ``piece``, each timed as it arrives."""
        if result.status != 200:
            return
        for message in self.parser.feed(piece):
            self.last_id = message.id or self.last_id
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
            self.tally.event(now, self.last, self.start, splice=self._splice)
            self._splice = False
            self.last = now
            self.text.append(delta)

    def verdict(self, expected: str, *, need_done: bool) -> None:
        """An in-band error was counted already; else a missing ``[DONE]`` (where the transport sends one) or a
        text other than the non-streamed answer is an error, and anything else a completed stream."""
        text = "".join(self.text)
        if self.failed:
            self.tally.lost += 1
            return
        if need_done and not self.done:
            self.lost("stream ended without [DONE]")
        elif text != expected:
            self.lost("text differs from the non-streamed answer", text[:200])
        else:
            self.tally.completed += 1
            took = (self.last or time.monotonic()) - self.start
            if self.resumes:
                self.tally.migrated += 1
                self.tally.seconds_migrated.append(took)
            else:
                self.tally.seconds_unmigrated.append(took)

    def lost(self, kind: str, detail: str = "") -> None:
        self.tally.error(kind, detail)
        self.tally.lost += 1


async def _sse_slot(slot: int, cfg: LoadConfig, port: int, expected: dict[str, str], tally: Tally,
                    stop: asyncio.Event, active: list[int]) -> None:
    """One slot's streams, one after the other. Under rolling restarts a stream cut mid-way (the body ends, or
    the connection drops, before ``[DONE]``) is resumed with ``Last-Event-ID``, as a browser's EventSource would;
    with one server a cut is an error."""
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
            pause = False
            try:
                while True:
                    sent = headers if check.last_id is None else {**headers, "last-event-id": check.last_id}
                    resumable = cfg.fleet and check.resumes < MAX_RESUMES
                    try:
                        result = await conn.request("POST", "/v1/chat/completions", body, sent, tail=1000,
                                                    on_piece=check.on_piece)
                    except (OSError, TimeoutError, ResponseError, ValueError) as exc:
                        conn.close()
                        if resumable and check.last_id is not None and not check.done:
                            check.cut()
                            continue
                        check.lost(f"SSE {type(exc).__name__}", str(exc))
                        pause = True
                        break
                    if result.status != 200:
                        tally.error(f"HTTP {result.status}", result.body.decode(errors="replace"))
                        if check.resumes:
                            tally.lost += 1
                        else:
                            tally.refused += 1
                        pause = True  # a server refusing (503) is not hammered
                    elif resumable and check.last_id is not None and not check.done:
                        check.cut()  # the body ended cleanly before [DONE]: handed over by a draining replica
                        continue
                    else:
                        check.verdict(expected[prompt], need_done=True)
                    break
            except asyncio.CancelledError:
                tally.cancelled += 1
                raise
            finally:
                active[0] -= 1
            if pause:
                await asyncio.sleep(0.5)
    finally:
        conn.close()


# -- HTTP/3 load process -------------------------------------------------------------------------------------------


async def _h3_slot(slot: int, cfg: LoadConfig, client: Any, expected: dict[str, str], tally: Tally,
                   stop: asyncio.Event, active: list[int]) -> None:
    """One slot's streams over HTTP/3 datagrams; the client resumes a cut stream itself (``resumes``)."""
    from eloquent_client import HTTPStatusError

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
                    if resp.resumes != check.resumes:  # the first event after a resume: the splice
                        check.cut()
                        check.resumes = resp.resumes
                    check.on_data(event.data, event.rendered_at, error=event.kind == "error")
            # The reliable trailer (event count + digest) proves completeness here: no [DONE] needed.
            check.verdict(expected[prompt], need_done=False)
        except asyncio.CancelledError:
            tally.cancelled += 1
            raise
        except HTTPStatusError as exc:
            tally.error(f"HTTP/3 HTTP {exc.status}", str(exc))
            if check.last is None:
                tally.refused += 1
            else:
                tally.lost += 1
            await asyncio.sleep(0.5)
        except (EloquentError, OSError, TimeoutError, ValueError) as exc:
            check.lost(f"HTTP/3 {type(exc).__name__}", str(exc))
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
