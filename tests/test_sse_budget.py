"""Issue 18's bounds on the SSE path, part by part: the per-client queue bound (``max_queued_bytes``), the memory
budget's policy (``max_held_bytes``: finished streams evicted oldest first, then written history, then a 503 with
``Retry-After`` for new streams), and the receive relay delivering a disconnect it decided itself to an app whose
own read never returns (a cut client's engine request is aborted). The whole thing under load:
``tests/test_hostile_load.py``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.resume.memory import MemoryStore
from eloquent_plugins.transports.sse.budget import StreamBudget
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.sse.receive import ReceiveRelay
from tests.support.streams import wait_until

META = StreamMeta("s-1", "", 200, ())
NO_KEEPALIVE = KeepAlivePolicy(interval=0.0)


def frames(log: StreamLog, count: int, size: int = 100) -> None:
    for i in range(count):
        log.append(b"data: " + bytes([97 + i % 26]) * (size - 8) + b"\n\n")


class StuckSend:
    """A client whose kernel buffers are full: the first body write never completes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.writes.append(message.get("body", b""))
            await asyncio.Event().wait()


async def test_a_client_with_more_than_max_queued_bytes_waiting_is_cut():
    log = StreamLog()
    metrics = StreamMetrics()
    send = StuckSend()
    conn = Connection(send, LocalSource(META, log), 0, policy=NO_KEEPALIVE, send_timeout=30.0, metrics=metrics,
                      max_queued=1000)
    conn.start()
    frames(log, 1)
    await wait_until(lambda: conn.busy, "the first write is stuck")
    frames(log, 9)
    assert conn.queued == 900 and not conn.gone  # under the bound: waiting is fine
    frames(log, 2)
    assert conn.queued == 1100
    reason = await asyncio.wait_for(conn.finished(), 5)  # the tick (1 s) notices, long before send_timeout
    assert reason == "queue_full" and conn.cut and metrics.clients_cut == 1 and metrics.send_timeouts == 0
    assert len(send.writes) == 1


async def test_a_resume_that_starts_far_behind_is_not_cut_for_its_backlog():
    log = StreamLog()
    frames(log, 50)  # 5000 bytes before the resume point
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    conn = Connection(send, LocalSource(META, log), 0, policy=NO_KEEPALIVE, send_timeout=30.0,
                      metrics=StreamMetrics(), max_queued=1000)
    assert conn.queued == 5000
    conn.start()
    await wait_until(lambda: conn.queued == 0, "the backlog goes out in one write")
    log.close("complete")
    assert await asyncio.wait_for(conn.finished(), 5) == "complete"
    assert b"".join(sent) == b"".join(log.frames)


async def test_offsets_count_log_bytes_when_merging():
    log = StreamLog()
    frames(log, 3)
    conn = Connection(StuckSend(), LocalSource(META, log), 1, policy=NO_KEEPALIVE, send_timeout=30.0,
                      metrics=StreamMetrics())
    assert conn.offset == 100 and log.offset(3) == log.appended == 300


def finished_log(size: int) -> StreamLog:
    log = StreamLog()
    frames(log, size // 100)
    log.close("complete")
    return log


async def test_budget_evicts_finished_streams_oldest_first_then_written_history_then_refuses():
    store = MemoryStore()
    metrics = StreamMetrics()
    budget = StreamBudget(3000, store, metrics, retry_after=5)
    for token, size in (("old", 1000), ("mid", 1000), ("new", 1000)):
        await store.create(token, META, finished_log(size))
        await store.finish(token)
    assert budget.held() == 3000 and metrics.held is not None and metrics.held() == 3000
    # At the budget: shed down to 90% (2700): the oldest finished stream goes, the others stay; then admitted.
    assert budget.admit()
    assert await store.open("old") is None
    assert await store.open("mid") is not None and await store.open("new") is not None
    assert budget.held() == 2000 and store.evicted == 1

    # A live stream read by a client that has been written 1500 of its 2000 bytes.
    live = StreamLog()
    frames(live, 20)
    budget.add_stream(live, resumable=True)
    reader = Connection(StuckSend(), LocalSource(META, live), 15, policy=NO_KEEPALIVE, send_timeout=30.0,
                        metrics=metrics)
    budget.add_reader(live, reader)
    assert budget.held() == 4000
    # Finished streams go first ("mid", then "new"), before anything live is touched.
    assert budget.enforce() <= 2700
    assert await store.open("mid") is None and await store.open("new") is None
    assert live.base == 0 and budget.held() == 2000 and metrics.history_shed_bytes == 0

    # Another live stream whose client left (resumable: kept for a resume), 2000 bytes: over the budget again.
    left = StreamLog()
    frames(left, 20)
    budget.add_stream(left, resumable=True)
    assert budget.held() == 4000
    budget.enforce()
    # Nothing finished is left: the written history of the read stream goes (up to its reader's cursor), the
    # stream nobody reads keeps everything a resume needs.
    assert live.base == 15 and metrics.history_shed_bytes == 1500 and left.base == 0
    assert budget.held() == 2500
    assert budget.admit()  # under the budget now

    frames(left, 10)  # 3500 held, nothing more to shed: new streams are refused
    assert not budget.admit() and metrics.budget_refusals == 1 and budget.retry_after == "5"
    budget.remove_stream(left)
    assert budget.admit()


async def test_a_private_log_nobody_reads_is_shed_entirely():
    metrics = StreamMetrics()
    budget = StreamBudget(1000, None, metrics)
    private = StreamLog()
    frames(private, 20)
    budget.add_stream(private, resumable=False)
    assert budget.enforce() == 0 and private.next_index == 20 and not private.frames


def sse_app(events: int) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(events):
            await send({"type": "http.response.body", "body": b"data: %d %s\n\n" % (i, b"x" * 90),
                        "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass

    return app


async def test_over_the_budget_a_new_stream_gets_503_with_retry_after_and_the_app_stops():
    mw = EloquentMiddleware(sse_app(40), StreamConfig(max_held_bytes=2000, resume_grace=30, keepalive=0))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}
    first_gone = asyncio.Event()
    first_sent: list[dict[str, Any]] = []

    async def first_receive() -> dict[str, Any]:
        if not first_sent:
            first_sent.append({})
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await first_gone.wait()
        return {"type": "http.disconnect"}

    async def first_send(message: dict[str, Any]) -> None:
        first_sent.append(message)

    first = asyncio.create_task(mw(dict(scope), first_receive, first_send))
    await wait_until(lambda: mw.budget.held() >= 4000, "the first stream holds 40 events")
    first_gone.set()  # its client leaves: the stream is kept for a resume (grace 30 s), nothing to shed
    await wait_until(lambda: not mw.budget.reading(next(iter(mw.budget.live))), "the reader is gone")

    replies: list[dict[str, Any]] = []
    second_receives = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def second_receive() -> dict[str, Any]:
        if second_receives:
            return second_receives.pop()
        await asyncio.Event().wait()
        raise AssertionError

    async def second_send(message: dict[str, Any]) -> None:
        replies.append(message)

    await asyncio.wait_for(mw(dict(scope), second_receive, second_send), 5)  # the app saw its client gone
    start, body = replies[0], replies[1]
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"30"
    error = json.loads(body["body"])["error"]
    assert error["code"] == "server_overloaded" and "memory budget" in error["message"]
    assert mw.metrics.budget_refusals == 1
    metrics = mw.metrics.render()[0].decode()
    assert "eloquent_sse_budget_refusals_total 1.0" in metrics and "eloquent_sse_bytes_held " in metrics
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_disconnect_the_relay_decides_reaches_an_app_blocked_in_its_own_read():
    """A cut client (send timeout, queue bound) never sends ``http.disconnect`` itself; the app's ``receive`` is
    parked in the server's. Releasing the held stream must still show the app its client gone."""
    never = asyncio.Event()
    reads = 0

    async def server_receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        if reads == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await never.wait()
        raise AssertionError

    relay = ReceiveRelay(server_receive)
    assert (await relay.receive())["type"] == "http.request"
    waiting = asyncio.create_task(relay.receive())  # the app listens for the disconnect
    await asyncio.sleep(0.01)
    relay.hold()
    relay.disconnect()  # the middleware cut the client
    await asyncio.sleep(0.01)
    assert not waiting.done()  # held: the stream may still be resumed
    relay.release()  # abandoned
    assert (await asyncio.wait_for(waiting, 1))["type"] == "http.disconnect"
    relay.close()


def test_the_bounds_are_settings_with_env_variables():
    import pytest

    from eloquent_plugins.core.errors import ConfigError

    default = StreamConfig()
    assert (default.max_queued_bytes, default.max_held_bytes, default.socket_send_buffer) == (1 << 20, 512 << 20,
                                                                                               128 << 10)
    cfg = StreamConfig.from_env({"ELOQUENT_MAX_QUEUED_BYTES": "4096", "ELOQUENT_MAX_HELD_BYTES": "0",
                                 "ELOQUENT_SOCKET_SEND_BUFFER": "16384"})
    assert (cfg.max_queued_bytes, cfg.max_held_bytes, cfg.socket_send_buffer) == (4096, 0, 16384)
    for name, raw in (("MAX_QUEUED_BYTES", "-1"), ("MAX_HELD_BYTES", "lots"), ("SOCKET_SEND_BUFFER", "1.5")):
        with pytest.raises(ConfigError):
            StreamConfig.from_env({f"ELOQUENT_{name}": raw})
