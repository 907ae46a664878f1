"""``transport="auto"`` against ``eloquent serve``: HTTP/3 when UDP answers, SSE over TCP when it does not (no
listener, or a relay that drops everything), the UDP port learnt from ``Alt-Svc``, a failed UDP path remembered
(the second request does not probe again); one error model on every path; the sync client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eloquent_client import (
    ClientError,
    ConnectError,
    EloquentClient,
    HTTPStatusError,
    Http3ClientConnection,
    PathMemory,
    SyncEloquentClient,
    TLSVerificationError,
)

from eloquent_plugins.sim.netem import Outage
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from tests.support.client_servers import CHAT, Served, chat_body, eloquent_serve
from tests.support.servers import free_port
from tests.support.streams import wait_until

FIRST_TOKEN_WITHIN = 3.0
HANDSHAKE_GIVES_UP = 2.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("certs")


@pytest.fixture(scope="module")
def served(certs: Path) -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.005", "--ttft", "0.02", certs=str(certs)) as s:
        yield s


class ConnectCounter:
    """Counts HTTP/3 connection attempts (a probe of UDP is one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = Http3ClientConnection.connect.__func__  # type: ignore[attr-defined]

        async def counted(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.count += 1
            return await original(cls, *args, **kwargs)

        monkeypatch.setattr(Http3ClientConnection, "connect", classmethod(counted))


async def first_token_and_text(client: EloquentClient, prompt: str) -> tuple[float, str, str]:
    started = time.monotonic()
    first: float | None = None
    parts = []
    async with client.stream("POST", CHAT, json=chat_body(prompt)) as s:
        async for delta in s.text_deltas():
            first = first if first is not None else time.monotonic() - started
            parts.append(delta)
        delivery = s.delivery
    assert first is not None
    return first, "".join(parts), delivery


@pytest.mark.parametrize("blocked", ["no listener", "relay drops everything"])
async def test_auto_falls_back_to_sse_and_remembers(served: Served, blocked: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    relay: Relay | None = None
    if blocked == "relay drops everything":  # in front of the real UDP port, dropping every datagram both ways
        relay = await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), outages=(Outage(0.0, 1e6),)))
    try:
        await _fallback_and_memory(served, relay, monkeypatch)
    finally:
        if relay is not None:
            await relay.close()


async def _fallback_and_memory(served: Served, relay: Relay | None, monkeypatch: pytest.MonkeyPatch) -> None:
    udp_port = relay.listen_addr[1] if relay is not None else free_port()
    counter = ConnectCounter(monkeypatch)
    memory = PathMemory()
    expected = served.text("Tell me about blocked ports.")
    # timeout: how long the handshake, racing TCP in the background, may go unanswered before the path counts as
    # blocked (short here, so the test need not wait 30 s).
    async with EloquentClient(served.http, verify=False, h3_port=udp_port, path_memory=memory,
                              timeout=HANDSHAKE_GIVES_UP) as client:
        assert client.transport == "auto"  # the default
        first, text, delivery = await first_token_and_text(client, "Tell me about blocked ports.")
        assert (text, delivery) == (expected, "sse") and first < FIRST_TOKEN_WITHIN
        await wait_until(lambda: memory.is_broken("127.0.0.1", udp_port), "the unanswered path marked blocked",
                         timeout=HANDSHAKE_GIVES_UP + 30)
        handshakes = counter.count
        assert 1 <= handshakes <= 3  # one handshake, with fresh ones beside it while unanswered (HANDSHAKES)
        probes = relay.stats.upstream.received if relay is not None else 0
        first, text, delivery = await first_token_and_text(client, "Tell me about blocked ports.")
        assert (text, delivery) == (expected, "sse") and first < 1.0
        assert counter.count == handshakes  # the blocked path was remembered: no second handshake
        if relay is not None:
            assert relay.stats.upstream.received == probes and probes > 0
    # Another client in the same process shares the memory (as a browser's tabs do).
    async with EloquentClient(served.http, verify=False, h3_port=udp_port, path_memory=memory,
                              timeout=HANDSHAKE_GIVES_UP) as client:
        assert (await first_token_and_text(client, "Tell me about blocked ports."))[2] == "sse"
        assert counter.count == handshakes


async def test_auto_learns_the_udp_port_from_alt_svc(served: Served, certs: Path) -> None:
    # Another port than the URL's is followed only when the caller allows it and the certificate is verified
    # (issue 28): with verify=False, or without alt_svc_ports, the advertised port is not used.
    for options in ({"verify": False, "alt_svc_ports": (served.udp_port,)}, {"verify": str(certs / "dev-cert.pem")}):
        async with EloquentClient(served.http, path_memory=PathMemory(), h3_probe_timeout=0.5,
                                  **options) as refusing:  # type: ignore[arg-type]
            assert (await first_token_and_text(refusing, "Tell me about discovery."))[2] == "sse"
            assert refusing.h3_port == served.port
            assert (await first_token_and_text(refusing, "Tell me about discovery."))[2] == "sse"
    memory = PathMemory()
    async with EloquentClient(served.http, verify=str(certs / "dev-cert.pem"), path_memory=memory,
                              h3_probe_timeout=0.5, alt_svc_ports=(served.udp_port,)) as client:
        # TCP and UDP ports differ here: the first request probes the TCP port's number, finds no HTTP/3 there,
        # takes TCP, and reads where HTTP/3 really is from the response's Alt-Svc.
        _, _, delivery = await first_token_and_text(client, "Tell me about discovery.")
        assert delivery == "sse" and client.h3_port == served.udp_port
        _, text, delivery = await first_token_and_text(client, "Tell me about discovery.")
        assert delivery == "eloquent" and text == served.text("Tell me about discovery.")
        models = await client.request("GET", "/v1/models")
        assert models.status == 200 and models.delivery == "h3-stream"


@pytest.mark.parametrize("transport", ["auto", "eloquent", "h3-stream", "sse"])
async def test_one_error_model_on_every_path(served: Served, transport: str) -> None:
    options = {"verify": False, "h3_port": served.udp_port, "path_memory": PathMemory(), "transport": transport}
    async with EloquentClient(served.http, **options) as client:  # type: ignore[arg-type]
        with pytest.raises(HTTPStatusError) as caught:
            async with client.stream("POST", CHAT, json={**chat_body("x"), "model": "nope"}):
                pass
        assert caught.value.status == 404 and caught.value.body["error"]["code"] == "model_not_found"
        assert caught.value.headers["content-type"] == "application/json"
        async with client.stream("POST", CHAT, json=chat_body("status")) as s:
            assert s.status == 200 and s.headers["x-eloquent-stream"]  # the server's own head, before reading
            assert await s.text() == served.text("status")
    # Nothing listens: ConnectError on every path (auto: neither UDP nor TCP answers).
    dead = free_port()
    dead_options = {"transport": transport, "verify": False, "timeout": 0.5, "h3_probe_timeout": 0.3,
                    "path_memory": PathMemory()}
    async with EloquentClient(f"http://127.0.0.1:{dead}", **dead_options) as client:  # type: ignore[arg-type]
        with pytest.raises(ConnectError):
            async with client.stream("POST", CHAT, json=chat_body("x")):
                pass


@pytest.mark.parametrize("transport", ["auto", "eloquent"])
async def test_tls_verification_failure_says_why_and_how_to_fix(served: Served, transport: str) -> None:
    async with EloquentClient(served.http, transport=transport, h3_port=served.udp_port,  # type: ignore[arg-type]
                              path_memory=PathMemory(), h3_probe_timeout=5.0) as client:
        with pytest.raises(TLSVerificationError) as caught:
            async with client.stream("POST", CHAT, json=chat_body("x")):
                pass
    error = caught.value
    assert isinstance(error, ConnectError) and isinstance(error, ClientError)
    assert "self-signed" in error.reason or "certificate" in error.reason
    assert "verify=False" in str(error) and "dev-cert.pem" in str(error)


def test_sync_client_streams_and_raises_the_same_errors(served: Served) -> None:
    with SyncEloquentClient(served.http, verify=False, h3_port=served.udp_port, path_memory=PathMemory(),
                            h3_probe_timeout=10.0) as client:
        with client.stream("POST", CHAT, json=chat_body("sync")) as s:
            assert s.status == 200 and s.delivery == "eloquent"
            assert "".join(s.text_deltas()) == served.text("sync")
        with pytest.raises(HTTPStatusError):
            with client.stream("POST", CHAT, json={**chat_body("x"), "model": "nope"}):
                pass
        assert client.request("GET", "/v1/models").json()["data"][0]["id"] == "eloquent-builtin"


def test_failed_connects_on_every_path_leave_nothing_running(served: Served, tmp_path: Path) -> None:
    """Under -W error and asyncio debug: failing connects, a TLS failure, a refused resume and a stream cut by
    a dead path leave no timer firing into a closed transport, no unretrieved exception, no pending task."""
    import subprocess
    import sys

    script = tmp_path / "leaks.py"
    script.write_text(LEAK_SCRIPT)
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(script), served.http,
                           str(served.udp_port), str(free_port())], capture_output=True, text=True, timeout=120,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for bad in ("Exception in callback", "never retrieved", "Task was destroyed", "was never awaited",
                "ResourceWarning", "Unclosed"):
        assert bad not in output, output
    assert "ok" in done.stdout


LEAK_SCRIPT = '''
import asyncio, gc, sys
from eloquent_client import ClientError, EloquentClient, PathMemory, ResumeRefused
from eloquent_plugins.sim.netem import Outage
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay

HTTP, UDP, DEAD = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BODY = {"model": "eloquent-builtin", "messages": [{"role": "user", "content": "leaks"}], "stream": True,
        "max_tokens": 200}


async def fail(**options):
    try:
        async with EloquentClient(options.pop("url", HTTP), path_memory=PathMemory(), **options) as client:
            async with client.stream("POST", "/v1/chat/completions", json=BODY) as s:
                await s.text()
    except ClientError as exc:
        return exc
    raise AssertionError(f"no error with {options}")


async def main():
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    seen = []
    loop.set_exception_handler(lambda _, context: seen.append(context.get("message")))
    dead = f"http://127.0.0.1:{DEAD}"
    await fail(url=dead, transport="auto", verify=False, h3_probe_timeout=0.2, timeout=0.5)
    await fail(url=dead, transport="eloquent", verify=False, timeout=0.3)
    await fail(url=dead, transport="h3-stream", verify=False, timeout=0.3)
    await fail(url=dead, transport="sse", timeout=0.3)
    await fail(transport="eloquent", h3_port=UDP, timeout=3)  # TLS verification
    await fail(transport="auto", h3_port=UDP, h3_probe_timeout=3)
    # a resume the server refuses: an unknown token
    async with EloquentClient(HTTP, transport="sse", path_memory=PathMemory()) as client:
        try:
            async with client.stream("POST", "/v1/chat/completions", json=BODY,
                                     headers={"last-event-id": "A" * 22 + ":3"}) as s:
                await s.text()
        except ClientError:
            pass
    # a stream cut by a path that dies for good, with resume off: StreamBroken after stream_idle_timeout
    relay = await start_relay(RelayConfig(target=("127.0.0.1", UDP), outages=(Outage(0.3, 1e6),)))
    await fail(transport="eloquent", h3_port=relay.listen_addr[1], verify=False, stream_idle_timeout=0.4,
               resume=False, timeout=5)
    await relay.close()
    await asyncio.sleep(2.5)  # aioquic's probe and close timers would have fired by now
    gc.collect()
    await asyncio.sleep(0.1)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not seen, seen
    assert not pending, pending
    print("ok")


asyncio.run(main())
'''
