"""The Triton gateway on every transport the project offers, against a real Triton (PyTriton, CPU).

What issue 7 promises Triton users, shown end to end:

* behind nginx with ``proxy_read_timeout 3s``, a model that is silent for 10 s before its first token
  kills Triton's bare ``generate_stream`` (nginx answers 504) but streams whole through the gateway in
  ``EloquentMiddleware`` (keep-alive every second);
* HTTP and gRPC upstreams give the same events, and the generic SSE client (``eloquent_client``'s ``sse``
  transport, the code OpenAI/vLLM streams are read with) reads them;
* Eloquent datagrams over HTTP/3 through a lossy, delayed UDP relay deliver exactly Triton's
  non-streamed output, for both upstream kinds;
* the ``eloquent serve`` console script fronts Triton through the ``triton`` upstream kind that the
  adapter registers as an entry point.

One Triton server for the module; if it does not start, every test fails with its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from eloquent_client import ClientEvent, EloquentClient
from eloquent_triton.gateway import create_triton_gateway

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser
from tests.support.servers import UvicornThread, free_port, nginx_routes, wait_for_port
from tests.support.triton_models import (
    UPSTREAM_KINDS,
    REPO_ROOT,
    TritonServerProcess,
    error_after_message,
    tokens_for,
)

pytestmark = pytest.mark.triton

KINDS = UPSTREAM_KINDS
# A hang guard, not a timing assertion: how long a test waits for something that must happen.
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServerProcess]:
    with TritonServerProcess() as server:  # fails every test here, with Triton's log, if it does not start
        yield server


def wrapped_gateway(upstream: str, config: StreamConfig) -> Any:
    """What a Triton user deploys: the gateway inside the middleware."""
    return EloquentMiddleware(create_triton_gateway(upstream), config)


def non_streamed_text(triton: TritonServerProcess, body: dict[str, Any]) -> str:
    """Triton's own non-streamed answer (``token_full`` via Triton's HTTP ``/generate``, no gateway)."""
    response = httpx.post(f"{triton.http_url}/v2/models/token_full/generate", json=body, timeout=HANG_GUARD_S)
    assert response.status_code == 200, response.text
    return str(response.json()["text_output"])


def triton_text(events: list[ClientEvent]) -> str:
    return "".join(e.json["text_output"] for e in events)


# --------------------------------------------------------------------------- 1. behind nginx

@dataclass
class Read:
    status: int
    raw: bytes
    messages: list[SSEMessage]


async def read_stream(url: str, body: dict[str, Any]) -> Read:
    async with httpx.AsyncClient(timeout=HANG_GUARD_S) as client, client.stream("POST", url, json=body) as response:
        raw = await response.aread()
    return Read(response.status_code, raw, SSEParser().feed(raw))


async def test_silent_model_survives_nginx_idle_timeout_only_through_the_gateway(
    triton: TritonServerProcess,
) -> None:
    # slow_first without a gate waits the whole wait_s before its first token (" waited").
    body = {"text_input": "past the proxy", "wait_s": 10.0, "max_tokens": 3}
    expected = [" waited", *tokens_for("past the proxy", 3)]
    config = StreamConfig(keepalive=1.0, stream_transport="sse")
    with (
        UvicornThread(wrapped_gateway(triton.http_url, config), lifespan="on") as over_http,
        UvicornThread(wrapped_gateway(triton.grpc_url, config), lifespan="on") as over_grpc,
        nginx_routes({"bare": triton.http_port, "http": over_http.port, "grpc": over_grpc.port},
                     "proxy_read_timeout 3s;") as proxy,
    ):
        route = "v2/models/slow_first/generate_stream"
        bare, via_http, via_grpc = await asyncio.gather(
            *(read_stream(f"{proxy.url}/{prefix}/{route}", body) for prefix in ("bare", "http", "grpc"))
        )
        error_log = proxy.error_log.read_text()

    # Bare Triton sends no headers before its first response: nginx gives up after 3 s of silence.
    assert bare.status == 504, (bare.status, bare.raw[:500])
    assert b"text_output" not in bare.raw and b"waited" not in bare.raw
    assert "upstream timed out" in error_log, error_log

    for kind, read in (("http", via_http), ("grpc", via_grpc)):
        assert read.status == 200, (kind, read.raw[:500])
        # Keep-alive comments went out while the model was silent, i.e. before its first event.
        lines = read.raw.splitlines()
        first_event = next(i for i, line in enumerate(lines) if line.startswith((b"id:", b"data:")))
        assert first_event >= 1 and all(line.startswith(b":") for line in lines[:first_event]), (kind, read.raw)
        assert [json.loads(m.data)["text_output"] for m in read.messages] == expected, kind
        assert all(m.id for m in read.messages) and len({m.id for m in read.messages}) == len(expected)


# --------------------------------------------------------------------------- 2. the generic SSE client

SSE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("token_stream", {"text_input": "the quick brown fox", "max_tokens": 9}),
    ("token_stream", {"id": "req-7", "text_input": "héllo wörld 🚀 \"quoted\" back\\slash", "max_tokens": 5}),
    ("error_after", {"text_input": "two tokens then boom", "fail_after": 2}),
]


async def sse_events(base_url: str, model: str, body: dict[str, Any]) -> list[ClientEvent]:
    """The events as ``EloquentClient(transport="sse")`` yields them (stream_sse + SSEParser)."""
    route = f"/v2/models/{model}/generate_stream"
    async with (
        EloquentClient(base_url, transport="sse", timeout=HANG_GUARD_S) as client,
        client.stream("POST", route, json=body) as s,
    ):
        events = [e async for e in s.events()]
        assert s.delivery == "sse"
    return events


async def test_http_and_grpc_give_identical_events_read_by_the_generic_sse_client(
    triton: TritonServerProcess,
) -> None:
    config = StreamConfig(keepalive=0.05, stream_transport="sse")
    got: dict[str, list[list[ClientEvent]]] = {}
    for kind in KINDS:
        with UvicornThread(wrapped_gateway(triton.url(kind), config), lifespan="on") as gateway:
            got[kind] = [await sse_events(gateway.url, model, body) for model, body in SSE_CASES]

    for (model, body), over_http, over_grpc in zip(SSE_CASES, got["http"], got["grpc"], strict=True):
        assert over_http, (model, body)
        assert [e.data for e in over_http] == [e.data for e in over_grpc], (model, body)
        for events in (over_http, over_grpc):
            # Middleware ids ("<stream token>:<index>"), one stream token per response.
            ids = [e.id or "" for e in events]
            assert [i.rpartition(":")[2] for i in ids] == [str(n) for n in range(len(events))], ids
            assert len({i.rpartition(":")[0] for i in ids}) == 1 and all(ids), ids
        # Same events as Triton's own generate_stream, field for field.
        direct = await read_stream(f"{triton.http_url}/v2/models/{model}/generate_stream", body)
        assert [json.loads(e.data) for e in over_http] == [json.loads(m.data) for m in direct.messages]

    quick, unicode_case, failing = got["http"]
    assert triton_text(quick) == await asyncio.to_thread(non_streamed_text, triton, SSE_CASES[0][1])
    assert triton_text(unicode_case) == "".join(tokens_for(SSE_CASES[1][1]["text_input"], 5))
    assert all(e.json["id"] == "req-7" for e in unicode_case)
    *tokens, last = failing
    assert [e.json["text_output"] for e in tokens] == tokens_for("two tokens then boom", 2)
    assert last.error is not None and error_after_message(2) in last.error


# --------------------------------------------------------------------------- 3. HTTP/3 through a lossy relay

LOSSY = PathConfig(delay=0.05, loss=0.1, burst=2.0)
LONG_BODY = {"text_input": "every token must arrive through the lossy relay intact", "max_tokens": 80,
             "token_delay_s": 0.01}


@contextlib.contextmanager
def http3_gateway(upstream: str, config: StreamConfig) -> Iterator[int]:
    """The wrapped gateway on the HTTP/3 front end, in a thread with its own loop; yields the UDP port.

    Like ``tests.support.tgi_server.run_http3_in_thread``, but it runs the gateway's lifespan itself: the
    HTTP/3 front end sends no ASGI lifespan events, so the gateway would never close its upstream
    connection, and Triton's shutdown then waits its full 30 s exit timeout for that connection.
    """
    from eloquent_plugins.transports.http3.server import start_http3_server

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        box["loop"], box["stop"] = asyncio.get_running_loop(), stop
        gateway = create_triton_gateway(upstream)
        try:
            async with gateway.router.lifespan_context(gateway):
                server = await start_http3_server(
                    EloquentMiddleware(gateway, config), host="127.0.0.1", port=0, config=config
                )
                box["port"] = server.port
                ready.set()
                try:
                    await stop.wait()
                finally:
                    await server.close()
        except BaseException as exc:
            box.setdefault("error", exc)
            ready.set()
            raise

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="triton-h3", daemon=True)
    thread.start()
    if not ready.wait(HANG_GUARD_S) or "port" not in box:
        raise RuntimeError(f"the HTTP/3 front end did not start: {box.get('error')!r}")
    try:
        yield int(box["port"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(HANG_GUARD_S)


@pytest.fixture(scope="module")
def h3_ports(triton: TritonServerProcess) -> Iterator[dict[str, int]]:
    """The wrapped gateway on the HTTP/3 front end, one per upstream kind."""
    config = StreamConfig(keepalive=0.5)
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(http3_gateway(triton.url(kind), config)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
async def test_eloquent_datagrams_through_a_lossy_relay_deliver_the_non_streamed_text(
    triton: TritonServerProcess, h3_ports: dict[str, int], kind: str
) -> None:
    expected = await asyncio.to_thread(non_streamed_text, triton, LONG_BODY)
    assert expected == "".join(tokens_for(LONG_BODY["text_input"], LONG_BODY["max_tokens"]))
    relay = await start_relay(
        RelayConfig(target=("127.0.0.1", h3_ports[kind]), upstream=LOSSY, downstream=LOSSY, seed=7)
    )
    try:
        port = relay.listen_addr[1]
        async with (
            # Nothing on TCP at the relay's port: HTTP/3 only, so the caller says so (``auto`` fails fast when TCP
            # is refused, docs/CLIENT.md).
            EloquentClient(f"https://127.0.0.1:{port}", verify=False, timeout=HANG_GUARD_S,
                           transport="eloquent") as client,
            client.stream("POST", "/v2/models/token_stream/generate_stream", json=LONG_BODY) as s,
        ):
            events = [e async for e in s.events()]
            assert s.delivery == "eloquent"
        stats = relay.stats
    finally:
        await relay.close()
    assert triton_text(events) == expected
    assert len(events) == LONG_BODY["max_tokens"]
    # The loss was real: datagrams were dropped on the way, and the text is whole anyway.
    assert stats.downstream.dropped > 0 and stats.upstream.dropped > 0, stats


# --------------------------------------------------------------------------- 4. the eloquent CLI


def test_triton_kind_comes_from_the_adapters_entry_point() -> None:
    points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="eloquent_plugins")}
    assert points.get("triton") == "eloquent_triton.plugin"
    # The core never imports the adapter: the CLI can only know "triton" through the entry point.
    core = REPO_ROOT / "eloquent_plugins"
    offenders = [str(p) for p in core.rglob("*.py") if "eloquent_triton" in p.read_text()]
    assert offenders == []


@contextlib.contextmanager
def eloquent_serve(*args: str) -> Iterator[str]:
    """``.venv/bin/eloquent serve ARGS`` (SSE only) on a free port; yields its base URL."""
    exe = Path(sys.executable).with_name("eloquent")
    assert exe.exists(), f"{exe} missing: install the project into the venv (pip install -e .)"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [str(exe), "serve", "--port", str(port), "--stream-transport", "sse", "--log-level", "warning", *args],
            cwd=tempfile.gettempdir(),  # not the repo: the adapter must come from the installed entry point
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            try:
                wait_for_port(port, timeout=HANG_GUARD_S, proc=proc)
            except (RuntimeError, TimeoutError) as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}\neloquent serve said:\n{log.read().decode(errors='replace')}") from None
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_cli_refuses_an_unregistered_kind_and_lists_triton() -> None:
    exe = Path(sys.executable).with_name("eloquent")
    result = subprocess.run(
        [str(exe), "serve", "--upstream", "nosuchkind=grpc://127.0.0.1:1", "--port", str(free_port()),
         "--stream-transport", "sse"],
        check=False, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "unknown upstream kind 'nosuchkind'" in result.stderr and "triton" in result.stderr, result.stderr


async def test_eloquent_serve_fronts_triton_grpc_with_keepalive_and_ids(
    triton: TritonServerProcess, tmp_path: Path
) -> None:
    # Ordering, not timers: the gate opens only after a keep-alive arrived while Triton was silent,
    # so " gate-open" as the first token proves the keep-alive came before any model output.
    gate = tmp_path / "gate"
    body = {"text_input": "served by the cli", "wait_s": HANG_GUARD_S, "gate": str(gate), "max_tokens": 4}
    with eloquent_serve("--upstream", f"triton={triton.grpc_url}", "--keepalive", "0.2") as base:
        received = b""
        async with (
            httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client,
            client.stream("POST", "/v2/models/slow_first/generate_stream", json=body) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            stream_token = response.headers["x-eloquent-stream"]
            chunks = response.aiter_raw()
            while b"\n" not in received:  # the first complete line
                received += await chunks.__anext__()
            assert received.startswith(b":") and b"data:" not in received, received
            gate.touch()
            async for chunk in chunks:
                received += chunk
    messages = SSEParser().feed(received)
    assert [json.loads(m.data)["text_output"] for m in messages] == [" gate-open", *tokens_for("served by the cli", 4)]
    assert [m.id for m in messages] == [f"{stream_token}:{i}" for i in range(len(messages))]

