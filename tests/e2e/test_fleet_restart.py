"""A rolling restart of a fleet (issue 25): two ``eloquent serve`` replicas sharing one redis-server behind one
real nginx -- HTTP on TCP (``proxy_next_upstream ... http_503 non_idempotent``: a stream a draining replica refuses
started nothing, so nginx tries the other) and HTTP/3 through the ``stream {}`` module on UDP, ``Alt-Svc``
rewritten to nginx's UDP port.

100 streams in flight (the openai SDK over SSE, Eloquent datagrams through ``AsyncEloquentTransport``, plain SSE
that leaves once mid-stream and comes back with ``Last-Event-ID``); once each has events, replica A gets SIGTERM
while new streams keep arriving over TCP, A drains, exits, is started again and turns ready; then the same for B. Every
stream completes with exactly the uncut answer, and no new stream is refused by the fleet.

New streams during a drain go over TCP and over Eloquent datagrams. On TCP nginx retries a refusal on the other
replica. Over UDP nginx cannot: a new HTTP/3 stream that reaches the draining replica gets GOAWAY and a 503
``draining``, which the client takes to a new QUIC connection after ``Retry-After`` (``tests/transports/test_drain.py``);
through nginx that is a new session hashed on the client's new port, so each try reaches the other replica with
even odds, and the client keeps trying within its timeout: no new stream is refused by the fleet as a whole.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from eloquent_client import AsyncEloquentTransport, PathMemory

from eloquent_plugins.cli.bench.replica import Replica
from eloquent_plugins.core.protocol import DELIVERY_HEADER
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.http3.certs import CertificatePair, generate_dev_certificate
from tests.support.client_servers import CHAT, MODEL, chat_body
from tests.support.servers import nginx_balancer, nginx_upstream, redis_server
from tests.support.streams import text_of, wait_until

TOKENS = 50
TPOT = 0.2  # 10 s a stream: each restart lands mid-stream, well inside the drain
PROMPTS = [f"rolling restart story {i}" for i in range(5)]
SDK, DATAGRAM, PLAIN = 40, 30, 30
FAIL_TIMEOUT = 2


@dataclass
class Fleet:
    replicas: list[Replica]
    url: str
    udp_port: int
    certs: CertificatePair


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="eloquent-fleet-") as tmp, redis_server() as store:
        certs = generate_dev_certificate(Path(tmp))
        args = ("--tpot", str(TPOT), "--ttft", "0.05", "--drain-timeout", "60", "--log-level", "info")
        replicas = [Replica(name, store, args, certs.certfile, certs.keyfile) for name in ("a", "b")]
        # TCP: max_fails=0. nginx counts a request to a replica as a success only when it ends, so a stream
        # keeps a restarted replica marked failed (by its 503s while it drained) for as long as the stream lasts,
        # and the other replica's drain then finds no live upstream (docs/DEPLOY.md).
        http = nginx_upstream("eloquent_http", [r.port for r in replicas], "", "max_fails=0")
        udp = nginx_upstream("eloquent_quic", [r.udp_port for r in replicas], "hash $remote_addr$remote_port "
                             "consistent;", f"max_fails=1 fail_timeout={FAIL_TIMEOUT}s")
        location = ("proxy_buffering off; proxy_read_timeout 1h; proxy_connect_timeout 2s; "
                    "proxy_next_upstream error timeout http_503 non_idempotent; proxy_next_upstream_tries 3;")
        try:
            for replica in replicas:
                replica.start()
            for replica in replicas:
                replica.wait_ready()
            with nginx_balancer(http, udp, target="https://eloquent_http", location=location,
                                udp_extra="proxy_timeout 60s;", alt_svc=True) as balancer:
                yield Fleet(replicas, balancer.url, balancer.udp_port, certs)
                lines = balancer.error_log.read_text(errors="replace").splitlines()
                kept = [line for line in lines if "udp client" not in line]
                print("\n".join(kept[:10] + ["..."] + kept[-20:]))
        finally:
            for replica in replicas:
                replica.stop()
                print(f"---- replica {replica.name}\n{replica.log()[-3000:]}")


@dataclass
class Outcome:
    kind: str
    prompt: str
    text: str = ""
    events: int = 0
    status: int = 0
    resumed: bool = False
    delivery: str = ""


async def sdk_stream(f: Fleet, prompt: str, out: Outcome) -> None:
    async with httpx.AsyncClient(timeout=60) as h:
        client = openai.AsyncOpenAI(base_url=f.url + "/v1", api_key="unused", http_client=h, max_retries=0)
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                      stream=True, max_tokens=TOKENS)
        out.status = 200
        parts = []
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                out.events += 1
        out.text = "".join(parts)


async def datagram_stream(f: Fleet, prompt: str, out: Outcome, h3_port: int) -> None:
    transport = AsyncEloquentTransport(transport="eloquent", verify=str(f.certs.certfile), h3_port=h3_port,
                                       path_memory=PathMemory(), stream_idle_timeout=1.0, timeout=30)
    async with httpx.AsyncClient(transport=transport, base_url=f.url, timeout=60) as h, \
            h.stream("POST", CHAT, json=chat_body(prompt, TOKENS)) as r:
        out.status, out.delivery = r.status_code, r.headers.get(DELIVERY_HEADER, "")
        parser, datas = SSEParser(), []
        async for chunk in r.aiter_bytes():
            for message in parser.feed(chunk):
                datas.append(message.data)
                out.events += 1
        out.text = text_of(datas)


async def plain_stream(f: Fleet, prompt: str, out: Outcome, leave_after: int) -> None:
    """Plain SSE: leaves once after ``leave_after`` events, and on any cut, coming back with ``Last-Event-ID``."""
    datas: list[str] = []
    last_id: str | None = None
    async with httpx.AsyncClient(timeout=60) as h:
        for _attempt in range(20):
            headers = {"last-event-id": last_id} if last_id else {}
            try:
                async with h.stream("POST", f.url + CHAT, json=chat_body(prompt, TOKENS), headers=headers) as r:
                    if r.status_code != 200:
                        out.status = r.status_code
                        return
                    out.status = 200
                    parser = SSEParser()
                    async for chunk in r.aiter_bytes():
                        for message in parser.feed(chunk):
                            if message.data:
                                datas.append(message.data)
                                last_id = message.id or last_id
                                out.events += 1
                        if datas and datas[-1] == "[DONE]":
                            out.text = text_of(datas)
                            return
                        if not out.resumed and len(datas) >= leave_after:
                            out.resumed = True
                            break  # leave: the next attempt resumes
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
    raise AssertionError(f"plain stream of {prompt!r} did not finish: {len(datas)} events")


async def expected(f: Fleet) -> dict[str, str]:
    """The uncut answer of each prompt (the built-in engine is deterministic; no pacing for these)."""
    out = {}
    async with httpx.AsyncClient(timeout=60, verify=False) as h:
        for prompt in PROMPTS:
            body = {**chat_body(prompt, TOKENS, stream=False), "eloquent_engine": {"tpot": 0, "ttft": 0}}
            r = await h.post(f.replicas[0].base + CHAT, json=body)
            out[prompt] = r.json()["choices"][0]["message"]["content"]
    return out


async def restart(f: Fleet, replica: Replica, launch: list[asyncio.Task[None]], outcomes: list[Outcome],
                  new_streams: int, h3_port: int) -> tuple[int, int]:
    """SIGTERM ``replica`` with streams in flight, start ``new_streams`` streams (the openai SDK and plain SSE on
    TCP, Eloquent datagrams on UDP) while it drains (none may be refused), wait for its exit, start it again, wait
    until it is ready. Returns how many streams were in flight on it when its drain began, and how many it handed
    over."""
    replica.signal()
    await wait_until(lambda: not replica.ready() or not replica.running, f"{replica.name} unready", timeout=30)
    for i in range(new_streams):
        kind = ("sdk-new", "plain-new", "datagram-new")[i % 3]
        out = Outcome(kind, PROMPTS[i % len(PROMPTS)])
        outcomes.append(out)
        coro = (sdk_stream(f, out.prompt, out) if kind == "sdk-new" else
                plain_stream(f, out.prompt, out, leave_after=10**9) if kind == "plain-new" else
                datagram_stream(f, out.prompt, out, h3_port))
        launch.append(asyncio.create_task(coro))
    code = await asyncio.to_thread(replica.wait_exit, 120)
    assert code == 0, replica.log()[-3000:]
    log = replica.log().rsplit("---- start", 1)[-1]
    assert "drain done" in log, log[-2000:]
    handed = log.count("ended by drain")
    drained = int(re.search(r"draining \(SIGTERM\): .* (\d+) stream\(s\)", log).group(1))
    refused = int(re.search(r"(\d+) new request\(s\) refused", log).group(1))
    print(f"replica {replica.name}: {drained} streams in flight when its drain began, {handed} handed over, "
          f"{refused} new requests refused by it (and served by the other)")
    replica.start()
    await asyncio.to_thread(replica.wait_ready, 60)
    # nginx's UDP side counted the closed port as a failure (max_fails=1): it sends this replica new sessions
    # again once fail_timeout has passed (a rolling restart waits for the balancer too: Kubernetes waits for the
    # readiness probe).
    await asyncio.sleep(FAIL_TIMEOUT + 0.5)
    return drained, handed


async def rolling_restart(f: Fleet) -> None:
    answers = await expected(f)
    a, b = f.replicas
    probe = httpx.get(f.url + "/v1/models", timeout=30)
    assert probe.headers["alt-svc"] == f'h3=":{f.udp_port}"; ma=86400', "Alt-Svc names nginx's UDP port"
    h3_port = int(probe.headers["alt-svc"].split(":")[1].split('"')[0])
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []

    async def wave(sdk: int, datagram: int, plain: int) -> None:
        """Start streams and wait until each has events (none can be over: 10 s each)."""
        started: list[Outcome] = []
        for i in range(sdk + datagram + plain):
            prompt = PROMPTS[i % len(PROMPTS)]
            if i < sdk:
                out = Outcome("sdk", prompt)
                coro = sdk_stream(f, prompt, out)
            elif i < sdk + datagram:
                out = Outcome("datagram", prompt)
                coro = datagram_stream(f, prompt, out, h3_port)
            else:
                out = Outcome("plain", prompt)
                coro = plain_stream(f, prompt, out, leave_after=15)
            started.append(out)
            tasks.append(asyncio.create_task(coro))
        outcomes.extend(started)
        await wait_until(lambda: all(o.events >= 2 for o in started) or any(t.done() and t.exception()
                                                                             for t in tasks),
                         "every stream under way", timeout=90, interval=0.1)
        failed = [(o.kind, repr(t.exception())) for o, t in zip(outcomes, tasks, strict=True)
                  if t.done() and t.exception() is not None]
        assert all(o.events >= 2 for o in started) and not failed, failed
        assert not any(o.text for o in started), "the restart must land mid-stream"

    await wave(SDK, DATAGRAM, PLAIN)  # 100 in flight
    drained_a, handed_a = await restart(f, a, tasks, outcomes, new_streams=20, h3_port=h3_port)
    await wave(10, 10, 10)  # in flight when B is signalled
    drained_b, handed_b = await restart(f, b, tasks, outcomes, new_streams=20, h3_port=h3_port)
    await asyncio.wait_for(asyncio.gather(*tasks), 180)
    kinds: dict[str, int] = {}
    for out in outcomes:
        kinds[out.kind] = kinds.get(out.kind, 0) + 1
        assert out.status == 200, f"{out.kind} stream refused: {out.status}"
        assert out.text == answers[out.prompt], f"{out.kind}: text differs from the uncut answer"
    assert {o.delivery for o in outcomes if o.kind.startswith("datagram")} == {"datagram"}
    assert all(o.resumed for o in outcomes if o.kind == "plain")
    assert kinds.get("datagram-new", 0) >= 12, "new streams during each drain went over datagrams too"
    print(f"rolling restart: {len(outcomes)} streams {kinds}, all complete and identical; streams in flight when "
          f"the drain began: A {drained_a}, B {drained_b}; handed over at a deadline: A {handed_a}, B {handed_b}; "
          f"refused by the fleet: none (each stream's status is 200)")
    assert drained_a > 0 and drained_b > 0, "each restart landed mid-stream"
    assert handed_a == handed_b == 0, "the drain (60 s) outlasts every stream: nothing is cut"


def test_rolling_restart_loses_nothing(fleet: Fleet) -> None:
    asyncio.run(asyncio.wait_for(rolling_restart(fleet), 400))
