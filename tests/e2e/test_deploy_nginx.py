"""docs/DEPLOY.md, tested: two ``eloquent serve`` replicas sharing one redis-server behind one nginx -- HTTP on
TCP (``upstream`` with ``hash $remote_addr consistent``) and HTTP/3 through the ``stream {}`` module on UDP (the
same hash). A stream is produced on one replica; the client reads it through nginx, which sends it to the other
(its hash home); that replica is SIGKILLed mid-stream and the client finishes on the producer, through nginx,
with exactly the uncut text, each event once -- on the SSE path and on the HTTP/3 datagram path.

Why the producer is not the replica killed: a stream's engine request lives in the replica that produces it, so a
producer that dies ends its streams uncompleted everywhere (``tests/transports/test_faults.py``, docs/DEPLOY.md); what a
second replica and the shared store survive is the death of the replica a client *reads* through.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from eloquent_client import EloquentClient, PathMemory, Transport

from eloquent_plugins.core.protocol import STREAM_HEADER
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.http3.certs import CertificatePair, generate_dev_certificate
from tests.support.client_servers import CHAT, chat_body
from tests.support.servers import free_port, nginx_balancer, nginx_upstream, redis_server, wait_for_port

FAIL_TIMEOUT = 2
"""nginx's ``fail_timeout`` here (DEPLOY.md: 10 s): a replica restarted between the tests is tried again soon."""
TOKENS = 120
PROMPT = "a story about failover"


@dataclass
class Replica:
    """``eloquent serve`` on fixed ports (so that nginx's upstreams survive a restart), TLS from shared files."""

    name: str
    certs: CertificatePair
    store: str
    port: int = field(default_factory=free_port)
    udp_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def https(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
        env.update(ELOQUENT_RESUME_GRACE="30", ELOQUENT_KEEPALIVE="1", ELOQUENT_CACHE_DIR=tempfile.gettempdir())
        exe = str(Path(sys.executable).with_name("eloquent"))
        self.proc = subprocess.Popen(
            [exe, "serve", "--port", str(self.port), "--eloquent-port", str(self.udp_port), "--certfile",
             str(self.certs.certfile), "--keyfile", str(self.certs.keyfile), "--resume-store", self.store,
             "--tpot", "0.05", "--ttft", "0.05", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
        wait_for_port(self.port, timeout=60, proc=self.proc)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.https + path, verify=False, timeout=30)

    def completed(self) -> int:
        return int(self.get("/v1/engine/stats").json()["completed"])

    def resumes(self) -> float:
        text = self.get("/metrics").text
        return sum(float(m.group(1)) for m in re.finditer(
            r'^eloquent_sse_resumes_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', text, re.MULTILINE))


@dataclass
class Deployment:
    replicas: list[Replica]
    url: str
    udp_port: int
    certs: CertificatePair


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    with tempfile.TemporaryDirectory(prefix="eloquent-deploy-") as tmp, redis_server() as store:
        certs = generate_dev_certificate(Path(tmp))  # one certificate for both replicas
        replicas = [Replica("a", certs, store), Replica("b", certs, store)]
        options = f"max_fails=1 fail_timeout={FAIL_TIMEOUT}s"
        http = nginx_upstream("eloquent_http", [r.port for r in replicas], "hash $remote_addr consistent;", options)
        udp = nginx_upstream("eloquent_quic", [r.udp_port for r in replicas], "hash $remote_addr consistent;",
                             options)
        location = ("proxy_buffering off; proxy_read_timeout 1h; proxy_connect_timeout 2s; "
                    "proxy_next_upstream error timeout;")
        try:
            for replica in replicas:
                replica.start()
            with nginx_balancer(http, udp, target="https://eloquent_http", location=location,
                                udp_extra="proxy_timeout 60s;") as balancer:
                yield Deployment(replicas, balancer.url, balancer.udp_port, certs)
                print(balancer.error_log.read_text(errors="replace")[-3000:])
        finally:
            for replica in replicas:
                replica.stop()


def client(d: Deployment, transport: Transport) -> EloquentClient:
    """Through nginx; HTTP/3 checks the replicas' one certificate."""
    return EloquentClient(d.url, transport=transport, verify=str(d.certs.certfile), h3_port=d.udp_port,
                          path_memory=PathMemory(), stream_idle_timeout=0.5, timeout=20)


async def home_of(d: Deployment, transport: Transport) -> Replica:
    """The replica nginx's hash sends this client to over ``transport`` (whose engine ran its request)."""
    before = [r.completed() for r in d.replicas]
    async with client(d, transport) as c:
        r = await c.request("POST", CHAT, json=chat_body("which replica?", 3, stream=False))
        assert r.status == 200, r.content
    grown = [r for r, n in zip(d.replicas, before) if r.completed() > n]
    assert len(grown) == 1, "one request, one engine run"
    return grown[0]


async def start_elsewhere(producer: Replica) -> str:
    """Start the stream on ``producer`` directly and leave after its first events (a tab closed, another entry
    point); the stream keeps being produced for the resume grace. Returns its resume token."""
    async with httpx.AsyncClient(verify=False, timeout=30) as h, \
            h.stream("POST", producer.https + CHAT, json=chat_body(PROMPT, TOKENS)) as r:
        assert r.status_code == 200
        parser, seen = SSEParser(), 0
        async for chunk in r.aiter_bytes():
            seen += len(parser.feed(chunk))
            if seen >= 3:
                return r.headers[STREAM_HEADER]
    raise AssertionError("the stream ended before its third event")


async def failover(d: Deployment, transport: Transport) -> None:
    home = await home_of(d, transport)
    producer = next(r for r in d.replicas if r is not home)
    uncut = httpx.post(producer.https + CHAT, json=chat_body(PROMPT, TOKENS, stream=False), verify=False, timeout=60)
    expected = uncut.json()["choices"][0]["message"]["content"]
    token = await start_elsewhere(producer)
    resumes = {r.name: r.resumes() for r in d.replicas}
    indices: list[int] = []
    parts: list[str] = []
    killed_at = 0.0
    async with client(d, transport) as c:
        # From the first event: ``Last-Event-ID: <token>`` asks for the whole stream.
        async with c.stream("POST", CHAT, json=chat_body(PROMPT, TOKENS), headers={"last-event-id": token}) as s:
            async for event in s.events():
                indices.append(event.index)
                parts.append(event.text or "")
                if len(indices) == 15:
                    # nginx sent the client to its hash home, not to the producer: that is the replica to kill.
                    assert home.resumes() == resumes[home.name] + 1 and producer.resumes() == resumes[producer.name]
                    home.kill()
                    killed_at = time.monotonic()
            deliveries, cuts = s.deliveries, s.resumes
    took = time.monotonic() - killed_at
    print(f"{transport}: killed replica {home.name} after 15 events; deliveries {deliveries}, {cuts} resume(s), "
          f"{len(indices)} events, finished {took:.1f} s after the kill on replica {producer.name}")
    assert killed_at and cuts >= 1, "the kill did not cut the stream"
    assert indices == list(range(len(indices))), "each event once, in order"
    assert "".join(parts) == expected
    assert producer.resumes() >= resumes[producer.name] + 1, "the continuation was served by the producer"
    want = "datagram" if transport == "eloquent" else "sse"
    assert set(deliveries) == {want}, deliveries


@pytest.fixture
def revive(deployment: Deployment) -> Iterator[None]:
    """Whatever a test killed is started again (same ports), and nginx's ``fail_timeout`` has passed."""
    yield
    dead = [r for r in deployment.replicas if r.proc is not None and r.proc.poll() is not None]
    for replica in dead:
        replica.start()
    if dead:
        time.sleep(FAIL_TIMEOUT + 0.5)


async def test_sse_through_nginx_finishes_on_the_other_replica(deployment: Deployment, revive: None) -> None:
    await asyncio.wait_for(failover(deployment, "sse"), 40)


async def test_http3_datagrams_through_nginx_udp_finish_on_the_other_replica(deployment: Deployment,
                                                                             revive: None) -> None:
    await asyncio.wait_for(failover(deployment, "eloquent"), 40)
