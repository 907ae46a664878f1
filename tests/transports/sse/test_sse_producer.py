"""The SSE path's per-event fast paths log and write exactly what the general paths do.

Why pinned: for a caught-up client, ``EventPath.write`` logs a one-``data:``-line chunk inline (the event
path's ``add`` and the log's ``append`` written out, its id line from a table for the first 4096 events)
and writes it in the app's task: a copy of slower code, kept for speed.
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


def make_producer(*, observer: Observer | None, token: str | None = TOKEN, cls: type[Producer] = Producer
                  ) -> tuple[Producer, StreamLog, StreamMetrics]:
    pm = create_plugin_manager(load_entry_points=False, plugins=[observer] if observer is not None else [])
    hooks = StreamHooks(pm, StreamInfo("s-1", route="/v1/chat/completions", codec="openai"))
    times = iter([0.001 * i * i for i in range(EVENTS + 1)])  # every gap differs, each larger than the last
    log, metrics = StreamLog(), StreamMetrics()
    producer = cls(log, token=token, hooks=hooks, codec=next(iter(codecs(pm).values())), metrics=metrics,
                   started=0.0, clock=lambda: next(times))
    return producer, log, metrics


def produce(*, observer: Observer | None, token: str | None = TOKEN) -> tuple[Producer, StreamLog, StreamMetrics]:
    producer, log, metrics = make_producer(observer=observer, token=token)
    for body in chunks():
        producer.feed(body)
    producer.close("complete")
    return producer, log, metrics


class CountingProducer(Producer):
    """Counts ``feed`` calls: the connection's inline path logs an event without one."""

    __slots__ = ("fed",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fed = 0

    def feed(self, body: bytes) -> None:
        self.fed += 1
        super().feed(body)


class Client:
    """The server's ``send``: what reached the client."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.writes.append(message.get("body", b""))


def connect(producer: Producer, log: StreamLog, metrics: StreamMetrics, client: Client) -> Connection:
    """A connection on the producer's log, its event path attached (as ``Exchange`` does); call in the loop."""
    conn = Connection(client, LocalSource(StreamMeta("s-1", "", 200, ()), log), 0, policy=KeepAlivePolicy(0),
                      send_timeout=0, metrics=metrics)
    producer.path.attach(conn, producer.feed)
    return conn


async def stream_to_a_caught_up_client() -> tuple[CountingProducer, StreamLog, StreamMetrics, Client]:
    producer, log, metrics = make_producer(observer=None, cls=CountingProducer)
    client = Client()
    conn = connect(producer, log, metrics, client)
    task = conn.start()
    await asyncio.sleep(0)  # the connection's task now waits, caught up
    for body in chunks():
        await producer.path.write(body)
    producer.close("complete")
    assert await asyncio.wait_for(task, 5) == "complete"
    assert isinstance(producer, CountingProducer)
    return producer, log, metrics, client


def figures(producer: Producer, metrics: StreamMetrics) -> dict[str, Any]:
    latency = metrics.latency_for("sse")
    return {**producer.figures(), "max_gap": producer.max_gap, "events": metrics.events,
            "gap_counts": list(latency.gap.counts), "gap_sum": latency.gap.sum, "ttft": list(latency.ttft.counts),
            "tpot": list(latency.tpot.counts)}


async def test_the_inline_path_logs_and_writes_what_the_general_path_does() -> None:
    observer = Observer()
    fast, fast_log, fast_metrics, client = await stream_to_a_caught_up_client()
    general, general_log, general_metrics = produce(observer=observer)
    assert observer.seen == EVENTS  # the general path really ran for every event
    assert fast.fed == 2  # only the first event and the event: one went through feed; the rest were inline
    assert fast_log.frames == general_log.frames
    assert client.writes == [*general_log.frames, b""]  # each event written once, in the app's task, then the end
    assert fast_metrics.writes == EVENTS and fast_metrics.bytes_sent == sum(map(len, general_log.frames))
    assert figures(fast, fast_metrics) == figures(general, general_metrics)
    assert fast_metrics.latency_for("sse").gap.sum == pytest.approx(0.001 * (EVENTS - 1) ** 2)
    for i in (0, 1, 9, 11, 4095, 4096, 4097, EVENTS - 1):
        assert fast_log.frames[i] == b"id: %s\ndata: {\"n\":%d}\n\n" % (format_event_id(TOKEN, i).encode(), i)
    assert fast_log.frames[10] == b"id: %s\nevent: note\ndata: x\n\n" % format_event_id(TOKEN, 10).encode()


async def test_the_inline_path_trims_the_log_as_append_does() -> None:
    producer, log, metrics = make_producer(observer=None)
    log.max_events = 64
    client = Client()
    conn = connect(producer, log, metrics, client)
    task = conn.start()
    await asyncio.sleep(0)
    for i in range(200):
        await producer.path.write(b"data: %d\n\n" % i)
    assert log.next_index == 200 and len(log.frames) <= 64 and log.base == 200 - len(log.frames)
    assert log.nbytes == sum(map(len, log.frames)) and log.appended == sum(map(len, client.writes))
    producer.close("complete")
    assert await asyncio.wait_for(task, 5) == "complete"
    assert [w.split(b"\n")[1] for w in client.writes[:-1]] == [b"data: %d" % i for i in range(200)]


def test_without_a_token_the_app_chunks_are_logged_as_they_came() -> None:
    _, log, metrics = produce(observer=None, token=None)
    assert log.frames == list(chunks())
    assert metrics.events == EVENTS


class FailingProducer(Producer):
    """Raises after logging a chunk that names ``fail`` (as a plugin failing after the append would)."""

    def feed(self, body: bytes) -> None:
        super().feed(body)
        if b"fail" in body:
            raise RuntimeError("a plugin failed after the append")


async def test_a_failure_while_appending_on_the_direct_path_leaves_the_connection_writing() -> None:
    producer, log, metrics = make_producer(observer=None, token=None, cls=FailingProducer)
    client = Client()
    conn = connect(producer, log, metrics, client)
    task = conn.start()
    await asyncio.sleep(0)  # the connection's task is now waiting, caught up
    await producer.path.write(b"data: a\n\n")
    assert client.writes == [b"data: a\n\n"]  # written by this task
    with pytest.raises(RuntimeError):
        await producer.path.write(b"data: fail\n\n")
    assert not conn.busy
    for _ in range(3):
        await asyncio.sleep(0)
    assert client.writes == [b"data: a\n\n", b"data: fail\n\n"]  # the connection's own task wrote it
    await producer.path.write(b"data: c\n\n")  # and the direct path works again
    producer.close("complete")
    assert await asyncio.wait_for(task, 5) == "complete"
    assert client.writes == [b"data: a\n\n", b"data: fail\n\n", b"data: c\n\n", b""]
