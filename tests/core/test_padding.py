"""Padding against size side channels (issue 29): the policy, padded datagrams (property test over random token
sequences, loss and acks), and padded SSE read unchanged by the openai SDK, httpx-sse, text-generation and our
own SSE parser; ``stream_options.include_obfuscation: false`` turns it off for that request."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import text_generation
from eloquent_tgi.gateway import create_tgi_gateway
from httpx_sse import connect_sse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError, DecodeError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import (
    PaddingPolicy,
    datagram_policy,
    obfuscation_requested,
    sse_comment,
    sse_policy,
)
from eloquent_plugins.core.receiver import EloquentReceiver
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.wire import decode_packet, encode_packet, pad_packet, DataPacket, Entry
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.engine import create_engine_app
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

from tests.support.client_servers import MODEL, Served, eloquent_serve, lossy_openai
from tests.support.servers import UvicornThread
from tests.support.streams import body_writes
from tests.support.tgi_server import TGIServerConfig, create_tgi_server, run_in_thread

BUDGET = 1286


# ---- the policy ----------------------------------------------------------------------------------------------
def test_bucket_rounds_up_to_powers_of_two_and_constant_to_whole_units() -> None:
    bucket = PaddingPolicy("bucket")
    assert [bucket.target(n) for n in (1, 128, 129, 256, 257, 5000)] == [128, 128, 256, 256, 512, 8192]
    constant = PaddingPolicy("constant", size=100)
    assert [constant.target(n) for n in (0, 1, 100, 101, 250)] == [100, 100, 100, 200, 300]
    assert PaddingPolicy("off").target(77) == 77
    with pytest.raises(ConfigError, match="padding must be one of"):
        PaddingPolicy("random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="padding must be one of"):
        StreamConfig(padding="lots")


def test_datagram_classes_are_about_one_and_a_half_apart_up_to_the_budget() -> None:
    assert datagram_policy("bucket", BUDGET).sizes() == (48, 72, 112, 168, 256, 384, 576, 864, BUDGET)
    assert datagram_policy("bucket", BUDGET, 64, 2.0).sizes() == (64, 128, 256, 512, 1024, BUDGET)
    assert datagram_policy("bucket", BUDGET).target(73) == 112
    with pytest.raises(ConfigError, match="growth"):
        PaddingPolicy("bucket", growth=1.0)


def test_server_sse_classes_are_a_quarter_apart() -> None:
    assert sse_policy("bucket").classes[:10] == (128, 160, 200, 256, 320, 400, 504, 632, 792, 992)
    assert sse_policy("bucket").target(290) == 320 and sse_policy("bucket", 2.0).target(290) == 512


@pytest.mark.parametrize("mode", ["bucket", "constant"])
@pytest.mark.parametrize("growth", [2.0, 1.25])
@pytest.mark.parametrize("n", [1, 20, 126, 127, 128, 159, 161, 255, 511, 512, 513, 1500])
def test_sse_writes_take_the_classes_and_parse_as_the_event(mode: str, growth: float, n: int) -> None:
    policy = sse_policy(mode, growth)
    event = b"data: " + b"x" * max(0, n - 8) + b"\n\n"
    writes = policy.sse_writes(event)
    sizes = {len(w) for w in writes}
    if mode == "constant":
        assert sizes == {policy.size}
    else:
        assert len(writes) == 1 and len(writes[0]) in policy.classes
    parser = SSEParser()
    messages = [m for w in writes for m in parser.feed(w)]
    assert [m.data for m in messages] == [event[6:-2].decode()]
    assert sse_comment(2) == b":\n" and len(sse_comment(70000)) == 70000


def test_obfuscation_field_is_read_from_the_request() -> None:
    assert obfuscation_requested(b'{"stream":true,"stream_options":{"include_obfuscation":false}}') is False
    assert obfuscation_requested(b'{"stream_options":{"include_obfuscation":true}}') is True
    assert obfuscation_requested(b'{"stream":true}') is None
    assert obfuscation_requested(b'{"include_obfuscation": broken') is None
    assert obfuscation_requested(b'["include_obfuscation"]') is None


# ---- datagrams -----------------------------------------------------------------------------------------------
def test_zero_padding_decodes_and_other_trailing_bytes_do_not() -> None:
    raw = encode_packet(DataPacket(3, 1, None, 0, (Entry(0, EventKind.DATA, b"tok"),)))
    assert decode_packet(pad_packet(raw, 64)) == decode_packet(raw)
    assert len(pad_packet(raw, 64)) == 64 and pad_packet(raw, 4) == raw
    with pytest.raises(DecodeError, match="trailing"):
        decode_packet(raw + b"\x00\x01")
    with pytest.raises(ConfigError, match="constant datagram padding"):
        SenderConfig(limits=Limits(max_datagram_size=BUDGET), padding=datagram_policy("constant", 100))


tokens = st.lists(st.binary(min_size=0, max_size=40) | st.binary(min_size=1500, max_size=3000).map(bytes),
                  min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=tokens, mode=st.sampled_from(["bucket", "constant"]), seed=st.integers(0, 2**32),
       loss=st.floats(0.0, 0.5), ack_loss=st.floats(0.0, 0.5))
def test_padded_datagrams_take_only_the_configured_sizes(payloads: list[bytes], mode: str, seed: int, loss: float,
                                                          ack_loss: float) -> None:
    """Random token sequences (some larger than a datagram: fragments), random data and ack loss, acks and probes:
    every datagram the sender emits has one of the policy's sizes, and the receiver gets every event, in order."""
    rng = random.Random(seed)
    limits = Limits(max_datagram_size=BUDGET)
    policy = datagram_policy(mode, BUDGET)
    sender = EloquentSender(1, SenderConfig(limits=limits, padding=policy, initial_rtt=0.05))
    receiver = EloquentReceiver(1)
    allowed = set(policy.sizes() or ())
    got: list[bytes] = []
    sizes: list[int] = []
    now = 0.0
    pending = list(payloads)
    for step in range(4000):
        if pending and step % 2 == 0:
            payload = pending.pop(0)
            sender.push(payload, now)
            if not pending:
                sender.end(now)
        for datagram in sender.datagrams_to_send(now):
            sizes.append(len(datagram))
            if rng.random() >= loss:
                got.extend(e.payload for e in receiver.receive_datagram(datagram, now) if e.kind is EventKind.DATA)
        receiver.handle_timer(now)
        for ack in receiver.datagrams_to_send(now):
            if rng.random() >= ack_loss:
                sender.receive_datagram(ack, now)
        if sender.done:
            break
        deadline = sender.next_deadline()
        now = min(now + 0.01, deadline) if deadline is not None and deadline > now else now + 0.01
    assert sender.done, "the stream did not complete"
    assert got == payloads
    assert set(sizes) <= allowed, f"sizes {sorted(set(sizes) - allowed)} outside {sorted(allowed)}"


# ---- SSE: every client reads padded streams unchanged ----------------------------------------------------------
ENGINE = EngineConfig(ttft=0.0, tpot=0.001)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    apps = {mode: EloquentMiddleware(create_engine_app(ENGINE), StreamConfig(padding=mode))
            for mode in ("off", "bucket", "constant")}
    with UvicornThread(apps["off"]) as off, UvicornThread(apps["bucket"]) as bucket, \
            UvicornThread(apps["constant"]) as constant:
        yield {"off": off.url, "bucket": bucket.url, "constant": constant.url}


def chat(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": ENGINE.model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": 24, **extra}


def raw_body(url: str, body: dict[str, object]) -> bytes:
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        return r.read()


def sse_text(raw: bytes) -> tuple[str, int]:
    parser = SSEParser()
    messages = parser.feed(raw)
    return "".join(m.data for m in messages if m.data != "[DONE]" and '"content"' in m.data), parser.comments_seen


@pytest.mark.parametrize("mode", ["bucket", "constant"])
def test_padded_stream_has_comment_padding_and_the_same_events(servers: dict[str, str], mode: str) -> None:
    plain, plain_comments = sse_text(raw_body(servers["off"], chat("tell me about rivers")))
    padded_raw = raw_body(servers[mode], chat("tell me about rivers"))
    padded, comments = sse_text(padded_raw)
    assert plain_comments == 0 and comments > 5
    assert b"\n:pp" in padded_raw
    assert len(padded) > 0 and padded.count('"content"') == plain.count('"content"')


def test_include_obfuscation_false_turns_padding_off_for_that_request(servers: dict[str, str]) -> None:
    off = raw_body(servers["bucket"], chat("a", stream_options={"include_obfuscation": False}))
    on = raw_body(servers["bucket"], chat("a", stream_options={"include_obfuscation": True}))
    assert sse_text(off)[1] == 0 and b"\n:pp" not in off and b'"obfuscation"' not in off
    assert sse_text(on)[1] > 0


def test_include_obfuscation_true_adds_openais_field_which_the_sdk_reads(servers: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=servers["off"] + "/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(
        model=ENGINE.model, stream=True, max_tokens=24, messages=[{"role": "user", "content": "hello padding"}],
        stream_options={"include_obfuscation": True}))
    tokens = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert tokens and all(isinstance(c.obfuscation, str) and 1 <= len(c.obfuscation) <= 32 for c in tokens)
    assert len({len(c.obfuscation) for c in tokens}) > 1  # random lengths (24 draws of 32 all equal: 32**-23)
    plain = list(client.chat.completions.create(
        model=ENGINE.model, stream=True, max_tokens=24, messages=[{"role": "user", "content": "hello padding"}]))
    assert all(c.obfuscation is None for c in plain)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "".join(c.choices[0].delta.content or "" for c in plain if c.choices)
    bad = httpx.post(servers["off"] + "/v1/chat/completions", timeout=30,
                     json=chat("x", stream_options={"include_obfuscation": "yes"}))
    assert bad.status_code == 400 and "include_obfuscation" in bad.text


def test_send_tick_coalesces_the_writes_and_loses_nothing() -> None:
    """With ``send_tick`` far above the engine's token interval, the connection writes once a tick: several events
    a write (a count, not a duration), and the text is whole."""
    import asyncio

    async def stream(tick: float) -> tuple[int, str]:
        app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.002)),
                                 StreamConfig(send_tick=tick, keepalive=0.0, resume=False))
        body = json.dumps(chat("ticks", max_tokens=40)).encode()
        writes = await body_writes(app, body)
        messages = SSEParser().feed(b"".join(writes))
        chunks = [json.loads(m.data) for m in messages if m.data.startswith("{")]
        return len(writes), "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    plain_writes, plain_text = asyncio.run(stream(0.0))
    ticked_writes, ticked_text = asyncio.run(stream(0.2))
    assert ticked_text == plain_text and len(plain_text) >= 40
    assert ticked_writes < plain_writes / 2, (ticked_writes, plain_writes)


@pytest.mark.parametrize("mode", ["bucket", "constant"])
def test_openai_sdk_reads_padded_sse_unchanged(servers: dict[str, str], mode: str) -> None:
    texts = []
    for url in (servers["off"], servers[mode]):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(model=ENGINE.model, stream=True, max_tokens=24,
                                                messages=[{"role": "user", "content": "hello padding"}])
        chunks = list(stream)
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert texts[0] == texts[1] and texts[0]


@pytest.mark.parametrize("mode", ["bucket", "constant"])
def test_httpx_sse_reads_padded_sse_unchanged(servers: dict[str, str], mode: str) -> None:
    runs = []
    for url in (servers["off"], servers[mode]):
        with httpx.Client(timeout=30) as client, connect_sse(client, "POST", url + "/v1/chat/completions",
                                                             json=chat("hello padding")) as source:
            runs.append([(e.event, e.data) for e in source.iter_sse()])
    assert [d for _, d in runs[0]][-1] == "[DONE]"
    strip = [[(ev, re.sub(r'"(id|created)":("[^"]*"|\d+),', "", d)) for ev, d in r] for r in runs]
    assert strip[0] == strip[1]  # the same events, ids and timestamps aside


@pytest.fixture(scope="module")
def tgi() -> Iterator[str]:
    with run_in_thread(create_tgi_server(TGIServerConfig())) as upstream, \
            run_in_thread(EloquentMiddleware(create_tgi_gateway(upstream), StreamConfig(padding="constant"))) as gateway:
        yield gateway


def test_text_generation_client_reads_padded_sse_unchanged(tgi: str) -> None:
    raw = httpx.post(tgi + "/generate_stream", json={"inputs": "Test request", "parameters": {"max_new_tokens": 3}},
                     timeout=30).content
    assert b"\n:pp" in raw or raw.startswith(b":pp")
    client = text_generation.Client(tgi, timeout=60)
    tokens = [r.token.id for r in client.generate_stream("Test request", max_new_tokens=3)]
    assert tokens == [363, 847, 2754]


# ---- datagrams over real QUIC: the Python client reads padded datagrams through a lossy relay ---------------------
@pytest.fixture(scope="module")
def padded_server() -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.004", "--ttft", "0.02", "--padding", "constant") as s:
        yield s


async def test_python_client_reads_padded_datagrams_over_lossy_quic(padded_server: Served) -> None:
    prompt = "Tell me about padded rivers."
    async with lossy_openai(padded_server, seed=29) as (client, seen):
        stream = await client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                      messages=[{"role": "user", "content": prompt}])
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert seen == ["datagram"]
    assert text == padded_server.text(prompt, 60) and len(text) > 50


def test_resume_replays_the_log_without_its_padding(servers: dict[str, str]) -> None:
    """The log holds the events, not the padding: a resume gets the rest of the stream coalesced into few writes,
    each padded once, so far fewer comment lines than events (a log that stored padding would replay one per
    event), and the same events as the original after the resume point."""
    url = servers["bucket"] + "/v1/chat/completions"
    with httpx.stream("POST", url, json=chat("resume me", max_tokens=30), timeout=30) as r:
        token = r.headers["x-eloquent-stream"]
        original = r.read()
    first = SSEParser().feed(original)
    with httpx.stream("POST", url, json={}, headers={"last-event-id": f"{token}:3"}, timeout=30) as r:
        assert r.status_code == 200
        resumed_raw = r.read()
    parser = SSEParser()
    resumed = parser.feed(resumed_raw)
    assert [m.data for m in resumed] == [m.data for m in first if m.id and int(m.id.rsplit(":", 1)[1]) > 3]
    assert len(resumed) >= 20 and 1 <= parser.comments_seen <= 3
