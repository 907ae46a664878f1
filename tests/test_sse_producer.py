"""The SSE path's per-event fast paths log and write exactly what the general paths do.

Why pinned: the producer logs a one-``data:``-line chunk inline (its id line from a table for the first 4096
events) and the connection writes it in the producer's task; both are copies of slower code, kept for speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.core.hooks.manager import StreamHooks, codecs, create_plugin_manager
from eloquent_plugins.core.hooks.specs import StreamInfo, hookimpl
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.protocol import format_event_id
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.producer import Producer

TOKEN = "tok3n"
EVENTS = 4100  # past the producer's table of id lines


class Observer:
    """A plugin that sees every event: the producer then takes its general path for each one."""

    def __init__(self) -> None:
        self.seen = 0

    @hookimpl
    def eloquent_stream_event(self, stream: StreamInfo, event: StreamEvent) -> None:
        self.seen += 1


def chunks() -> Iterator[bytes]:
    for i in range(EVENTS):
        if i == 10:
            yield b"event: note\ndata: x\n\n"  # not one data line: the parser's path, mid-stream
        else:
            yield b'data: {"n":%d}\n\n' % i


def produce(*, observer: Observer | None, token: str | None = TOKEN) -> tuple[Producer, StreamLog, StreamMetrics]:
    pm = create_plugin_manager(load_entry_points=False, plugins=[observer] if observer is not None else [])
    hooks = StreamHooks(pm, StreamInfo("s-1", route="/v1/chat/completions", codec="openai"))
    times = iter([0.001 * i * i for i in range(EVENTS + 1)])  # every gap differs, each larger than the last
    log, metrics = StreamLog(), StreamMetrics()
    producer = Producer(log, token=token, hooks=hooks, codec=next(iter(codecs(pm).values())), metrics=metrics,
                        started=0.0, clock=lambda: next(times))
    for body in chunks():
        producer.feed(body)
    producer.close("complete")
    return producer, log, metrics


def figures(producer: Producer, metrics: StreamMetrics) -> dict[str, Any]:
    return {**producer.figures(), "max_gap": producer.max_gap, "events": metrics.events,
            "gap_counts": list(metrics.gap.counts), "gap_sum": metrics.gap.sum, "ttft": list(metrics.ttft.counts),
            "tpot": list(metrics.tpot.counts)}


def test_the_fast_path_logs_the_same_frames_and_figures_as_the_general_path() -> None:
    observer = Observer()
    fast, fast_log, fast_metrics = produce(observer=None)
    general, general_log, general_metrics = produce(observer=observer)
    assert observer.seen == EVENTS  # the general path really ran for every event
    assert fast_log.frames == general_log.frames
    assert figures(fast, fast_metrics) == figures(general, general_metrics)
    assert fast_metrics.gap.sum == pytest.approx(0.001 * (EVENTS - 1) ** 2)
    for i in (0, 1, 9, 11, 4095, 4096, 4097, EVENTS - 1):
        assert fast_log.frames[i] == b"id: %s\ndata: {\"n\":%d}\n\n" % (format_event_id(TOKEN, i).encode(), i)
    assert fast_log.frames[10] == b"id: %s\nevent: note\ndata: x\n\n" % format_event_id(TOKEN, 10).encode()


def test_without_a_token_the_app_chunks_are_logged_as_they_came() -> None:
    _, log, metrics = produce(observer=None, token=None)
    assert log.frames == list(chunks())
    assert metrics.events == EVENTS


async def test_a_failure_while_appending_on_the_direct_path_leaves_the_connection_writing() -> None:
    log = StreamLog()
    writes: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            writes.append(message.get("body", b""))

    conn = Connection(send, LocalSource(StreamMeta("s-1", "", 200, ()), log), 0, policy=KeepAlivePolicy(0),
                      send_timeout=0, metrics=StreamMetrics())
    task = conn.start()
    await asyncio.sleep(0)  # the connection's task is now waiting, caught up
    assert await conn.write_direct(log.append, b"a") is True
    assert writes == [b"a"]  # written by this task

    def failing(body: bytes) -> None:
        log.append(body)
        raise RuntimeError("a plugin failed after the append")

    with pytest.raises(RuntimeError):
        await conn.write_direct(failing, b"b")
    assert not conn.busy
    for _ in range(3):
        await asyncio.sleep(0)
    assert writes == [b"a", b"b"]  # the connection's own task wrote what was appended, without a later append
    assert await conn.write_direct(log.append, b"c") is True  # and the direct path works again
    log.close("complete")
    assert await asyncio.wait_for(task, 5) == "complete"
    assert writes == [b"a", b"b", b"c", b""]
