"""``eloquent bench load``: its HTTP client, its checks, and a short real run against ``eloquent serve``."""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eloquent_plugins.cli.bench import load
from eloquent_plugins.cli.bench.lighthttp import ResponseError, Result, _Exchange


def _chunked(body_parts: list[bytes]) -> bytes:
    out = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in body_parts if p)
    return out + b"0\r\nx-trailer: 1\r\n\r\n"


def _exchange(pieces: list[bytes]) -> tuple[_Exchange, asyncio.Future[Result], asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    future: asyncio.Future[Result] = loop.create_future()
    return _Exchange(future, tail=None, first=None, head_only=False,
                     on_piece=lambda result, piece: pieces.append(piece)), future, loop


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=12), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_on_piece_sees_the_whole_chunked_body_however_split(parts: list[bytes], rnd: random.Random) -> None:
    """What ``bench load`` parses events from: every body byte, in order, through ``on_piece``."""
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(parts)
    pieces: list[bytes] = []
    exchange, future, loop = _exchange(pieces)
    try:
        i = 0
        while i < len(wire):
            step = rnd.randint(1, 40)
            exchange.feed(wire[i:i + step])
            i += step
        assert future.done() and future.result().status == 200
        assert b"".join(pieces) == b"".join(parts) == future.result().body
    finally:
        loop.close()


def test_chunked_garbage_is_a_response_error() -> None:
    for wire, match in ((b"zz\r\nabc\r\n", "bad chunk size"), (b"3\r\nabcXY", "CRLF")):
        exchange, _, loop = _exchange([])
        try:
            with pytest.raises(ResponseError, match=match):
                exchange.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + wire)
        finally:
            loop.close()


def test_load_run_reports_every_stream_and_no_errors(tmp_path) -> None:
    out = tmp_path / "load.json"
    rc = load.main(["--sse", "24", "--h3", "6", "--h3-connections", "2", "--duration", "5", "--ramp", "1",
                    "--tpot", "0.05", "--ttft", "0.05", "--max-tokens", "12", "--resume-ttl", "1",
                    "--sample-interval", "0.5", "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, result.get("sse", {}).get("examples") or result.get("h3", {}).get("examples")
    assert result["errors"] == 0
    for kind, slots in (("sse", 24), ("h3", 6)):
        r = result[kind]
        # ~0.7 s per stream over ~5 s: every slot finished several streams, each checked against the
        # non-streamed text; the streams open at the end were cut, not failed.
        assert r["completed"] >= 2 * slots, r
        assert r["started"] == r["completed"] + r["cancelled"]
        assert r["events"] >= r["completed"] * 12
        assert r["gaps"] > 0
    assert result["engine_after"]["running"] == 0
    assert result["engine_after"]["failed"] == 0
    assert result["samples"] and all(s["server_rss"] > 0 for s in result["samples"])
    assert result["idle_rss_mib"] > 0 and result["hold_rss_mib"]["max"] >= result["idle_rss_mib"]


def test_load_client_counts_a_wrong_text_as_an_error(tmp_path) -> None:
    """The check can fail: a stream whose text is not the expected one is an error, not a completed stream."""
    cfg = load.LoadConfig(sse_streams=1, h3_streams=0, tpot=0.0, ttft=0.0, max_tokens=5)
    proc, port, _ = load.start_server(cfg, str(tmp_path / "server.log"))
    try:
        # Measured server in the benchmark's session (one scheduler autogroup), in a process group of its own.
        assert (os.getsid(proc.pid), os.getpgid(proc.pid)) == (os.getsid(0), proc.pid)
        expected = load._expected_texts(port, cfg)
        prompt = next(iter(expected))
        wrong = {prompt: expected[prompt] + " (one more token)"}

        async def once(texts: dict[str, str]) -> load.Tally:
            tally = load.Tally()
            stop = asyncio.Event()
            task = asyncio.create_task(load._sse_slot(0, cfg, port, texts, tally, stop, [0]))
            while tally.completed + sum(tally.errors.values()) < 3:
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.wait_for(task, 10)
            return tally

        bad = asyncio.run(asyncio.wait_for(once(wrong), 30))
        assert bad.completed == 0
        assert bad.errors["text differs from the non-streamed answer"] >= 3
        good = asyncio.run(asyncio.wait_for(once({prompt: expected[prompt]}), 30))
        assert good.completed >= 3 and not good.errors
    finally:
        load.stop_server(proc)
