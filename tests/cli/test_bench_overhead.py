"""``eloquent bench overhead`` against live servers: the light HTTP client (framing, keep-alive, first-token
timing, the stream's tail) and the interleaved measurement (modes, the middleware bypass, per-round ratios),
against real sockets and real uvicorn servers; CPU per token from /proc and the ``--vllm`` measurement (its quick
run on real vLLM servers is marked ``vllm``). Correctness only: no timing assertions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eloquent_plugins.cli.bench import cpu, lighthttp
from eloquent_plugins.cli.bench import overhead_live as live
from eloquent_plugins.cli.bench import overhead_request as req
from eloquent_plugins.cli.bench import overhead_vllm as ov
from eloquent_plugins.cli.bench.overhead import main
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.servers import UvicornThread

MODEL = "eloquent-builtin"
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


def _engine() -> object:
    return create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[UvicornThread, UvicornThread]]:
    """The built-in engine behind our middleware, and bare."""
    with UvicornThread(EloquentMiddleware(_engine(), StreamConfig(keepalive=15.0))) as mw, \
            UvicornThread(_engine()) as bare:
        yield mw, bare


@contextlib.asynccontextmanager
async def _raw_server(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                      ) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
    return head + await reader.readexactly(length)


# -- the client's framing, against a socket server that writes bytes by hand ----------------------------------


async def test_chunked_body_split_anywhere_with_extensions_and_trailers() -> None:
    """A chunked response written a few bytes at a time, cut across sizes, CRLFs and data, with a chunk
    extension and a trailer, decodes to the exact body; the connection is kept for a second request."""
    events = [b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
              b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
              b"data: {\"choices\":[],\"usage\":{\"completion_tokens\": 7}}\n\n", b"data: [DONE]\n\n"]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nx-trailer: 1\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    requests_seen = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            requests_seen.append(await _read_request(reader))
            data = head + wire
            for i in range(0, len(data), 5):  # 5-byte writes, each flushed: the client sees many small reads
                writer.write(data[i:i + 5])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    async with _raw_server(handler) as port:
        conn = lighthttp.Connection("127.0.0.1", port, timeout=10)
        first = await conn.request("POST", CHAT, b'{"a":1}', JSON, tail=4096, first=req.CONTENT_RE)
        protocol = conn._protocol
        whole = await conn.request("POST", CHAT, b'{"b":2}', JSON)
        assert conn._protocol is protocol and conn.is_open  # the same keep-alive connection
        conn.close()
    assert first.status == 200 and first.headers["transfer-encoding"] == "chunked"
    assert whole.body == b"".join(events) and first.body == b"".join(events)  # shorter than the tail kept
    assert first.body_bytes == len(whole.body) and first.pieces > 4
    assert first.first_s is not None and first.first_s >= 0
    assert b'"content":"Hi"' in first.prefix  # the body up to the first non-empty content...
    assert b"usage" not in first.prefix  # ...and not beyond the piece where it matched
    assert req.completion_tokens_from_tail(first.body) == 7
    assert requests_seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert requests_seen[0].endswith(b'content-type: application/json\r\n\r\n{"a":1}')
    assert b"content-length: 7\r\n" in requests_seen[1]


async def test_tail_keeps_only_the_last_bytes_of_a_long_stream() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(3000)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for p in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(p), p))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with _raw_server(handler) as port:
        conn = lighthttp.Connection("127.0.0.1", port, timeout=10)
        result = await conn.request("POST", "/", b"", tail=100)
        conn.close()
    assert result.body == b"".join(pieces)[-100:]
    assert result.body_bytes == sum(map(len, pieces))


@pytest.mark.parametrize("framing", ["content-length", "close"])
async def test_content_length_and_read_to_close_bodies(framing: str) -> None:
    body = json.dumps({"usage": {"completion_tokens": 3}}).encode()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        length = b"content-length: %d\r\n" % len(body) if framing == "content-length" else b""
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + length + b"\r\n")
        for i in range(0, len(body), 7):
            writer.write(body[i:i + 7])
            await writer.drain()
        if framing == "content-length":
            await reader.read()  # keep the connection until the client closes it
        writer.close()

    async with _raw_server(handler) as port:
        conn = lighthttp.Connection("127.0.0.1", port, timeout=10)
        result = await conn.request("POST", "/", b"{}")
        open_after = conn.is_open
        conn.close()
    assert result.body == body and result.status == 200
    assert result.keep_alive is (framing == "content-length") and open_after is (framing == "content-length")


@pytest.mark.parametrize("wire, message", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY", "not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", "closed inside the body"),
    (b"SPDY/3 200 OK\r\n\r\n", "bad status line"),
    (b"", "closed before the response head"),
])
async def test_malformed_or_truncated_responses_raise(wire: bytes, message: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(wire)
        await writer.drain()
        writer.close()

    async with _raw_server(handler) as port:
        conn = lighthttp.Connection("127.0.0.1", port, timeout=10)
        with pytest.raises(lighthttp.ResponseError, match=message):
            await conn.request("POST", "/", b"")
        assert not conn.is_open


# -- against the built-in engine served by uvicorn -------------------------------------------------------------


async def test_stream_and_whole_answer_from_the_engine(servers: tuple[UvicornThread, UvicornThread]) -> None:
    """uvicorn's chunked stream and Content-Length answer: the tail has [DONE] and the usage, the first token
    is timed, and the streamed text's token count is what the non-streamed answer reports."""
    _mw, bare = servers
    conn = lighthttp.Connection("127.0.0.1", bare.port, timeout=30)
    streamed = await conn.request("POST", CHAT, req.request_body(MODEL, 40, True, 1), JSON, tail=req.TAIL_BYTES,
                                  first=req.CONTENT_RE)
    whole = await conn.request("POST", CHAT, req.request_body(MODEL, 40, False, 1), JSON)
    conn.close()
    assert streamed.status == 200 and streamed.headers["transfer-encoding"] == "chunked"
    assert req.DONE_RE.search(streamed.body) and req.completion_tokens_from_tail(streamed.body) == 40
    assert streamed.first_s is not None and b'"role":"assistant"' in streamed.prefix
    assert whole.status == 200 and int(whole.headers["content-length"]) == len(whole.body)
    assert json.loads(whole.body)["usage"]["completion_tokens"] == 40


async def test_one_request_checks_status_done_and_token_count(servers: tuple[UvicornThread, UvicornThread]
                                                              ) -> None:
    mw, _bare = servers
    conn = lighthttp.Connection("127.0.0.1", mw.port, timeout=30)
    good = await req.one_request(conn, CHAT, req.request_body(MODEL, 12, True, 0), JSON, stream=True,
                                  max_tokens=12)
    bypass = await req.one_request(conn, CHAT, req.request_body(MODEL, 12, True, 0),
                                    {**JSON, **req.BYPASS_HEADER}, stream=True, max_tokens=12)
    short = await req.one_request(conn, CHAT, req.request_body(MODEL, 12, False, 0), JSON, stream=False,
                                   max_tokens=13)
    missing = await req.one_request(conn, CHAT, req.request_body("no-such-model", 12, True, 0), JSON, stream=True,
                                     max_tokens=12)
    conn.close()
    assert good.error is None and good.tokens == 12 and good.ttft is not None
    assert good.middleware and good.id_lines  # through the middleware: its headers and SSE ids
    assert bypass.error is None and bypass.tokens == 12 and not bypass.middleware and not bypass.id_lines
    assert short.error == "completion_tokens 12 != max_tokens 13" and short.tokens == 0
    assert missing.error is not None and missing.error.startswith("HTTP 404") and missing.tokens == 0


def test_measure_target_interleaves_three_modes_through_and_around_the_middleware(
        servers: tuple[UvicornThread, UvicornThread]) -> None:
    mw, bare = servers
    result = live.measure_target("mw", mw.url, None, 20, [1, 3], None, 3, expect_middleware=True)
    assert result["model"] == MODEL and result["middleware"] is True
    assert result["modes"] == ["non-streamed", "streamed", "bypass"]
    for level, requests in zip(result["levels"], (4, 6), strict=True):
        assert level["requests"] == requests
        runs = level["runs"]
        assert len(runs) == 9
        for run in runs:
            assert run["errors"] == 0 and run["tokens"] == requests * 20
            if run["mode"] == "streamed":
                assert run["via_middleware"] == run["id_lines"] == requests
            else:  # bypass: vLLM's own streaming path; non-streamed: passed through as it is
                assert run["via_middleware"] == run["id_lines"] == 0
            if run["stream"]:
                assert "ttft_p50_s" in run
        first = {r["round"]: r["mode"] for r in runs if r["position"] == 0}
        assert first == {0: "non-streamed", 1: "streamed", 2: "bypass"}  # the order rotates
        assert set(level["ratios"]) == {"streamed", "bypass", "streamed/bypass"}
        for name, spread in level["ratios"].items():
            num, _, den = name.partition("/")
            by_round = {r["round"]: {} for r in runs}
            for r in runs:
                by_round[r["round"]][r["mode"]] = r["tokens_per_s"]
            expected = [by_round[i][num] / by_round[i][den or "non-streamed"] for i in range(3)]
            assert spread["values"] == pytest.approx(expected)  # paired within the round
            assert spread["min"] <= spread["median"] <= spread["max"]
    bare_result = live.measure_target("bare", bare.url, MODEL, 10, [2], 2, 2, expect_middleware=False)
    assert bare_result["modes"] == ["non-streamed", "streamed"] and bare_result["middleware"] is False
    assert set(bare_result["levels"][0]["ratios"]) == {"streamed"}


def test_expecting_the_middleware_on_a_bare_server_fails(servers: tuple[UvicornThread, UvicornThread]) -> None:
    _mw, bare = servers
    with pytest.raises(req.PathError, match="do not carry"):
        live.measure_target("bare", bare.url, MODEL, 10, [1], 1, 1, expect_middleware=True)


def test_check_path_rejects_a_bypass_that_went_through() -> None:
    run = {"mode": "bypass", "requests": 4, "errors": 0, "via_middleware": 4, "id_lines": 4}
    with pytest.raises(req.PathError, match="expected none"):
        req.check_path(run, through_middleware=False)
    with pytest.raises(req.PathError, match="lacked"):
        req.check_path({**run, "mode": "streamed", "via_middleware": 3}, through_middleware=True)


def test_target_command_prints_the_side_by_side_table_and_writes_json(
        servers: tuple[UvicornThread, UvicornThread], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mw, bare = servers
    out = tmp_path / "overhead.json"
    code = main(["--target", f"mw={mw.url}/v1", "--target", f"bare={bare.url}", "--concurrency", "1,2",
                 "--max-tokens", "10", "--rounds", "2", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "mw: streamed / non-streamed" in text and "mw: streamed / bypass" in text
    assert "bare: streamed / non-streamed" in text
    data = json.loads(out.read_text())
    assert [t["label"] for t in data["targets"]] == ["mw", "bare"]
    assert [row["concurrency"] for row in data["summary"]] == [1, 2]
    assert set(data["summary"][0]) == {"concurrency", "mw streamed", "mw bypass", "mw streamed/bypass",
                                       "bare streamed"}


def test_parse_cpus() -> None:
    assert live.parse_cpus("1") == {1}
    assert live.parse_cpus("0-2,5") == {0, 1, 2, 5}
    with pytest.raises(ValueError):
        live.parse_cpus(",")


# -- CPU per token (issue 16): /proc readings, process roles, the --vllm measurement ---------------------------


def test_cpu_meter_reads_a_child_that_burns_cpu() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"], process_group=0)
    try:
        assert child.pid in cpu.descendants(os.getpid())
        assert "time.process_time" in cpu.cmdline(child.pid)
        meter = cpu.CpuMeter({"child": [child.pid], "none": []})
        assert list(meter.groups) == ["child"]  # an empty group is not measured
        meter.start()
        deadline = time.monotonic() + 30
        while cpu.cpu_seconds(child.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = meter.stop()["child"]
        assert 0.2 <= spent <= 0.6  # most of its 0.4 s falls inside the reading (its start-up before it)
        assert cpu.thread_ns(child.pid)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(cpu.ProcessGone):
        cpu.cpu_seconds(child.pid)


def test_vllm_processes_sorts_a_server_tree_by_process_titles() -> None:
    """What vLLM's setproctitle shows: EngineCore and Worker below the API server we started."""
    script = "(exec -a VLLM::EngineCore sleep 30) & (exec -a VLLM::Worker_TP0 sleep 30) & (exec sleep 31) & wait"
    root = subprocess.Popen(["bash", "-c", script], process_group=0)
    try:
        deadline = time.monotonic() + 10
        while len(cpu.descendants(root.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        procs = cpu.vllm_processes(root.pid)
        assert list(procs.api) == [root.pid] and "API server: the started process" in procs.how
        assert sorted(procs.engine.values()) == ["VLLM::EngineCore 30", "VLLM::Worker_TP0 30"]
        assert list(procs.other.values()) == ["sleep 31"]
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    with pytest.raises(cpu.ProcessGone, match="no engine process"):
        cpu.vllm_processes(os.getpid())  # pytest has no VLLM::EngineCore below it


def _fake_run(tokens: int, api: float) -> dict[str, Any]:
    return {"tokens": tokens, "events": tokens + 3, "tokens_per_s": tokens / 2, "client_cpu_s": 0.01, "errors": 0,
            "cpu_s": {"plugin api": api, "vllm api": api, "plugin engine": 1.0, "vllm engine": 1.0}}


def test_summarise_pairs_api_cpu_per_token_within_each_round() -> None:
    paths = [p for p in ov.PATHS if p.name in ("vllm-streamed", "plugin-sse", "plugin-bypass")]
    rounds = [{"vllm-streamed": _fake_run(1000, 0.050), "plugin-sse": _fake_run(1000, 0.052),
               "plugin-bypass": _fake_run(1000, 0.050)},
              {"vllm-streamed": _fake_run(1000, 0.100), "plugin-sse": _fake_run(1000, 0.100),
               "plugin-bypass": _fake_run(500, 0.060)}]
    out = ov.summarise(32, 64, paths, rounds)
    assert out["paths"]["plugin-sse"]["api_us_per_token"]["values"] == pytest.approx([52.0, 100.0])
    assert out["ratios"]["plugin-sse/vllm-streamed"]["values"] == pytest.approx([1.04, 1.0])  # per round
    assert out["ratios"]["plugin-sse/vllm-streamed"]["target"] == "<= 1.05"
    assert out["ratios"]["plugin-bypass/vllm-streamed"]["values"] == pytest.approx([1.0, 1.2])
    assert set(out["ratios"]) == {"plugin-sse/vllm-streamed", "plugin-bypass/vllm-streamed", "plugin-sse/plugin-bypass"}
    assert out["ratios_per_event"]["plugin-bypass/vllm-streamed"]["values"] == pytest.approx([1.0, 0.6 * 1003 / 503])
    assert out["paths"]["plugin-sse"]["events_per_token"]["values"] == pytest.approx([1.003, 1.003])


def test_measure_attributes_each_run_to_its_servers_processes(servers: tuple[UvicornThread, UvicornThread]) -> None:
    """The --vllm loop against two in-process servers (middleware as "plugin", bare as "vllm"): paths checked,
    order rotated, every run's CPU read from /proc (here: this process, which serves both)."""
    mw, bare = servers
    me = cpu.ServerProcesses(api={os.getpid(): "pytest"}, engine={os.getpid(): "pytest"})
    fake = {"plugin": ov.Server("plugin", None, mw.url, "", "mw", procs=me),  # type: ignore[arg-type]
            "vllm": ov.Server("vllm", None, bare.url, "", "bare", procs=me)}  # type: ignore[arg-type]
    paths = [p for p in ov.PATHS if p.server in fake and not p.h3]
    rows = ov.measure(fake, paths, MODEL, 16, [2], None, 2)
    row = rows[0]
    assert row["requests"] == 4 and set(row["paths"]) == {p.name for p in paths}
    assert all(e["errors"] == 0 for e in row["paths"].values())
    assert all(run["cpu_s"]["vllm api"] > 0 and run["tokens"] == 64 for run in row["runs"])
    streamed = [run for run in row["runs"] if run["stream"]]
    assert all(run["events"] >= run["tokens"] for run in streamed)  # one event per token, + role, usage, [DONE]
    assert row["paths"]["plugin-sse"]["api_us_per_event"]["median"] > 0
    assert {r["mode"] for r in row["runs"] if r["position"] == 0} == {"non-streamed", "vllm-streamed"}
    assert "plugin-bypass/vllm-streamed" in row["ratios"] and "gateway/vllm-streamed" not in row["ratios"]
    ov.print_report({"servers": {}, "levels": rows})


@pytest.mark.vllm
def test_vllm_quick_measures_every_path_on_real_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """``--vllm MODEL --quick``: both vLLM servers (and the gateway) side by side, every path, CPU per token from
    the processes found below each server; about 1.5-2 minutes on 2 cores."""
    from tests.support.vllm import VLLM_PYTHON, build_tiny_model

    model = build_tiny_model()
    out = tmp_path / "vllm.json"
    code = main(["--vllm", model, "--quick", "--vllm-python", str(VLLM_PYTHON), "--concurrency", "1,4",
                 "--vllm-args", "--enforce-eager --max-model-len 2048 --max-num-seqs 8 --dtype float32 --seed 0",
                 "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["servers"]["plugin"]["processes"]["engine"] and data["servers"]["vllm"]["processes"]["api"]
    expected = {"non-streamed", "vllm-streamed", "plugin-non-streamed", "plugin-bypass", "plugin-sse", "plugin-h3"}
    if "gateway" in data["servers"]:
        expected.add("gateway")
    assert set(data["paths"]) == expected
    for level in data["levels"]:
        for name, entry in level["paths"].items():
            assert entry["errors"] == 0, (name, entry.get("error_sample"))
            assert entry["api_us_per_token"]["median"] > 0
        assert level["ratios"]["plugin-sse/vllm-streamed"]["median"] > 0
    assert "API-server CPU per token" in capsys.readouterr().out


def test_adapter_cost_times_the_vllm_stack_on_requests_that_bypass_it() -> None:
    """Item 4's in-process figure: the adapter around a stand-in app, bypass and non-streamed (no timing asserted)."""
    from eloquent_vllm import bench_cost as adapter_cost

    result = asyncio.run(adapter_cost.measure(messages=16, requests=20, repeat=1, opcodes=True))
    assert result["messages"] == 16
    assert result["bypass_bare_us_per_request"] > 0 and result["non_streamed_bare_us_per_request"] > 0
    assert {"bypass_added_us_per_request", "non_streamed_added_us_per_request", "bypass_added_ns_per_event",
            "sse_added_us_per_request", "sse_added_ns_per_event"} <= set(result)
    assert result["sse_bare_us_per_request"] > 0
    # The bytecode count is exact: per event, the event path's direct write runs the most, and the producer's
    # general path runs for each request's first event only.
    assert result["sse_opcodes_per_event"] > 0 and result["sse_bare_opcodes_per_event"] > 0
    by_function = result["sse_opcodes_by_function"]
    assert max(by_function, key=by_function.get) == "sse/event_path.py:write"
    # The producer's general path runs for each request's first event only: ~7 bytecodes per event over 16 events,
    # ~110 if it ran for every event.
    producer = sum(count for name, count in by_function.items() if name.startswith("sse/producer.py:"))
    assert 0 < producer < 30, by_function
