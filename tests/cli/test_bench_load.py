"""``eloquent bench load``: its HTTP client, its checks, and a short real run against ``eloquent serve``."""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eloquent_plugins.cli.bench import load, load_clients, load_config, load_hostile, load_servers
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
    cfg = load_config.LoadConfig(sse_streams=1, h3_streams=0, tpot=0.0, ttft=0.0, max_tokens=5)
    proc, port, _ = load_servers.start_server(cfg, str(tmp_path / "server.log"))
    try:
        # Measured server in the benchmark's session (one scheduler autogroup), in a process group of its own.
        assert (os.getsid(proc.pid), os.getpgid(proc.pid)) == (os.getsid(0), proc.pid)
        expected = load._expected_texts(port, cfg)
        prompt = next(iter(expected))
        wrong = {prompt: expected[prompt] + " (one more token)"}

        async def once(texts: dict[str, str]) -> load_clients.Tally:
            tally = load_clients.Tally()
            stop = asyncio.Event()
            task = asyncio.create_task(load_clients._sse_slot(0, cfg, port, texts, tally, stop, [0]))
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

        # The resume storm's check can fail too: a reassembled text other than the expected one is a mismatch.
        async def storm(text: str) -> load_hostile.HostileTally:
            tally = load_hostile.HostileTally(storm_resumes=[0])
            await load_hostile._storm_stream(0, cfg, port, prompt, text, tally, random.Random(1), asyncio.Event())
            return tally

        bad_storm = asyncio.run(asyncio.wait_for(storm(wrong[prompt]), 30))
        assert (bad_storm.storm_mismatches, bad_storm.storm_completed) == (1, 0), bad_storm
        good_storm = asyncio.run(asyncio.wait_for(storm(expected[prompt]), 30))
        assert (good_storm.storm_mismatches, good_storm.storm_completed) == (0, 1), good_storm
        # 5 tokens cut after 1 event each at most (max_tokens // 4 -> 1): the stream was resumed several times.
        assert good_storm.storm_resumes[0] >= 5 and not good_storm.storm_errors
    finally:
        load_servers.stop_server(proc)


def test_fake_initial_is_a_quic_v1_initial_a_server_must_consider() -> None:
    from aioquic.buffer import Buffer
    from aioquic.quic.packet import QuicPacketType, pull_quic_header

    packets = {load_hostile.fake_initial() for _ in range(50)}
    assert len(packets) == 50  # random connection ids and payloads
    for packet in packets:
        header = pull_quic_header(Buffer(data=packet), host_cid_length=8)
        assert len(packet) == load_hostile.INITIAL_SIZE == header.packet_length
        assert (packet[0], header.version, header.packet_type, header.token) == (0xC0, 1, QuicPacketType.INITIAL,
                                                                                 b"")
        assert len(header.destination_cid) == len(header.source_cid) == 8


def test_hostile_options_preset_and_knobs() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    assert not load.config_from_args(parser.parse_args([])).hostile
    preset = load.config_from_args(parser.parse_args(["--hostile"]))
    assert (preset.never_readers, preset.fake_initials_per_s, preset.resume_storm) == (200, 300.0, 50)
    mixed = load.config_from_args(parser.parse_args(["--hostile", "--never-readers", "0", "--quick"]))
    assert (mixed.never_readers, mixed.resume_storm, mixed.sse_streams) == (0, 50, 100)
    one = load.config_from_args(parser.parse_args(["--resume-storm", "3"]))
    assert (one.never_readers, one.fake_initials_per_s, one.resume_storm) == (0, 0.0, 3) and one.hostile
    with pytest.raises(SystemExit):
        parser.parse_args(["--never-readers", str(load_config.MAX_NEVER_READERS + 1)])


def test_hostile_mix_leaves_the_normal_streams_without_errors(tmp_path, capsys) -> None:
    """Issue 18: never-readers, fake QUIC Initials and resume storms beside the normal load; the normal streams
    still have zero errors, every storm text is exact, and the summary says what hostile traffic was sent."""
    out = tmp_path / "load.json"
    rc = load.main(["--sse", "8", "--h3", "2", "--h3-connections", "1", "--duration", "8", "--ramp", "1",
                    "--tpot", "0.05", "--ttft", "0.05", "--max-tokens", "12", "--resume-ttl", "1",
                    "--sample-interval", "0.5", "--never-readers", "20", "--fake-initials-per-s", "200",
                    "--resume-storm", "5", "--json", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    h = result["hostile"]
    assert rc == 0 and result["errors"] == 0, (result["sse"]["examples"], result["h3"]["examples"])
    for kind in ("sse", "h3"):
        assert result[kind]["completed"] >= 10 and not result[kind]["errors"], result[kind]
    # Storms: every stream that ended was reassembled exactly, and every client really cut and resumed.
    assert h["storm_mismatches"] == 0 and not h["storm_errors"], h["examples"]
    assert h["storm_completed"] >= 10
    assert len(h["storm_resumes"]) == 5 and h["storm_resumes_min_per_client"] >= 5, h["storm_resumes"]
    assert h["storm_cuts"] >= h["storm_resumes_total"] - 5
    # Never-readers: 20 held (a refused or shed one is counted, and replaced).
    assert h["never_opened"] + sum(h["never_refused"].values()) >= 20
    assert h["never_at_end"]["held"] + sum(h["never_closed"].values()) >= 20 - sum(h["never_refused"].values())
    assert sum(h["never_at_end"]["outcomes"].values()) == h["never_at_end"]["held"]
    # Fake Initials at about the asked rate for the ~9 s run.
    assert h["initials_sent"] >= 0.6 * 200 * 9 and 100 <= h["initials_per_s"] <= 210, h
    assert f"fake QUIC Initials: {h['initials_sent']} sent" in printed
    assert f"resume storm (5 clients): {h['storm_completed']} streams exact, 0 mismatched" in printed
    assert f"20 never-readers: opened {h['never_opened']}" in printed
    assert "errors seen by clients: 0 (normal streams: the verdict)" in printed
