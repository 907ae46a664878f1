"""Issue 18's bounds on the SSE path, part by part: the per-client queue bound (``max_queued_bytes``), the memory
budget's count (frames with their objects, a reserve per stream, the server's unsent bytes through the
``eloquent.socket`` extension) and policy (``max_held_bytes``: finished streams evicted oldest first, then written
history, then the streams of clients we cut that have not resumed, then the clients with most queued cut, then a
503 with ``Retry-After`` for new streams), and the receive relay delivering a disconnect it decided itself to an
app whose own read never returns (a cut client's engine request is aborted). The whole thing under load:
``tests/transports/test_hostile_load.py``."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import httpx

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.request_timeouts import header_timeout_protocol
from eloquent_plugins.transports.resume.memory import MemoryStore
from eloquent_plugins.transports.sse import budget as budget_module
from eloquent_plugins.transports.sse.budget import (
    FRAME_OVERHEAD,
    HIGH_WATER,
    LOW_WATER,
    STREAM_RESERVE,
    StreamBudget,
)
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.socket_control import socket_extension
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.sse.receive import ReceiveRelay
from eloquent_plugins.transports.sse.socket_control import (
    SOCKET_EXTENSION,
    STALLED_SEND_BYTES,
    SocketControl,
    socket_control,
)
from tests.support.servers import UvicornThread
from tests.support.streams import chat_maker, wait_until

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


def exact_budget(limit: int, store: MemoryStore | None, metrics: StreamMetrics, **kw: Any) -> StreamBudget:
    """A budget that counts payload bytes only (no per-frame overhead, no per-stream reserve): exact arithmetic.
    Shedding starts at 75% (``HIGH_WATER``) and frees down to 65% (``LOW_WATER``)."""
    assert (HIGH_WATER, LOW_WATER) == (0.75, 0.65)
    return StreamBudget(limit, store, metrics, frame_overhead=0, stream_reserve=0, **kw)


def reader_at(log: StreamLog, cursor: int, metrics: StreamMetrics) -> Connection:
    return Connection(StuckSend(), LocalSource(META, log), cursor, policy=NO_KEEPALIVE, send_timeout=30.0,
                      metrics=metrics)


class Abandon:
    """A stream's ``abandon`` callback (``Exchange._shed``): records the calls, answers ``give_up``."""

    def __init__(self, give_up: bool = True) -> None:
        self.give_up = give_up
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.give_up


def live_stream(budget: StreamBudget, events: int, at: int, metrics: StreamMetrics, *, size: int = 100,
                abandon: Abandon | None = None) -> tuple[StreamLog, Abandon, Connection]:
    """A resumable live stream of ``events`` frames in ``budget``, with one reader written up to ``at``."""
    log, abandon = StreamLog(), abandon or Abandon()
    frames(log, events, size=size)
    budget.add_stream(log, resumable=True, abandon=abandon)
    conn = reader_at(log, at, metrics)
    budget.add_reader(log, conn)
    return log, abandon, conn


async def test_budget_sheds_finished_then_written_history_then_cut_streams_then_refuses():
    store = MemoryStore()
    metrics = StreamMetrics()
    budget = exact_budget(4000, store, metrics, retry_after=5)
    for token, size in (("old", 1000), ("mid", 1000), ("new", 1000)):
        await store.create(token, META, finished_log(size))
        await store.finish(token)
    assert budget.held() == 3000 and metrics.held is not None and metrics.held() == 3000
    # At 75% of the budget: shed down to 65% (2600): the oldest finished stream goes, the others stay.
    assert budget.enforce() == 2000
    assert await store.open("old") is None
    assert await store.open("mid") is not None and await store.open("new") is not None
    assert store.evicted == 1

    # A live stream read by a client that has been written 1500 of its 2000 bytes.
    live = StreamLog()
    frames(live, 20)
    budget.add_stream(live, resumable=True, abandon=Abandon())
    budget.add_reader(live, reader_at(live, 15, metrics))
    assert budget.held() == 4000
    # Finished streams go first ("mid", then "new"), before anything live is touched.
    assert budget.enforce() == 2000
    assert await store.open("mid") is None and await store.open("new") is None
    assert live.base == 0 and metrics.history_shed_bytes == 0

    # A stream whose client we cut (it did not read), 800 bytes, and one whose client left on its own, 1000 bytes.
    cut, cut_abandon, cut_reader = live_stream(budget, 8, 2, metrics)
    cut_reader.overflow()
    left, left_abandon, left_reader = live_stream(budget, 10, 3, metrics)
    left_reader.disconnect()
    assert budget.held() == 3800
    # Written history is enough this time (1500 freed: 2300 <= 2600): the cut stream is kept.
    assert budget.enforce() == 2300
    assert live.base == 15 and metrics.history_shed_bytes == 1500
    assert cut_abandon.calls == 0 and cut.base == 0 and left.base == 0

    frames(left, 10)  # 3300: no written history left to drop; the cut stream goes, the one whose client left stays
    assert budget.enforce() == 2500
    assert cut_abandon.calls == 1 and not cut.frames and cut.next_index == 8 and metrics.cut_streams_shed == 1
    assert left_abandon.calls == 0 and left.base == 0 and len(left.frames) == 20
    assert budget.admit()  # under the budget

    frames(left, 20)  # 4500 held, nothing more to shed: new streams are refused until some memory is freed
    assert not budget.admit() and metrics.budget_refusals == 1 and budget.retry_after == "5"
    assert cut_abandon.calls == 1 and left_abandon.calls == 0
    budget.remove_stream(left)
    assert budget.admit()
    metrics_text = metrics.render()[0].decode()
    assert "eloquent_sse_cut_streams_shed_total 1.0" in metrics_text


async def test_a_cut_stream_read_again_is_kept():
    """A cut client that resumed (here: a connected reader; elsewhere: ``abandon`` says so) keeps its stream."""
    metrics = StreamMetrics()
    budget = exact_budget(1000, None, metrics)
    # read on another replica (a lease)
    elsewhere, elsewhere_abandon, first = live_stream(budget, 10, 10, metrics, abandon=Abandon(give_up=False))
    first.overflow()
    here, here_abandon, cut = live_stream(budget, 10, 4, metrics)
    cut.overflow()
    budget.add_reader(here, reader_at(here, 4, metrics))  # its resume, reading here
    assert budget.enforce() == 1600  # only the history its resume has been written goes
    # Asked in step 3, and again once the budget was still reached after step 4 (nobody to cut): kept both times.
    assert elsewhere_abandon.calls == 2 and here_abandon.calls == 0 and metrics.cut_streams_shed == 0
    assert len(elsewhere.frames) == 10 and here.base == 4 and len(here.frames) == 6 and not budget.admit()


async def test_at_the_budget_the_clients_with_most_queued_are_cut_and_their_streams_given_up():
    metrics = StreamMetrics()
    budget = exact_budget(30_000, None, metrics)
    # 40 KB queued for a client that has been written nothing, and a client a few events behind (not cut).
    stuck, abandon, conn = live_stream(budget, 200, 0, metrics, size=200)
    reading, reading_abandon, behind = live_stream(budget, 10, 5, metrics)
    assert budget.held() == 41_000
    # Nothing finished, no written history to drop, no cut client: step 4 cuts the reader with the most queued,
    # and since the budget is still reached, its stream goes as in step 3.
    assert budget.enforce() == 500
    assert conn.cut and abandon.calls == 1 and not stuck.frames and metrics.cut_streams_shed == 1
    assert not behind.gone and reading_abandon.calls == 0 and reading.base == 5


def cut_stream(budget: StreamBudget, events: int, metrics: StreamMetrics) -> tuple[StreamLog, Abandon]:
    log, abandon, conn = live_stream(budget, events, 2, metrics)
    conn.overflow()
    return log, abandon


async def test_while_memory_is_tight_a_cut_client_loses_its_stream_at_once():
    metrics = StreamMetrics()
    budget = exact_budget(10_000, None, metrics)
    calm, calm_abandon = cut_stream(budget, 10, metrics)
    budget.client_cut(calm)  # far from the budget: kept for a resume within the grace
    assert calm_abandon.calls == 0 and len(calm.frames) == 10

    queued = StreamLog()  # 7000 bytes queued for a connected client: nothing the budget may drop
    frames(queued, 70)
    budget.add_stream(queued, resumable=False)
    budget.add_reader(queued, reader_at(queued, 0, metrics))
    assert budget.enforce() == 7000  # past 75%: the calm stream's client was cut, so it goes
    assert calm_abandon.calls == 1 and metrics.cut_streams_shed == 1
    budget.remove_stream(queued)
    assert budget.enforce() == 0
    # The budget had to shed moments ago: a client cut now loses its stream at once, though the total is low.
    tight, tight_abandon = cut_stream(budget, 10, metrics)
    budget.client_cut(tight)
    assert tight_abandon.calls == 1 and not tight.frames and metrics.cut_streams_shed == 2


async def test_the_budget_counts_frame_objects_stream_reserves_and_unsent_bytes():
    metrics = StreamMetrics()
    budget = StreamBudget(10 << 20, None, metrics)
    log = StreamLog()
    frames(log, 10)
    aborted: list[bool] = []
    buffered = [5000]
    socket = SocketControl(abort=lambda: aborted.append(True), unsent=lambda: buffered[0])
    conn = Connection(StuckSend(), LocalSource(META, log), 10, policy=NO_KEEPALIVE, send_timeout=30.0,
                      metrics=metrics, socket=socket)
    budget.add_stream(log, resumable=True)
    budget.add_reader(log, conn)
    assert budget.held() == 1000 + 10 * FRAME_OVERHEAD + STREAM_RESERVE + 5000
    assert budget.unsent() == 5000 and metrics.unsent is not None and metrics.unsent() == 5000
    assert "eloquent_sse_bytes_unsent 5000.0" in metrics.render()[0].decode()
    conn.overflow()  # the cut aborts the connection: the server drops what it buffered
    assert aborted == [True] and conn.unsent == 0
    assert budget.held() == 1000 + 10 * FRAME_OVERHEAD + STREAM_RESERVE
    budget.remove_stream(log)
    assert budget.held() == 0


async def test_without_the_socket_extension_a_suspended_send_counts_as_a_full_server_buffer():
    log = StreamLog()
    conn = Connection(StuckSend(), LocalSource(META, log), 0, policy=NO_KEEPALIVE, send_timeout=30.0,
                      metrics=StreamMetrics())
    assert conn.socket is None and conn.unsent == 0
    conn.start()
    frames(log, 1)
    await wait_until(lambda: conn.busy, "the first write is stuck")
    assert conn.unsent == STALLED_SEND_BYTES
    conn.overflow()  # nothing to abort: the connection ends when the app does, as under any server
    assert conn.unsent == 0
    assert await asyncio.wait_for(conn.finished(), 5) == "queue_full"


def test_the_socket_extension_is_read_only_when_well_formed():
    def calls(ext: object) -> dict[str, Any]:
        return {"extensions": {SOCKET_EXTENSION: ext}}

    assert socket_control({}) is None and socket_control({"extensions": None}) is None
    assert socket_control(calls("abort")) is None
    assert socket_control(calls({"abort": lambda: None})) is None
    assert socket_control(calls({"abort": lambda: None, "unsent": 5})) is None
    control = socket_control(calls({"abort": lambda: None, "unsent": lambda: 7}))
    assert control is not None and control.unsent() == 7


async def test_a_cut_client_whose_stream_the_budget_gave_up_gets_410_on_resume_and_its_engine_request_is_aborted():
    """Under ``eloquent serve``'s protocol (the ``eloquent.socket`` extension): a client that never reads is cut
    (it accepts no bytes for ``send_timeout``), its connection aborted, and the budget gives its stream up at once
    instead of after the 30 s grace: the engine request is aborted, and a resume from the last event the client
    got is an honest 410."""
    engine_app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.002))
    # One stream's reserve (48 KiB) is past 75% of a 64 KiB budget: the budget sheds as soon as it may.
    mw = EloquentMiddleware(engine_app, StreamConfig(max_held_bytes=64 << 10, max_queued_bytes=4096,
                                                     resume_grace=30, keepalive=0, send_timeout=1))
    body = json.dumps(chat_maker(max_tokens=4000, prompt="never read")()).encode()
    with UvicornThread(mw, http=header_timeout_protocol(30.0, 16384)) as srv:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        try:
            await wait_until(lambda: engine_app.state.engine.stats().aborted == 1,
                             "the engine request is aborted (long before the 30 s grace)")
            await wait_until(lambda: mw.metrics.aborts == 1, "the stream ends")
            assert mw.metrics.send_timeouts == 1 and mw.metrics.cut_streams_shed == 1
            # The cut aborted the connection: uvicorn holds nothing for it, though the client has read nothing
            # (a plain close would wait for it to drain what the server buffered).
            await wait_until(lambda: not srv.server.server_state.connections, "the server dropped the connection")
            sock.settimeout(10)
            got = b""
            while chunk := sock.recv(65536):  # what the client got before the cut, then the end (no [DONE])
                got += chunk
        finally:
            sock.close()
        ids = re.findall(rb"^id: (\S+)$", got, re.M)
        assert ids and b"[DONE]" not in got
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            resumed = await client.post("/v1/chat/completions", headers={"last-event-id": ids[-1].decode()})
        assert resumed.status_code == 410, resumed.text
        assert resumed.json()["error"]["code"] == "stream_aborted"
        assert engine_app.state.engine.stats().running == 0


async def test_after_shedding_the_memory_of_ended_streams_is_handed_back(monkeypatch: Any) -> None:
    collected: list[int] = []
    monkeypatch.setattr(budget_module.gc, "collect", lambda *a: collected.append(1) or 0)
    metrics = StreamMetrics()
    budget = StreamBudget(10_000, None, metrics, frame_overhead=0, stream_reserve=100)
    trimmed: list[int] = []
    budget._trim = lambda pad: trimmed.append(pad) or 1
    logs = [StreamLog() for _ in range(80)]
    for log in logs:
        budget.add_stream(log, resumable=False)
    for log in logs[:60]:  # 6000 of reserves leave without any pressure: no pause for a collection
        budget.remove_stream(log)
    budget._release()
    assert not collected and not trimmed
    for log in logs[:60]:
        budget.add_stream(log, resumable=False)
    assert budget.enforce() == 8000  # at 75%: the budget sheds (nothing it can drop here)
    for log in logs[:60]:
        budget.remove_stream(log)
    budget._release()
    assert collected == [1] and trimmed == [0]
    budget._release()  # nothing freed since
    assert collected == [1]


async def test_a_private_log_nobody_reads_is_shed_entirely():
    metrics = StreamMetrics()
    budget = exact_budget(1000, None, metrics)
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


async def test_a_closed_tls_connection_holds_nothing_and_raises_nothing() -> None:
    """asyncio's TLS transport, once closed, has no SSL protocol to ask for its buffer: ``get_write_buffer_size``
    raises AttributeError. The budget asks every live stream's connection on each admission and tick, so under
    ``eloquent serve`` with TLS (the fleet test, a rolling restart) a new HTTP/3 request got a 500 and the
    budget's tick died. The extension answers 0 for such a connection."""
    import ssl

    from eloquent_plugins.transports.http3.certs import generate_dev_certificate

    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory() as folder:
        pair = generate_dev_certificate(Path(folder))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(pair.certfile), str(pair.keyfile))
        accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)  # type: ignore[arg-type]

        server = await loop.create_server(Server, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        client_context = ssl.create_default_context()
        client_context.check_hostname, client_context.verify_mode = False, ssl.CERT_NONE
        writer = (await asyncio.open_connection("127.0.0.1", port, ssl=client_context))[1]
        transport = await asyncio.wait_for(accepted, 10)
        extension = socket_extension(transport)
        assert extension["unsent"]() == 0
        transport.close()
        transport.close()  # a second close (an abort after a close does the same) lets go of the SSL protocol
        await asyncio.sleep(0.1)
        writer.close()
        server.close()
        assert extension["unsent"]() == 0, "a closed TLS transport holds nothing"
